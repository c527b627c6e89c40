"""Work lost to one stall, with epoch-end checkpoints only and with mid-epoch checkpoints.

    python bench/lost_work.py [--batches 20] [--every 4]

Trains yolov8n.yaml on demo data (``--batches`` batches of 8 per epoch, 2
epochs, CPU) and kills the training process at 20 %, 50 % and 80 % of the
second epoch (``sigkill@train_batch``: the supervisor restarts at once, so
what is measured is the resume, not the detection). Lost work = batches the
killed attempt trained that the next attempt had to train again (from
``TRAIN_SAMPLE_LOG``), and its time at the measured seconds per batch. Also
reports what each mid-epoch checkpoint cost.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from common import REPO, RESULTS, RunDir, summary, train_cli, write_results

ARGS = ["epochs=2", "imgsz=64", "batch=8", "plots=False", "val=False"]


def profiles(directory: Path, every: int) -> Path:
    base = (REPO / "env" / "profiles" / "safe.yaml").read_text()
    (directory / "epoch-only.yaml").write_text(base + "midepoch_checkpoint_s: 0\nmidepoch_checkpoint_batches: 0\n")
    (directory / "mid-epoch.yaml").write_text(base + f"midepoch_checkpoint_batches: {every}\n")
    shutil.copy(REPO / "env" / "profiles" / "safe-native.yaml", directory)
    return directory


def lost(run_dir: Path) -> Dict[str, Any]:
    trained: Dict[int, set] = {0: set(), 1: set()}
    for line in (run_dir / "samples.log").read_text().splitlines():
        kind, epoch, batch, attempt, *_ = line.split()
        if kind == "train":
            trained[int(attempt)].add((int(epoch), int(batch)))
    again = trained[0] & trained[1]
    log = "\n".join(p.read_text(errors="replace") for p in sorted(RunDir(run_dir).attempt_log.directory.glob("*.log")))
    cost = re.findall(r"(\d+) mid-epoch checkpoint\(s\) written, ([0-9.]+) s each", log)
    return {"batches_lost": len(again), "checkpoint_s": [float(c[1]) for c in cost]}


def plot(rows: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted({r["fraction"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for offset, mode in ((-0.15, "epoch-only"), (0.15, "mid-epoch")):
        lost_by = {r["fraction"]: r["batches_lost"] for r in rows if r["mode"] == mode}
        ax.bar([i + offset for i in range(len(fractions))], [lost_by[f] for f in fractions], width=0.3, label=mode)
    ax.set_xticks(range(len(fractions)), [f"{f:.0%}" for f in fractions])
    ax.set_xlabel("where in the epoch the training process was killed")
    ax.set_ylabel("batches trained again")
    ax.legend()
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--every", type=int, default=4)
    args = parser.parse_args()
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "data"
        train_cli(["demo-data", str(data), "--train", str(args.batches * 8), "--val", "8", "--imgsz", "64"], {})
        prof = profiles(root, args.every)
        for fraction in (0.2, 0.5, 0.8):
            hang_batch = max(1, round(fraction * args.batches))
            for mode in ("epoch-only", "mid-epoch"):  # interleaved
                run_dir = root / f"{mode}-{fraction}"
                code = train_cli(
                    [
                        "run",
                        "--profile",
                        mode,
                        "--profiles-dir",
                        str(prof),
                        "--run-dir",
                        str(run_dir),
                        "--quiet",
                        "--backoff",
                        "0.2",
                        f"data={data / 'data.yaml'}",
                        *ARGS,
                    ],
                    {
                        "TRAIN_FAULT": f"sigkill@train_batch,attempt=0,epoch=2,batch={hang_batch}",
                        "TRAIN_SAMPLE_LOG": str(run_dir / "samples.log"),
                    },
                )
                if code != 0:
                    raise SystemExit(f"{mode} at {fraction}: exit {code}")
                rows.append({"mode": mode, "fraction": fraction, "hang_batch": hang_batch, **lost(run_dir)})
                print(rows[-1], flush=True)
    costs = [c for row in rows for c in row["checkpoint_s"]]
    lines = [
        f"# Lost work per stall ({args.batches} batches/epoch, mid-epoch checkpoint every {args.every} batches)",
        "",
        f"Command: `python bench/lost_work.py --batches {args.batches} --every {args.every}`",
        "",
        "| hang at | batches lost, epoch-end only | batches lost, mid-epoch |",
        "| --- | --- | --- |",
    ]
    for fraction in (0.2, 0.5, 0.8):
        pair = {r["mode"]: r for r in rows if r["fraction"] == fraction}
        lines.append(
            f"| {fraction:.0%} of epoch 2 | {pair['epoch-only']['batches_lost']} | {pair['mid-epoch']['batches_lost']} |"
        )
    if costs:
        c = summary(costs)
        lines += ["", f"Mid-epoch checkpoint cost (yolov8n, CPU): median {c['median']:.3f} s [{c['min']:.3f}–{c['max']:.3f}]."]
    lines += ["", "![lost work per stall](lost_work.png)"]
    plot(rows, RESULTS / "lost_work.png")
    md = "\n".join(lines) + "\n"
    print(md)
    print(write_results("lost_work", {"rows": rows, "checkpoint_s": summary(costs) if costs else None}, md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
