"""A supervised child that trains like Ultralytics, in seconds and without torch (tests of the run's views).

``python -m tests.epochs --epochs 4 --batches 6 --interval 0.2`` beats as
``trainbox.yolo.beats`` does (``setup`` with the startup budget, ``train``
per batch with ``epoch``/``batch``/``step``/``loss``/``imgs_per_s``, ``val`` and
``save`` with their own budgets), writes ``args.yaml`` and, per epoch, a row of
``results.csv`` with Ultralytics 8.4's columns and ``last.pt`` (atomically; it
holds the next epoch), and resumes from ``last.pt`` on a restart, like a
resumed Ultralytics run. Fault sites: ``train_batch`` (epoch, batch, step) and
``val_end`` (epoch), the runner's names, so ``TRAIN_FAULT`` hangs it the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import List, Optional, Sequence

from trainbox import faults, heartbeat
from trainbox.atomic import write_text_atomic
from trainbox.rundir.layout import RunDir

#: The header of results.csv as Ultralytics 8.4.190 writes it for detection (copied from a real run).
RESULTS_COLUMNS = (
    "epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
    "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2"
)
BATCH_SIZE = 8


def results_row(epoch: int, elapsed: float) -> str:
    """Falling losses, rising mAP: plausible numbers in Ultralytics' format."""
    decay = 1.0 / (1 + 0.5 * epoch)
    values: List[float] = [epoch, elapsed, 2.5 * decay, 3.0 * decay, 1.6 * decay, 0.1 * epoch, 0.08 * epoch]
    values += [0.05 * epoch, 0.02 * epoch, 2.2 * decay, 2.8 * decay, 1.5 * decay, 0.001, 0.001, 0.001]
    return ",".join(f"{v:g}" for v in values)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.epochs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds per batch")
    args = parser.parse_args(argv)
    run = RunDir(Path(os.environ["TRAIN_RUN_DIR"]))
    startup = float(os.environ.get("TRAIN_STARTUP_TIMEOUT", "60"))
    heartbeat.beat("setup", timeout=startup, force=True)
    run.last_checkpoint.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run.train_args, f"epochs: {args.epochs}\nbatch: {BATCH_SIZE}\n")
    start = json.loads(run.last_checkpoint.read_text())["next_epoch"] if run.last_checkpoint.exists() else 1
    if start == 1:
        write_text_atomic(run.results, RESULTS_COLUMNS + "\n")
    began = time.monotonic()
    step = (start - 1) * args.batches
    for epoch in range(start, args.epochs + 1):
        first = epoch == start
        heartbeat.beat(
            "setup" if first else "train", epoch=epoch, batch=0, step=step, timeout=startup if first else None, force=True
        )
        if first:
            time.sleep(1.0)  # building the model, starting the loader: long enough for the supervisor to see where it resumes
        epoch_began = time.monotonic()
        for batch in range(1, args.batches + 1):
            time.sleep(args.interval)
            step += 1
            rate = round(batch * BATCH_SIZE / (time.monotonic() - epoch_began), 2)
            heartbeat.beat("train", epoch=epoch, batch=batch, step=step, loss=round(5.0 / (step + 1), 4), imgs_per_s=rate)
            faults.point("train_batch", epoch=epoch, batch=batch, step=step)
        heartbeat.beat("val", timeout=60, force=True)
        time.sleep(args.interval)
        faults.point("val_end", epoch=epoch)
        heartbeat.beat("save", timeout=60, force=True)
        with run.results.open("a") as handle:
            handle.write(results_row(epoch, time.monotonic() - began) + "\n")
        write_text_atomic(run.last_checkpoint, json.dumps({"next_epoch": epoch + 1}))
        heartbeat.beat("train", force=True, saved_epoch=epoch)
        print(f"epoch {epoch} done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
