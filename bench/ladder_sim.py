"""A deterministic simulator of one run under a ladder policy: what each way of choosing rungs costs in wall time.

    python bench/ladder_sim.py [--seeds 20] [--hours 1] [--write]

Why it exists. Whether weighing hangs against safety pays (issue 30) depends on
how often a rung hangs and what a hang costs; a real run measures one point at
a time and takes its length to do it. This models the run so the policy can be
judged at many points in milliseconds (tests/supervise/ladder/test_policy.py)
and next to the measured runs of ``bench/ladder.py``. It lives in ``bench/``
because it makes figures (bench/results/ladder-sim.*); the tests import it.

The model. The run trains ``work_steps`` steps. Each rung has a true speed and a
true hang rate (random hangs are a Poisson process in training time, so the
time to the next one is exponential and memoryless), and may hang
deterministically at a step (every time it gets there). The rung trains from
its last checkpoint in stretches of ``checkpoint_s`` training seconds; each
stretch ends at a checkpoint (a ``Trigger.CHECKPOINT`` decision: a ``probe``
costs a restart) or in a hang: ``silence_s`` until the kill, ``restart_s`` to
train again, and the stretch's training is redone from the checkpoint (a
``Trigger.STALL`` decision). A rung's steady rate is known to the policy once it
has trained ``measure_after_s``; before that it gets the prior speeds.

Strategies: ``down`` (today: one stall moves down for good), ``cost`` (the
rung that finishes first), ``safe`` (the last rung from the start, seed 001's
choice), ``ideal`` (the first rung with its hangs removed: the limit).

Limits. Speeds are constant (no warm-up, no slow first epoch), a checkpoint
costs nothing, a deterministic hang is one step, and silence and restart are
the same every time: the figures compare policies, not machines.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.supervise.ladder.policy import (
    Decision,
    Kind,
    PolicyName,
    Probation,
    Rung,
    RungHistory,
    Situation,
    Stall,
    Trigger,
    choose,
)


class Strategy(str, Enum):
    DOWN = "down"
    COST = "cost"
    SAFE = "safe"
    IDEAL = "ideal"


@dataclass(frozen=True)
class SimRung:
    name: str
    #: True steps per second.
    speed: float
    #: True random hangs per hour of training on this rung.
    hangs_per_hour: float = 0.0
    #: Steps at which this rung hangs every time it gets there.
    hangs_at: Tuple[int, ...] = ()
    #: The relative speed the policy is told before it measures (None: the true one).
    prior_speed: Optional[float] = None


@dataclass(frozen=True)
class Scenario:
    rungs: Tuple[SimRung, ...]
    work_steps: int
    silence_s: float = 10.0
    restart_s: float = 5.0
    checkpoint_s: float = 10.0
    measure_after_s: float = 10.0
    deadline_s: Optional[float] = None

    def without_hangs(self) -> Scenario:
        return replace(self, rungs=tuple(replace(r, hangs_per_hour=0.0, hangs_at=()) for r in self.rungs))


@dataclass
class SimResult:
    wall_s: float
    stalls: int
    #: (kind, rung, wall seconds) of every decision that moved the run.
    moves: List[Tuple[str, str, float]] = field(default_factory=list)
    #: Training seconds on each rung.
    trained_s: Dict[str, float] = field(default_factory=dict)
    last: Optional[Decision] = None


@dataclass
class _Run:
    """The simulated run's state as it goes."""

    scenario: Scenario
    policy: PolicyName
    rung: str
    pos: float = 0.0
    wall: float = 0.0
    trained: Dict[str, float] = field(default_factory=dict)
    stalls: Dict[str, List[Stall]] = field(default_factory=dict)
    probation: Probation = field(default_factory=Probation)
    moves: List[Tuple[str, str, float]] = field(default_factory=list)
    last: Optional[Decision] = None

    def spec(self) -> SimRung:
        return next(r for r in self.scenario.rungs if r.name == self.rung)

    def situation(self) -> Situation:
        scenario = self.scenario
        history = {
            r.name: RungHistory(
                rate=r.speed if self.trained.get(r.name, 0.0) >= scenario.measure_after_s else None,
                hours=self.trained.get(r.name, 0.0) / 3600.0,
                stalls=tuple(self.stalls.get(r.name, ())),
            )
            for r in scenario.rungs
        }
        rungs = [Rung(r.name, r.prior_speed if r.prior_speed is not None else r.speed) for r in scenario.rungs]
        return Situation(
            rungs=rungs,
            current=self.rung,
            remaining_steps=max(0, math.ceil(scenario.work_steps - self.pos)),
            now=self.wall,
            history=history,
            step=int(self.pos),
            deadline=scenario.deadline_s,
            restart_s=scenario.restart_s,
            probation=self.probation,
            policy=self.policy,
        )

    def decide(self, trigger: Trigger, step: int) -> Decision:
        decision = choose(replace(self.situation(), step=step), trigger)
        self.probation, self.last = decision.probation, decision
        if decision.rung != self.rung:
            self.moves.append((decision.kind.value, decision.rung, self.wall))
        return decision


def _time_to_hang(rung: SimRung, pos: float, rng: random.Random) -> Tuple[float, bool]:
    """Training seconds from ``pos`` to this rung's next hang, and whether it is a deterministic one."""
    rate_per_s = rung.hangs_per_hour / 3600.0
    random_s = rng.expovariate(rate_per_s) if rate_per_s > 0 else math.inf
    ahead = [(step - pos) / rung.speed for step in rung.hangs_at if step >= pos]
    fixed_s = min(ahead, default=math.inf)
    return (fixed_s, True) if fixed_s <= random_s else (random_s, False)


def _stretch(run: _Run, rng: random.Random) -> None:
    """Train from the last checkpoint to the next one, or into a hang; then let the policy decide."""
    scenario, rung = run.scenario, run.spec()
    stretch_s = min(scenario.checkpoint_s, (scenario.work_steps - run.pos) / rung.speed)
    hang_s, fixed = _time_to_hang(rung, run.pos, rng)
    trained_s = min(hang_s, stretch_s)
    run.trained[rung.name] = run.trained.get(rung.name, 0.0) + trained_s
    if hang_s >= stretch_s:
        run.wall += stretch_s
        run.pos += stretch_s * rung.speed
        if run.pos < scenario.work_steps and run.decide(Trigger.CHECKPOINT, int(run.pos)).kind is Kind.PROBE:
            run.wall += scenario.restart_s
            run.rung = run.probation.probing or run.rung
        return
    step = int(round(run.pos + hang_s * rung.speed)) if fixed else int(run.pos + hang_s * rung.speed)
    run.wall += trained_s + scenario.silence_s + scenario.restart_s
    stall = Stall(f"step {step}", step, "train", scenario.silence_s, scenario.restart_s, trained_s)
    run.stalls.setdefault(rung.name, []).append(stall)
    run.rung = run.decide(Trigger.STALL, step).rung


def simulate(scenario: Scenario, strategy: Strategy, seed: int) -> SimResult:
    """The run's wall time under ``strategy``, with the hangs drawn from ``random.Random(seed)``."""
    if strategy is Strategy.IDEAL:
        scenario = scenario.without_hangs()
    start = scenario.rungs[-1].name if strategy is Strategy.SAFE else scenario.rungs[0].name
    policy = PolicyName.COST if strategy is Strategy.COST else PolicyName.DOWN
    run = _Run(scenario, policy, start)
    rng = random.Random(seed)
    while run.pos < scenario.work_steps:
        _stretch(run, rng)
    stalls = sum(len(s) for s in run.stalls.values())
    return SimResult(run.wall, stalls, run.moves, dict(run.trained), run.last)


# -- the figures ------------------------------------------------------------------------------------------------

#: The issue's hang rates on the fast rung: none, one per 2 minutes, one per 30 seconds.
HANG_RATES = {"none": 0.0, "1 per 2 min": 30.0, "1 per 30 s": 120.0}
#: Resume costs (silence before the kill, restart), with a 10 s checkpoint interval (about 5 s redone on average):
#: about 10, 20 and 30 s per hang in all.
RESUME_COSTS = {"~10 s": (4.0, 1.0), "~20 s": (10.0, 5.0), "~30 s": (17.0, 8.0)}
#: fast 1.0, safe 0.8 (steps per second scaled so that a step is a fine place: two random hangs rarely share one).
FAST_SPEED, SAFE_SPEED = 100.0, 80.0


#: Long runs at the seeds' figures: fast at 2.6 it/s hanging once per 4.5 hours, 2 minutes of silence before the kill,
#: 4 s to restart, a mid-epoch checkpoint every 5 minutes; safe at 2.1 it/s (RX 5600 XT, seed 001) or at 0.104 / 0.756
#: of fast (H100, bench/results/gpu.md).
LONG_RUNS = {"RX 5600 XT (seed 001)": (2.6, 2.1), "H100 (gpu.md)": (7.56, 1.04)}
#: Hours of fast's work in a long run, and the seeds averaged (each run is 48 h of work in 5-minute stretches).
LONG_HOURS, LONG_SEEDS = 48.0, 5


def long_run(fast: float, safe: float) -> Scenario:
    rungs = (SimRung("fast", fast, 1 / 4.5), SimRung("safe", safe))
    work = int(LONG_HOURS * 3600 * fast)
    return Scenario(rungs, work, silence_s=120.0, restart_s=4.0, checkpoint_s=300.0, measure_after_s=300.0)


def scenario(hangs_per_hour: float, silence_s: float, restart_s: float, hours: float) -> Scenario:
    rungs = (SimRung("fast", FAST_SPEED, hangs_per_hour), SimRung("safe", SAFE_SPEED))
    return Scenario(rungs, int(hours * 3600 * FAST_SPEED), silence_s=silence_s, restart_s=restart_s)


def mean_wall(case: Scenario, strategy: Strategy, seeds: Sequence[int]) -> float:
    return statistics.mean(simulate(case, strategy, seed).wall_s for seed in seeds)


def table(seeds: Sequence[int], hours: float) -> List[Dict[str, Any]]:
    """Mean wall minutes of each strategy for each hang rate and resume cost."""
    rows = []
    for cost_name, (silence, restart) in RESUME_COSTS.items():
        for rate_name, per_hour in HANG_RATES.items():
            case = scenario(per_hour, silence, restart, hours)
            walls = {s.value: mean_wall(case, s, seeds) / 60.0 for s in Strategy}
            best = min(walls["down"], walls["safe"])
            rows.append({"resume": cost_name, "hangs": rate_name, **walls, "cost_vs_best": walls["cost"] / best})
    return rows


def long_table() -> List[Dict[str, Any]]:
    """Mean wall hours of each strategy in the long runs."""
    rows = []
    for machine, (fast, safe) in LONG_RUNS.items():
        walls = {s.value: mean_wall(long_run(fast, safe), s, range(LONG_SEEDS)) / 3600.0 for s in Strategy}
        rows.append({"machine": machine, **walls})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], long_rows: Sequence[Mapping[str, Any]], command: str) -> str:
    lines = [
        "# The ladder policies, simulated (bench/ladder_sim.py)",
        "",
        f"Command: `{command}`. Mean wall minutes; fast 1.0, safe 0.8; a checkpoint every 10 s of training.",
        "",
        "| resume cost | hangs on fast | (a) down | (b) cost | (c) safe | (d) ideal | (b) / best of (a), (c) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = [f"{r[k]:.1f}" for k in ("down", "cost", "safe", "ideal")]
        lines.append(f"| {r['resume']} | {r['hangs']} | " + " | ".join(cells) + f" | {r['cost_vs_best']:.3f} |")
    lines += [
        "",
        f"Long runs: {LONG_HOURS:g} h of fast's work, one hang per 4.5 h on fast, 2 min silence, 4 s restart, a checkpoint",
        f"every 5 min; mean wall hours of {LONG_SEEDS} seeds.",
        "",
        "| machine | (a) down | (b) cost | (c) safe | (d) ideal |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in long_rows:
        lines.append(f"| {r['machine']} | " + " | ".join(f"{r[k]:.1f}" for k in ("down", "cost", "safe", "ideal")) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--hours", type=float, default=1.0, help="the work, in hours on fast without hangs")
    parser.add_argument("--write", action="store_true", help="write bench/results/ladder-sim.{md,json}")
    args = parser.parse_args(argv)
    rows, long_rows = table(range(args.seeds), args.hours), long_table()
    command = f"python bench/ladder_sim.py --seeds {args.seeds} --hours {args.hours:g}" + (" --write" if args.write else "")
    text = markdown(rows, long_rows, command)
    print(text)
    if args.write:
        from common import write_results  # bench/common.py: the benchmarks' result writer

        write_results("ladder-sim", {"command": command, "rows": rows, "long_runs": long_rows}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
