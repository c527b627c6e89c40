"""Stall handling per hang kind: detection lateness, report, kill, time to the resumed first beat.

    python bench/stalls.py [--repeat 3] [--budget 5] [--yolo-repeat 1] [--rank-repeat 1]

Each run supervises the beating child of ``trainbox.faults`` with a hang armed for
attempt 0; attempt 1 runs to completion. From the events: how late after the
budget ran out the stall was noticed, how long the incident report took and
its size, how long the kill took, and the time from "tree gone" to the first
beat of the resumed attempt (this includes the restart backoff, reported too).

``--rank-repeat``: a torchrun job, 2 ranks of examples/plain_pytorch.py (DDP,
gloo, CPU), whose rank 1 hangs in epoch 1: budget -> the whole job gone
(agent and both ranks), and job gone -> the first resumed step of every rank
(the latest of the ranks' first beats with a step, each rank's own timestamp,
read from its heartbeat file while the run goes on). Written to
``stalls-ranks``; the rest to ``stalls``.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from common import REPO, cli_env, events, span, summary, train_cli, write_results

from trainbox import heartbeat
from trainbox.rundir import RunDir

KINDS = ["sleep", "lock", "spin", "fork", "ignore-sigterm", "setsid"]
#: Ultralytics hangs: (profile, fault, startup budget) under `python -m trainbox run` on demo data.
YOLO_KINDS = {
    "worker deadlock (fast)": ("fast", "sleep@worker,attempt=0,train=1,epoch>=2", 120),
    "hang after validation": ("safe", "sleep@val_end,attempt=0,epoch=1", 120),
    "first batch never comes": ("safe", "sleep@worker,attempt=0,train=1,epoch=1", 30),
}
BACKOFF_S = 0.5
GRACE_S = 2.0
#: The torchrun job: 2 DDP ranks of the example, 4 batches per rank and epoch; rank 1 hangs in epoch 1.
RANKS = 2
RANK_JOB = [str(REPO / "examples" / "plain_pytorch.py"), "--samples", "64", "--batch", "8", "--workers", "0", "--epochs", "2"]
RANK_FAULT = "sleep@step,rank=1,epoch=1,attempt=0"


def measure(kind: str, budget: float) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        code = train_cli(
            [
                "supervise",
                "--run-dir",
                str(run_dir),
                "--startup-timeout",
                "30",
                "--stall-timeout",
                str(budget),
                "--grace",
                str(GRACE_S),
                "--backoff",
                str(BACKOFF_S),
                "--quiet",
                "--",
                sys.executable,
                "-m",
                "trainbox.faults",
                "--steps",
                "20",
                "--interval",
                "0.1",
            ],
            {"TRAIN_FAULT": f"{kind}@step,step=5,attempt=0"},
        )
        history = events(run_dir)
    figures = stall_figures(kind, code, history)
    return {k: v for k, v in figures.items() if k not in ("budget_s", "kill_to_first_batch_s")}


def measure_yolo(profile: str, fault: str, startup: int, data: Path) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        code = train_cli(
            ["run", "--profile", profile, "--run-dir", str(run_dir), "--stall-timeout", "10", "--startup-timeout",
             str(startup), "--backoff", "0.5", "--quiet", f"data={data}", "epochs=2", "imgsz=64", "batch=8", "plots=False"],
            {"TRAIN_FAULT": fault},
        )  # fmt: skip
        history = events(run_dir)
    figures = stall_figures(fault, code, history)
    figures.pop("incident_bytes")
    return figures


def measure_ranks(budget: float) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), *RANK_JOB]
        budgets = ["--startup-timeout", "120", "--stall-timeout", str(budget)]
        args = ["supervise", "--run-dir", str(run_dir), *budgets, "--grace", str(GRACE_S), "--backoff", str(BACKOFF_S), "--quiet"]
        args += ["--", *torchrun]
        code, first_steps = supervise_watching_ranks(args)
        history = events(run_dir)
    figures = stall_figures("2 ranks", code, history)
    stall = next(e for e in history if e["event"] == "stall")
    if len(first_steps) != RANKS:
        raise SystemExit(f"2 ranks: resumed steps seen for ranks {sorted(first_steps)} only")
    figures["kill_to_every_rank_step_s"] = max(first_steps.values()) - stall["killed_ts"]
    figures.pop("incident_bytes")
    return figures


def supervise_watching_ranks(args: List[str]) -> Tuple[int, Dict[int, float]]:
    """Run the CLI; return its status and, per rank, when it beat its first step after the restart (its own ``ts``)."""
    run = RunDir(Path(args[args.index("--run-dir") + 1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainbox", *args],
        env=cli_env({"TRAIN_FAULT": RANK_FAULT}),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first: Dict[int, float] = {}
    restarted: Optional[float] = None
    while proc.poll() is None:
        if restarted is None:
            restarted = next((e["ts"] for e in events(run.root) if e["event"] == "restart"), None)
        elif run.rank_heartbeat.directory.is_dir():
            for path in run.rank_heartbeat.directory.iterdir():
                beat = heartbeat.read(path) or {}
                if "step" in beat and beat.get("ts", 0) > restarted:
                    first.setdefault(int(beat["rank"]), float(beat["ts"]))
        time.sleep(0.02)  # a rank's first beat of the attempt stays in its file for at least a second (the throttle)
    return proc.returncode, first


def stall_figures(label: str, code: int, history: List[Dict[str, Any]]) -> Dict[str, float]:
    """From a run's events: how late the stall was noticed, report and kill times, time to the resumed run."""
    if code != 0:
        raise SystemExit(f"{label}: supervisor exited {code}: {history}")
    stall = next(e for e in history if e["event"] == "stall")
    resumed = next(e for e in history if e["event"] == "exit")
    late = stall["silent_s"] - stall["budget_s"]
    return {
        "budget_s": stall["budget_s"],
        "detect_late_s": late,
        "incident_s": stall["incident_s"],
        "incident_bytes": stall["incident_bytes"],
        "kill_s": stall["kill_s"],
        "stall_to_kill_s": late + stall["incident_s"] + stall["kill_s"],
        "kill_to_first_beat_s": resumed["first_beat_ts"] - stall["killed_ts"],
        "kill_to_first_batch_s": (resumed["first_step_ts"] or resumed["first_beat_ts"]) - stall["killed_ts"],
    }


def _cell_of(row: Dict[str, Any], metric: str, scale: float = 1.0) -> str:
    return span(row[metric], scale)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument("--yolo-repeat", type=int, default=1, help="runs of each Ultralytics hang (0: none)")
    parser.add_argument("--rank-repeat", type=int, default=1, help="runs of the 2-rank torchrun hang (0: none)")
    args = parser.parse_args()
    if args.rank_repeat:
        report_ranks(args.rank_repeat, args.budget)
    if not args.repeat:
        return 0
    samples: Dict[str, List[Dict[str, float]]] = {k: [] for k in KINDS}
    for round_ in range(args.repeat):
        for kind in KINDS:  # interleaved: one of each kind per round
            samples[kind].append(measure(kind, args.budget))
            print(f"round {round_ + 1}/{args.repeat} {kind}: {samples[kind][-1]}", flush=True)
    table: Dict[str, Any] = {
        kind: {metric: summary([s[metric] for s in runs]) for metric in runs[0]} for kind, runs in samples.items()
    }
    lines = [
        f"# Stall handling (budget {args.budget:.0f} s, grace {GRACE_S:.0f} s, backoff {BACKOFF_S} s, {args.repeat} runs each)",
        "",
        f"Command: `python bench/stalls.py --repeat {args.repeat} --budget {args.budget:g}`. Medians, [min–max].",
        "",
        "| hang | budget→noticed s | report s | report KiB | kill s | budget→tree gone s | gone→first resumed beat s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, row in table.items():
        cell = functools.partial(_cell_of, row)
        lines.append(
            f"| {kind} | {cell('detect_late_s')} | {cell('incident_s')} | {cell('incident_bytes', 1 / 1024)} | "
            f"{cell('kill_s')} | {cell('stall_to_kill_s')} | {cell('kill_to_first_beat_s')} |"
        )
    yolo: Dict[str, List[Dict[str, float]]] = {k: [] for k in YOLO_KINDS}
    if args.yolo_repeat:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "data"
            train_cli(["demo-data", str(data), "--imgsz", "64"], {})
            for _ in range(args.yolo_repeat):
                for kind, (profile, fault, startup) in YOLO_KINDS.items():
                    yolo[kind].append(measure_yolo(profile, fault, startup, data / "data.yaml"))
                    print(f"{kind}: {yolo[kind][-1]}", flush=True)
        lines += [
            "",
            f"Ultralytics (`python -m trainbox run`, yolov8n on demo data, CPU, {args.yolo_repeat} run(s) each):",
            "",
            "| hang | budget s | budget→noticed s | report s | kill s | gone→first resumed beat s | gone→first resumed batch s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        metrics = ("detect_late_s", "incident_s", "kill_s", "kill_to_first_beat_s", "kill_to_first_batch_s")
        for kind, runs in yolo.items():
            row = {metric: summary([r[metric] for r in runs]) for metric in runs[0]}
            table[kind] = row
            lines.append(f"| {kind} | {row['budget_s']['median']:.0f} | " + " | ".join(span(row[m]) for m in metrics) + " |")
    path = write_results(
        "stalls", {"budget_s": args.budget, "grace_s": GRACE_S, "backoff_s": BACKOFF_S, "kinds": table}, "\n".join(lines) + "\n"
    )
    print("\n".join(lines))
    print(f"results: {path}")
    return 0


def report_ranks(repeat: int, budget: float) -> None:
    runs = []
    for round_ in range(repeat):
        runs.append(measure_ranks(budget))
        print(f"round {round_ + 1}/{repeat} 2 ranks: {runs[-1]}", flush=True)
    row = {metric: summary([r[metric] for r in runs]) for metric in runs[0]}
    metrics = ("detect_late_s", "incident_s", "kill_s", "stall_to_kill_s", "kill_to_first_beat_s", "kill_to_every_rank_step_s")
    lines = [
        f"# Stall of one torchrun rank ({RANKS} ranks, budget {budget:g} s, grace {GRACE_S:g} s, backoff {BACKOFF_S} s, "
        f"{repeat} run(s))",
        "",
        f"Command: `python bench/stalls.py --repeat 0 --rank-repeat {repeat} --budget {budget:g}`. `examples/plain_pytorch.py` "
        f"under `torchrun --nproc-per-node {RANKS}` (DDP, gloo, CPU), fault `{RANK_FAULT}`. Medians, [min–max].",
        "",
        "| budget→noticed s | report s | kill s | budget→job gone s | gone→first resumed beat s "
        "| gone→first resumed step, every rank s |",
        "| --- | --- | --- | --- | --- | --- |",
        "| " + " | ".join(span(row[m]) for m in metrics) + " |",
    ]
    data = {"budget_s": budget, "grace_s": GRACE_S, "backoff_s": BACKOFF_S, "ranks": RANKS, "figures": row}
    path = write_results("stalls-ranks", data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"results: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
