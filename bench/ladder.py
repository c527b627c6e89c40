"""The ladder policies with real processes: the wall time to finish the same work, hangs injected on the fast rung.

    python bench/ladder.py [--seeds 3] [--steps 2400] [--parallel 8] [--write]

What it runs. Every run is ``trainbox supervise --ladder FILE`` over the resumable beating child of
``trainbox.faults`` (``--steps N --checkpoint FILE --save-every SAVE_EVERY``): the same ``--steps`` of work each time,
resumed from the child's checkpoint after every kill. Two rungs (issue 30's ``fast`` and seed 001's ``safe``):

* ``fast``: a step every ``FAST_INTERVAL_S``, with random hangs (``TRAIN_FAULT=sleep@step,chance=P``, the draw
  seeded by ``TRAIN_FAULT_SEED``, one seed per repetition) at the hang rate of the row;
* ``safe``: ``SAFE_SLOWER`` times as long per step (seed 001: 2.6 it/s on ``fast``, 2.1 with ``workers=0``), never
  hanging; its ``expected_speed`` (the policy's prior before it has run) is ``1 / SAFE_SLOWER``.

Hang rates (the issue's): none, one per 2 minutes and one per 30 seconds of training on ``fast``; P is the chance
per step that gives that mean time between hangs. Policies: (a) ``--ladder-policy down`` (today: one stall moves to
``safe`` for good), (b) ``--ladder-policy cost`` (the rung that finishes first), (c) ``safe`` from the start (a
ladder of ``safe`` alone: seed 001's choice), (d) ``fast`` with no hangs (a ladder of a hang-free ``fast`` alone:
the limit). (c) and (d) do not depend on the hang rate: they run once per seed and stand in every row.

The scale. The work is ``--steps`` steps (2400: about 4.3 minutes on ``fast``), not 9 days; a hang costs seconds,
not the issue's 5 minutes: ``--stall-timeout STALL_TIMEOUT_S`` of silence, the kill (``--grace 1``), a restart with
no backoff (the child's Python start), and the steps since the last checkpoint (every ``SAVE_EVERY`` steps, about
5 s on ``fast``): about 10 s in all, the simulator's cheapest resume (bench/ladder_sim.py). So one hang per 2
minutes costs ``fast`` about 8 % (less than ``safe``'s 24 %: staying pays), one per 30 s about a third (more: stepping
down pays), where seed 001's one hang per 4.5 h at 5 minutes each costs about 2 %.

Runs go ``--parallel`` at a time, seed by seed, so the policies of one seed share the machine's load; the children
sleep between steps, and the load average is sampled throughout and reported. The wall time of a run is from
starting ``trainbox supervise`` to its exit. Results: ``bench/results/ladder.json`` and ``ladder.md`` (``--write``).

Limits: steps are constant (no jitter, no slow first epoch), a checkpoint costs nothing, and the few runs per cell
make the hang rates' luck visible: the figures are medians with their range, and the simulator gives the means of
many seeds for the same scenarios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common import REPO, cli_env, events, span, summary, write_results

#: Seconds between two steps on ``fast``: 10 steps a second, so a checkpoint every few seconds is many steps.
FAST_INTERVAL_S = 0.1
#: What one step of the child costs besides its sleep (a beat written, a line printed), as bench/slow.py measured.
STEP_OVERHEAD_S = 0.007
#: ``safe``'s time per step against ``fast``'s: seed 001's 2.6 it/s against 2.1 it/s with ``workers=0``.
SAFE_SLOWER = 2.6 / 2.1
#: Steps between two checkpoints: about 5 s on ``fast``, so a hang redoes about 2.7 s of work on average.
SAVE_EVERY = 50
#: Seconds of silence before a stall is called: long against a step (0.1 s) and a busy machine's hiccups, short
#: enough that a hang costs about 10 s in all (see the module docstring).
STALL_TIMEOUT_S = 5.0
#: The issue's hang rates on ``fast``: mean seconds of training between two hangs (None: no hangs).
HANG_RATES: Dict[str, Optional[float]] = {"none": None, "1 per 2 min": 120.0, "1 per 30 s": 30.0}
POLICIES = ("down", "cost", "safe", "fast")
#: A run that takes longer than this (three times safe's 2400 steps) is stopped and reported as unfinished.
RUN_TIMEOUT_S = 900.0


def step_s(interval: float) -> float:
    return interval + STEP_OVERHEAD_S


#: ``safe``'s sleep per step, so that a whole step takes SAFE_SLOWER times ``fast``'s.
SAFE_INTERVAL_S = step_s(FAST_INTERVAL_S) * SAFE_SLOWER - STEP_OVERHEAD_S


def chance_percent(mean_s: float) -> float:
    """The chance per step, in percent, of a hang once per ``mean_s`` seconds of training on ``fast``."""
    return 100.0 * step_s(FAST_INTERVAL_S) / mean_s


def rung(name: str, fault_seed: Optional[int] = None, mean_s: Optional[float] = None) -> str:
    """One rung of a ladder file, as a line of YAML."""
    if name == "safe":
        return f'  - {{name: safe, args: ["--interval", "{SAFE_INTERVAL_S:.4f}"], expected_speed: {1 / SAFE_SLOWER:.3f}}}\n'
    env = ""
    if mean_s is not None:
        env = f', env: {{TRAIN_FAULT: "sleep@step,chance={chance_percent(mean_s):.4f}", TRAIN_FAULT_SEED: "{fault_seed}"}}'
    return f'  - {{name: fast, args: ["--interval", "{FAST_INTERVAL_S:g}"]{env}}}\n'


@dataclass
class Run:
    rate: str
    policy: str
    seed: int
    result: Dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.policy}-{self.rate.replace(' ', '_')}-{self.seed}"

    def ladder(self) -> str:
        mean_s = HANG_RATES[self.rate]
        if self.policy == "safe":
            return "rungs:\n" + rung("safe")
        if self.policy == "fast":
            return "rungs:\n" + rung("fast")
        return "rungs:\n" + rung("fast", self.seed, mean_s) + rung("safe")


def command(run: Run, base: Path, steps: int) -> List[str]:
    folder = base / run.name
    folder.mkdir(parents=True)
    (folder / "ladder.yaml").write_text(run.ladder())
    policy = "down" if run.policy == "down" else "cost"
    budgets = ["--stall-timeout", f"{STALL_TIMEOUT_S:g}", "--startup-timeout", "60", "--grace", "1"]
    budgets += ["--backoff", "0", "--backoff-max", "0", "--max-restarts", "200"]
    child = [sys.executable, "-m", "trainbox.faults", "--steps", str(steps), "--save-every", str(SAVE_EVERY)]
    child += ["--checkpoint", str(folder / "checkpoint")]
    supervise = ["supervise", "--quiet", "--run-dir", str(folder / "run"), "--ladder", str(folder / "ladder.yaml")]
    return [sys.executable, "-m", "trainbox", *supervise, "--ladder-policy", policy, *budgets, "--", *child]


def perform(run: Run, base: Path, steps: int) -> None:
    """Run it to the end and read what happened from its events."""
    argv = command(run, base, steps)
    started = time.monotonic()
    try:
        code: Optional[int] = subprocess.run(
            argv, env=cli_env({}), cwd=REPO, timeout=RUN_TIMEOUT_S, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ).returncode
    except subprocess.TimeoutExpired:
        code = None
    wall = time.monotonic() - started
    folder = base / run.name
    found = events(folder / "run")
    starts = [e.get("profile") for e in found if e["event"] == "start"]
    try:
        saved = int((folder / "checkpoint").read_text())
    except (OSError, ValueError):
        saved = None
    run.result = {
        "rate": run.rate,
        "policy": run.policy,
        "seed": run.seed,
        "exit": code,
        "finished": code == 0 and saved == steps,
        "wall_s": round(wall, 2),
        "stalls": sum(e["event"] == "stall" for e in found),
        "causes": [e.get("cause") for e in found if e["event"] == "stall"],
        "probes": sum(e["event"] == "probe" for e in found),
        "cost_per_stall_s": stall_cost(found),
        "moves": [(e["event"], e.get("profile"), (e.get("ladder") or {}).get("kind")) for e in found if e.get("ladder")],
        "rungs": starts,
        "final_rung": starts[-1] if starts else None,
    }


def stall_cost(found: Sequence[Dict[str, Any]]) -> Optional[float]:
    """What a stall on ``fast`` cost as the run's ledger measured it (silence, handling and restart, work redone),
    from the last decision that weighed it; None without one."""
    for event in reversed(found):
        for candidate in (event.get("ladder") or {}).get("candidates") or ():
            if candidate.get("rung") == "fast" and candidate.get("stalls"):
                return candidate.get("cost_per_stall_s")
    return None


def schedule(seeds: int) -> List[Run]:
    """Seed by seed (so one seed's runs share the machine's load): each rate's down and cost, then safe and fast."""
    runs = []
    for seed in range(1, seeds + 1):
        for rate in HANG_RATES:
            runs += [Run(rate, "down", seed), Run(rate, "cost", seed)]
        runs += [Run("none", "safe", seed), Run("none", "fast", seed)]
    return runs


def run_all(runs: List[Run], steps: int, parallel: int) -> List[Tuple[float, float]]:
    """Every run, ``parallel`` at a time, sampling the load average every 10 s: [(seconds in, load1)]."""
    loads: List[Tuple[float, float]] = []
    done = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        while not done.wait(10.0 if loads else 0.0):
            loads.append((round(time.monotonic() - started), os.getloadavg()[0]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="trainbox-ladder-") as tmp, ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda run: perform(run, Path(tmp), steps), runs))
    done.set()
    sampler.join()
    return loads


def cells(results: Sequence[Dict[str, Any]]) -> Dict[Tuple[str, str], List[Dict[str, Any]]]:
    """The results by (rate, policy); (c) and (d), run once per seed, stand in every rate."""
    by: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for rate in HANG_RATES:
        for policy in POLICIES:
            shared = policy in ("safe", "fast")
            by[(rate, policy)] = [r for r in results if r["policy"] == policy and (shared or r["rate"] == rate)]
    return by


def verdict(by: Dict[Tuple[str, str], List[Dict[str, Any]]]) -> Dict[str, Any]:
    """The issue's goal on the medians: (b) within 10 % of the best of (a) and (c) at every rate, and better than
    both at the middle one."""
    ratios = {}
    for rate in HANG_RATES:
        medians = {p: summary([r["wall_s"] for r in by[(rate, p)]])["median"] for p in ("down", "cost", "safe")}
        ratios[rate] = round(medians["cost"] / min(medians["down"], medians["safe"]), 3)
    middle = list(HANG_RATES)[1]
    return {
        "cost_vs_best": ratios,
        "within_10_percent": all(ratio <= 1.10 for ratio in ratios.values()),
        "better_at_middle": ratios[middle] < 1.0,
    }


def _rungs(group: Sequence[Dict[str, Any]]) -> str:
    finals = [r["final_rung"] for r in group]
    return ", ".join(f"{name} ×{finals.count(name)}" for name in sorted(set(finals), key=str))


def markdown(command_line: str, results: Sequence[Dict[str, Any]], loads: Sequence[float], parallel: int) -> str:
    by, unfinished = cells(results), [r for r in results if not r["finished"]]
    judged = verdict(by)
    lines = [
        "# The ladder policies, real processes (bench/ladder.py)",
        "",
        f"Command: `{command_line}`. Wall seconds to finish the same work, median [min–max] of "
        f"{len(by[('none', 'cost')])} seeds; fast {FAST_INTERVAL_S:g} s of sleep per step (about "
        f"{1 / step_s(FAST_INTERVAL_S):.1f} steps/s), safe {SAFE_SLOWER:.3f}× as long per step; a hang costs "
        f"{STALL_TIMEOUT_S:g} s of silence, the kill, the restart and up to {SAVE_EVERY} steps redone. "
        "(c) and (d) do not depend on the hang rate: the same runs stand in every row.",
        "",
        f"{len(results)} runs, {parallel} at a time; the load average (1 min) during them: median "
        f"{summary(loads)['median']:.1f} [{min(loads):.1f}–{max(loads):.1f}] on {os.cpu_count()} cores (other people's "
        f"work included). Unfinished runs: {len(unfinished)}.",
        "",
        "| hangs on fast | (a) down | (b) cost | (c) safe | (d) fast, no hangs | (b) / best of (a), (c) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rate in HANG_RATES:
        walls = [span(summary([r["wall_s"] for r in by[(rate, p)]]), digits=1) for p in POLICIES]
        lines.append(f"| {rate} | " + " | ".join(walls) + f" | {judged['cost_vs_best'][rate]:.3f} |")
    costs = [r["cost_per_stall_s"] for r in results if r.get("cost_per_stall_s") is not None]
    lines += [
        "",
        f"What a hang on fast cost, as the runs' ledgers measured it: {span(summary(costs), digits=1) if costs else 'none'} s.",
        "",
        f"Goal (issue 30, on the medians): (b) within 10 % of the best of (a) and (c) at every rate: "
        f"**{'yes' if judged['within_10_percent'] else 'no'}**; better than both at one hang per 2 minutes: "
        f"**{'yes' if judged['better_at_middle'] else 'no'}**.",
        "",
        "| hangs on fast | policy | stalls (median [min–max]) | probes | final rung |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rate in HANG_RATES:
        for policy in ("down", "cost"):
            group = by[(rate, policy)]
            stalls = span(summary([r["stalls"] for r in group]), digits=0)
            probes = span(summary([r["probes"] for r in group]), digits=0)
            lines.append(f"| {rate} | {policy} | {stalls} | {probes} | {_rungs(group)} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="repetitions, each with its own TRAIN_FAULT_SEED")
    parser.add_argument("--steps", type=int, default=2400, help="the work: steps of the child")
    parser.add_argument("--parallel", type=int, default=8, help="runs at once")
    parser.add_argument("--write", action="store_true", help="write bench/results/ladder.{md,json}")
    args = parser.parse_args(argv)
    command_line = f"python bench/ladder.py --seeds {args.seeds} --steps {args.steps} --parallel {args.parallel}"
    command_line += " --write" if args.write else ""
    load_before = os.getloadavg()
    runs = schedule(args.seeds)
    loads = run_all(runs, args.steps, args.parallel)
    results = [run.result for run in runs]
    load_values = [load for _, load in loads] or [load_before[0]]
    text = markdown(command_line, results, load_values, args.parallel)
    print(text)
    if args.write:
        data = {
            "command": command_line,
            "runs": results,
            "verdict": verdict(cells(results)),
            "load_1min": {"before": load_before, "during": loads},
            "scale": {
                "steps": args.steps,
                "fast_interval_s": FAST_INTERVAL_S,
                "safe_interval_s": round(SAFE_INTERVAL_S, 4),
                "stall_timeout_s": STALL_TIMEOUT_S,
                "save_every": SAVE_EVERY,
                "chance_percent": {k: (round(chance_percent(v), 4) if v else 0.0) for k, v in HANG_RATES.items()},
            },
        }
        write_results("ladder", data, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
