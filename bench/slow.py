"""Fail-slow: how soon a slowdown is flagged, how often a steady run is flagged wrongly, and what watching costs.

    python bench/slow.py [--repeat 2] [--steady-runs 8] [--steady-s 300] [--readings 12]

* **Latency.** Supervised runs of ``trainbox.faults``' beating child at two step rates (1 and 10 steps/s, +-30 %
  jitter per step) keep their pace for ``PACE_S`` and then slow down 1.5x, 2x or 3x (``slow@step`` with
  ``TRAIN_FAULT_FACTOR``), ``--repeat`` runs each. The latency is the time from the change (when the run reached
  the fault's step, interpolated between its progress samples) to the ``slow`` event (written: the 5 s reading
  of the conditions that explains it included). A run not flagged within ``MAX_WAIT_S`` of its change is missed.
* **False flags.** ``--steady-runs`` supervised runs, +-30 % jitter, at 1, 4 and 10 steps/s in turn, each
  ``--steady-s`` long: every ``slow`` event in them is a false flag.
* **Cost.** What the supervisor does to explain a slowdown while a run is at its pace: one reading of the
  conditions every ``BASELINE_EVERY_S`` (two /proc snapshots 5 s apart, the GPU tool where there is one), with
  stack samples of the training process (py-spy) every ``LOADER_EVERY_S``. ``--readings`` readings of a real
  process tree here, timed in this process (CPU: its own and py-spy's), and what that is per minute.

Every run goes at once: the children sleep between steps, and sharing the machine is part of the test (the load
average is sampled throughout and reported). Results: ``bench/results/slow.json`` and ``slow.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from common import REPO, cli_env, events, span, summary, write_results

from trainbox.diagnose.conditions import ConditionsProbe, GpuReader
from trainbox.rundir.layout import RunDir
from trainbox.rundir.progress import read_samples
from trainbox.supervise.pace import watch as pace_watch

#: Seconds at pace before the slowdown: warm-up, a baseline and the first reading of the conditions, with a margin.
PACE_S = 110.0
#: A slowdown not flagged this long after it began is missed.
MAX_WAIT_S = 240.0
RATES = (1.0, 10.0)
FACTORS = (1.5, 2.0, 3.0)
STEADY_RATES = (1.0, 4.0, 10.0)
#: What one step of the child costs besides its sleep (a beat written, a line printed), measured here: 0.1 s steps
#: took 0.107 s.
STEP_OVERHEAD_S = 0.007
JITTER = "0.3"
OPTIONS = ["--stall-timeout", "120", "--startup-timeout", "120", "--quiet"]


@dataclass
class Run:
    name: str
    rate: float
    factor: Optional[float]
    seed: int
    run_dir: Path = Path()
    process: Optional[subprocess.Popen] = None
    change_step: int = 0
    result: Dict[str, Any] = field(default_factory=dict)


def _child(run: Run, seconds_slow: float, steady_s: float) -> Tuple[List[str], Dict[str, str]]:
    interval = 1.0 / run.rate
    per_step = interval + STEP_OVERHEAD_S
    if run.factor is None:
        steps = int(steady_s / per_step)
        env: Dict[str, str] = {}
    else:
        run.change_step = int(PACE_S / per_step)
        steps = run.change_step + int(seconds_slow / (per_step * run.factor))
        env = {"TRAIN_FAULT": f"slow@step,step>={run.change_step}", "TRAIN_FAULT_FACTOR": str(run.factor)}
    child = [sys.executable, "-m", "trainbox.faults", "--steps", str(steps), "--interval", f"{interval:g}"]
    return [*child, "--jitter", JITTER, "--seed", str(run.seed)], env


def start(run: Run, base: Path, steady_s: float) -> None:
    run.run_dir = base / run.name
    child, env = _child(run, MAX_WAIT_S + 30, steady_s)
    argv = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(run.run_dir), *OPTIONS, "--", *child]
    run.process = subprocess.Popen(argv, env=cli_env(env), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def change_ts(run_dir: Path, step: int) -> Optional[float]:
    """When the run reached ``step``, interpolated between its progress samples."""
    samples = [(s["ts"], s["step"]) for s in read_samples(RunDir(run_dir).progress).records if isinstance(s.get("step"), int)]
    for (t0, s0), (t1, s1) in zip(samples, samples[1:]):
        if s0 < step <= s1:
            return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    return None


def judge(run: Run) -> None:
    found = events(run.run_dir)
    slows = [e for e in found if e["event"] == "slow"]
    exits = [e for e in found if e["event"] == "exit"]
    run.result = {"name": run.name, "rate": run.rate, "factor": run.factor, "slow_events": len(slows)}
    run.result.update(exit=exits[-1].get("code") if exits else None, stalls=sum(e["event"] == "stall" for e in found))
    if run.factor is None:
        run.result["seconds"] = (exits[-1]["ts"] - found[0]["ts"]) if exits and found else 0.0
        return
    began = change_ts(run.run_dir, run.change_step)
    after = [e for e in slows if began is not None and e["ts"] >= began]
    early = [e for e in slows if began is not None and e["ts"] < began]
    run.result.update(change_ts=began, flagged_early=len(early))
    if after:
        run.result.update(
            latency_s=round(after[0]["ts"] - began, 1), ratio=after[0].get("ratio"), suspect=after[0].get("suspect")
        )


def run_all(runs: List[Run], base: Path, steady_s: float) -> List[Tuple[float, float]]:
    """Start every run, wait for all, sampling the load average every 10 s: [(seconds in, load1)]."""
    for run in runs:
        start(run, base, steady_s)
    started, loads = time.monotonic(), []
    deadline = started + max(steady_s, PACE_S + MAX_WAIT_S) + 600
    while any(r.process is not None and r.process.poll() is None for r in runs) and time.monotonic() < deadline:
        loads.append((round(time.monotonic() - started), os.getloadavg()[0]))
        time.sleep(10)
    for run in runs:
        if run.process is not None and run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)
            run.process.wait(timeout=120)
        judge(run)
    return loads


def cost(readings: int) -> Dict[str, Any]:
    """CPU seconds per reading of the conditions of a real process tree, without and with stack samples."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(1.0)
        probe = ConditionsProbe(GpuReader())
        plain, sampled = [], []
        for n in range(readings):
            loader = n % 2 == 1
            own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            probe.begin([child.pid], child.pid, child.pid, loader=loader, wall=time.time())
            while probe.step([child.pid], child.pid) is None:
                time.sleep(0.5)  # the monitor's poll
            own2, children2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime) + (
                children2.ru_utime + children2.ru_stime - children.ru_utime - children.ru_stime
            )
            (sampled if loader else plain).append(cpu)
    finally:
        child.kill()
        child.wait()
    per_minute = (
        summary(plain)["median"] * 60 / pace_watch.BASELINE_EVERY_S
        + (summary(sampled)["median"] - summary(plain)["median"]) * 60 / pace_watch.LOADER_EVERY_S
    )
    return {"reading_cpu_s": summary(plain), "sampled_reading_cpu_s": summary(sampled), "cpu_s_per_minute": round(per_minute, 4)}


def markdown(args: argparse.Namespace, latency: List[Dict[str, Any]], steady: List[Dict[str, Any]], spent: Dict[str, Any],
             loads: List[float]) -> str:  # fmt: skip
    lines = [
        "# Fail-slow: detection latency, false flags, cost",
        "",
        f"Command: `python bench/slow.py --repeat {args.repeat} --steady-runs {args.steady_runs} --steady-s {args.steady_s:g}"
        f" --readings {args.readings}`",
        "",
        f"All {len(latency) + len(steady)} supervised runs at once on this machine; its load average (1 min) during them: "
        f"median {summary(loads)['median']:.1f} [{min(loads):.1f}–{max(loads):.1f}] (other people's work included).",
        "",
        "| slowdown | steps/s | latency s (median [min–max]) | flagged / runs | ratio seen |",
        "| --- | --- | --- | --- | --- |",
    ]
    for factor in FACTORS:
        for rate in RATES:
            group = [r for r in latency if r["factor"] == factor and r["rate"] == rate]
            found = [r["latency_s"] for r in group if "latency_s" in r]
            ratios = ", ".join(f"{r['ratio']:.2f}" for r in group if r.get("ratio") is not None)
            shown = span(summary(found), digits=1) if found else "missed"
            lines.append(f"| {factor:g}x | {rate:g} | {shown} | {len(found)} / {len(group)} | {ratios} |")
    early = sum(r.get("flagged_early", 0) for r in latency)
    minutes = sum(r["seconds"] for r in steady) / 60
    flags = sum(r["slow_events"] for r in steady)
    lines += [
        "",
        f"False flags: {flags} in {minutes:.0f} minutes of steady runs (+-30 % jitter, {len(steady)} runs at "
        f"{', '.join(f'{rate:g}' for rate in STEADY_RATES)} steps/s); {early} before the change in the latency runs.",
        "",
        f"Cost of watching the pace: a reading of the conditions {spent['reading_cpu_s']['median'] * 1000:.0f} ms CPU "
        f"({spent['sampled_reading_cpu_s']['median'] * 1000:.0f} ms with 5 py-spy stack samples); one every "
        f"{pace_watch.BASELINE_EVERY_S:g} s, samples every {pace_watch.LOADER_EVERY_S:g} s: "
        f"{spent['cpu_s_per_minute'] * 1000:.0f} ms CPU per minute ({spent['cpu_s_per_minute'] / 60 * 100:.3f} % of a core).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--steady-runs", type=int, default=8)
    parser.add_argument("--steady-s", type=float, default=300.0)
    parser.add_argument("--readings", type=int, default=12)
    args = parser.parse_args()
    latency = [
        Run(f"x{factor:g}-r{rate:g}-{n}", rate, factor, n) for factor in FACTORS for rate in RATES for n in range(args.repeat)
    ]
    steady = [Run(f"steady-{n}", STEADY_RATES[n % len(STEADY_RATES)], None, 100 + n) for n in range(args.steady_runs)]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trainbox-slow-") as tmp:
        loads = run_all([*latency, *steady], Path(tmp), args.steady_s)
    spent = cost(args.readings)
    load_values = [load for _, load in loads] or [load_before[0]]
    results = {
        "latency": [r.result for r in latency],
        "steady": [r.result for r in steady],
        "cost": spent,
        "load_1min": {"before": load_before, "during": loads},
        "pace_s": PACE_S,
        "max_wait_s": MAX_WAIT_S,
    }
    md = markdown(args, results["latency"], results["steady"], spent, load_values)
    write_results("slow", results, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
