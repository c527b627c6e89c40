"""Supervisor overhead: supervised ``python -m trainbox run`` against bare Ultralytics on the same work.

    python bench/overhead.py [--pairs 5] [--epochs 4] [--imgsz 96]

Bare = ``YOLO("yolov8n.yaml").train(...)`` in a plain process with the same
arguments and the same offline environment, no supervisor, no trainbox
trainer. Supervised = ``python -m trainbox run --profile safe`` (supervisor,
heartbeats, atomic checkpoints, profile trainer). Runs are interleaved
(bare, supervised, bare, ...). Throughput is the steady state, from
Ultralytics' own ``results.csv`` (cumulative seconds at each epoch's end,
validation and checkpoint saves included): seconds per epoch after the first.
The ratio is bare seconds per epoch / supervised seconds per epoch (1.0 = no
overhead). Whole-process wall times (startup included) are reported too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

from common import REPO, bare_command, cli_env, epoch_seconds, span, summary, write_results

#: The dataset the published figures were measured on (32 + 8 images at 96 px, demo-data's defaults then; the demo's
#: own grew to 64 + 16 at 64 px so that it learns: docs/getting-started.md, The demo).
MEASURED_DATA = ("--train", "32", "--val", "8", "--imgsz", "96")


def timed(argv: list, env: dict, run: Path) -> Tuple[float, float]:
    """(wall seconds, steady seconds per epoch) of one run."""
    started = time.monotonic()
    subprocess.run(argv, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started, epoch_seconds(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=96)
    args = parser.parse_args()
    env = cli_env({})
    bare, supervised, bare_wall, supervised_wall = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "demo"
        write = [sys.executable, "-m", "trainbox", "demo-data", str(data), *MEASURED_DATA]
        subprocess.run(write, env=env, check=True, stdout=subprocess.DEVNULL)
        data_yaml = str(data / "data.yaml")
        for pair in range(args.pairs):
            run = Path(tmp) / f"bare{pair}"
            bare_args = [f"data={data_yaml}", f"epochs={args.epochs}", f"imgsz={args.imgsz}", "batch=8", "workers=0", "amp=False",
                         "plots=False"]  # fmt: skip
            wall, epoch_s = timed(bare_command(run, bare_args), env, run)
            bare.append(epoch_s)
            bare_wall.append(wall)
            run = Path(tmp) / f"sup{pair}"
            supervised_args = ["run", "--profile", "safe", "--run-dir", str(run), "--quiet", f"data={data_yaml}",
                               f"epochs={args.epochs}", f"imgsz={args.imgsz}", "batch=8", "plots=False"]  # fmt: skip
            wall, epoch_s = timed([sys.executable, "-m", "trainbox", *supervised_args], env, run)
            supervised.append(epoch_s)
            supervised_wall.append(wall)
            print(f"pair {pair + 1}/{args.pairs}: s/epoch bare {bare[-1]:.2f}, supervised {supervised[-1]:.2f}", flush=True)
    ratios = [b / s for b, s in zip(bare, supervised)]
    result = {
        "epochs": args.epochs,
        "imgsz": args.imgsz,
        "bare_epoch_s": summary(bare),
        "supervised_epoch_s": summary(supervised),
        "bare_wall_s": summary(bare_wall),
        "supervised_wall_s": summary(supervised_wall),
        "ratio": summary(ratios),
    }
    md = (
        f"# Supervisor overhead ({args.pairs} interleaved pairs, yolov8n, {args.epochs} epochs at {args.imgsz} px, CPU)\n\n"
        f"Command: `python bench/overhead.py --pairs {args.pairs} --epochs {args.epochs} --imgsz {args.imgsz}`\n\n"
        "| | s per epoch (steady) | whole run s |\n| --- | --- | --- |\n"
        f"| bare Ultralytics | {span(result['bare_epoch_s'])} | {span(result['bare_wall_s'], digits=1)} |\n"
        f"| supervised (`train run --profile safe`) | {span(result['supervised_epoch_s'])} | "
        f"{span(result['supervised_wall_s'], digits=1)} |\n\n"
        f"Throughput ratio supervised/bare: {span(result['ratio'], digits=3)} (goal ≥ 0.99).\n"
    )
    print(md)
    print(write_results("overhead", result, md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
