"""Stall handling per hang kind: detection lateness, report, kill, time to the resumed first beat.

    python bench/stalls.py [--repeat 3] [--budget 5]

Each run supervises the beating child of ``trainbox.faults`` with a hang armed for
attempt 0; attempt 1 runs to completion. From the events: how late after the
budget ran out the stall was noticed, how long the incident report took and
its size, how long the kill took, and the time from "tree gone" to the first
beat of the resumed attempt (this includes the restart backoff, reported too).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from common import events, span, summary, train_cli, write_results

KINDS = ["sleep", "lock", "spin", "fork", "ignore-sigterm", "setsid"]
#: Ultralytics hangs: (profile, fault, startup budget) under `python -m trainbox run` on demo data.
YOLO_KINDS = {
    "worker deadlock (fast)": ("fast", "sleep@worker,attempt=0,train=1,epoch>=2", 120),
    "hang after validation": ("safe", "sleep@val_end,attempt=0,epoch=1", 120),
    "first batch never comes": ("safe", "sleep@worker,attempt=0,train=1,epoch=1", 30),
}
BACKOFF_S = 0.5
GRACE_S = 2.0


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
    args = parser.parse_args()
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


if __name__ == "__main__":
    raise SystemExit(main())
