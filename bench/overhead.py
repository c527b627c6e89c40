"""Supervisor overhead: supervised ``python -m train run`` against bare Ultralytics on the same work.

    python bench/overhead.py [--pairs 5] [--epochs 4] [--imgsz 96]

Bare = ``YOLO("yolov8n.yaml").train(...)`` in a plain process with the same
arguments and the same offline environment, no supervisor, no trainbox
trainer. Supervised = ``python -m train run --profile safe`` (supervisor,
heartbeats, atomic checkpoints, profile trainer). Runs are interleaved
(bare, supervised, bare, ...) and each is timed from process start to exit.
The ratio is bare wall time / supervised wall time (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, summary, write_results

BARE = """
import sys
from pathlib import Path
from train.yolo import offline
run = Path(sys.argv[1])
offline.prepare_environment(run / "ultralytics")
from ultralytics import YOLO
offline.disable_settings_sync()
YOLO("yolov8n.yaml").train(data=sys.argv[2], epochs=int(sys.argv[3]), imgsz=int(sys.argv[4]), batch=8,
    workers=0, amp=False, project=str(run), name="train", exist_ok=True, plots=False)
"""


def timed(argv: list, env: dict) -> float:
    started = time.monotonic()
    subprocess.run(argv, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=96)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    bare, supervised = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "demo"
        subprocess.run([sys.executable, "-m", "train", "demo-data", str(data)], env=env, check=True, stdout=subprocess.DEVNULL)
        data_yaml = str(data / "data.yaml")
        for pair in range(args.pairs):
            run = Path(tmp) / f"bare{pair}"
            bare.append(timed([sys.executable, "-c", BARE, str(run), data_yaml, str(args.epochs), str(args.imgsz)], env))
            run = Path(tmp) / f"sup{pair}"
            supervised.append(
                timed(
                    [
                        sys.executable,
                        "-m",
                        "train",
                        "run",
                        "--profile",
                        "safe",
                        "--run-dir",
                        str(run),
                        "--quiet",
                        f"data={data_yaml}",
                        f"epochs={args.epochs}",
                        f"imgsz={args.imgsz}",
                        "batch=8",
                        "plots=False",
                    ],
                    env,
                )
            )
            print(f"pair {pair + 1}/{args.pairs}: bare {bare[-1]:.1f} s, supervised {supervised[-1]:.1f} s", flush=True)
    ratios = [b / s for b, s in zip(bare, supervised)]
    result = {
        "epochs": args.epochs,
        "imgsz": args.imgsz,
        "bare_s": summary(bare),
        "supervised_s": summary(supervised),
        "ratio": summary(ratios),
    }
    md = (
        f"# Supervisor overhead ({args.pairs} interleaved pairs, yolov8n, {args.epochs} epochs at {args.imgsz} px, CPU)\n\n"
        f"Command: `python bench/overhead.py --pairs {args.pairs} --epochs {args.epochs} --imgsz {args.imgsz}`\n\n"
        "| | median s | min–max s |\n| --- | --- | --- |\n"
        f"| bare Ultralytics | {result['bare_s']['median']:.1f} | {result['bare_s']['min']:.1f}–{result['bare_s']['max']:.1f} |\n"
        f"| supervised (`train run --profile safe`) | {result['supervised_s']['median']:.1f} | "
        f"{result['supervised_s']['min']:.1f}–{result['supervised_s']['max']:.1f} |\n\n"
        f"Throughput ratio supervised/bare (bare time / supervised time): median {result['ratio']['median']:.3f} "
        f"[{result['ratio']['min']:.3f}–{result['ratio']['max']:.3f}] (goal ≥ 0.99).\n"
    )
    print(md)
    print(write_results("overhead", result, md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
