"""Throughput and time to the first batch of the safe, balanced and fast profiles.

    python bench/profiles.py [--rounds 3] [--epochs 3] [--imgsz 96] [--image]

Each run is ``python -m trainbox run --profile NAME`` on the demo data (64 train
images, batch 8) on this machine's CPU, interleaved by round. Time to first
batch = first beat carrying a step minus the attempt's start (process start,
imports, dataset scan, model build, worker start). Throughput = the last
epoch's images per second from the final heartbeat. ``--image`` runs the
same through ``invoke train --flavor cpu`` in the CPU image (built first with
``invoke build --flavor cpu``; torch 1.13.1, Python 3.9).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from common import REPO, RunDir, events, span, summary, train_cli, write_results

PROFILES = ("safe", "balanced", "fast")


def in_image(profile: str, run_dir: Path, data: Path, overrides: List[str]) -> int:
    """``invoke train`` in the CPU image; its run directory lands at ``run_dir``."""
    sets = [arg for pair in overrides for arg in ("--set", pair)]
    env = dict(os.environ, TRAINBOX_RUNS_HOST=str(run_dir.parent))
    command = [sys.executable, "-m", "invoke", "train", "--profile", profile, "--flavor", "cpu", "--no-build",
               "--name", run_dir.name, "--data", str(data), *sets]  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--imgsz", type=int, default=96)
    parser.add_argument("--image", action="store_true", help="train in the CPU image through invoke train")
    args = parser.parse_args()
    first: Dict[str, List[float]] = {p: [] for p in PROFILES}
    speed: Dict[str, List[float]] = {p: [] for p in PROFILES}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        train_cli(["demo-data", str(data), "--train", "64", "--val", "8", "--imgsz", str(args.imgsz)], {})
        for round_ in range(args.rounds):
            for profile in PROFILES:
                run_dir = Path(tmp) / f"{profile}-{round_}"
                code = train_cli(
                    [
                        "run",
                        "--profile",
                        profile,
                        "--run-dir",
                        str(run_dir),
                        "--quiet",
                        f"data={data / 'data.yaml'}",
                        f"epochs={args.epochs}",
                        f"imgsz={args.imgsz}",
                        "batch=8",
                        "plots=False",
                    ],
                    {},
                )
                if code != 0:
                    raise SystemExit(f"{profile}: exit {code}")
                history = events(run_dir)
                start = next(e for e in history if e["event"] == "start")
                end = next(e for e in history if e["event"] == "exit")
                first[profile].append(end["first_step_ts"] - start["ts"])
                beat = json.loads(RunDir(run_dir).state.read_text())["heartbeat"]
                speed[profile].append(beat["imgs_per_s"])
                print(f"round {round_ + 1} {profile}: first batch {first[profile][-1]:.1f} s, {speed[profile][-1]} img/s")
    table = {p: {"first_batch_s": summary(first[p]), "imgs_per_s": summary(speed[p])} for p in PROFILES}
    lines = [
        f"# Profiles on this machine's CPU{' in the CPU image' if args.image else ''} "
        f"({args.rounds} interleaved rounds, yolov8n, {args.imgsz} px, batch 8)",
        "",
        f"Command: `python bench/profiles.py --rounds {args.rounds} --epochs {args.epochs} --imgsz {args.imgsz}"
        f"{' --image' if args.image else ''}`",
        "",
        "| profile | time to first batch s | img/s (last epoch) |",
        "| --- | --- | --- |",
    ]
    for p, row in table.items():
        lines.append(f"| {p} | {span(row['first_batch_s'], digits=1)} | {span(row['imgs_per_s'], digits=1)} |")
    md = "\n".join(lines) + "\n"
    print(md)
    name = "profiles-image" if args.image else "profiles"
    print(write_results(name, {"profiles": table, "epochs": args.epochs, "imgsz": args.imgsz, "image": args.image}, md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
