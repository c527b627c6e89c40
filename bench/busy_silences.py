"""Healthy long silences and real hangs, under the real supervisor (``bench/stalls.py --busy-silences N``).

A learned budget is a suspicion (``trainbox.supervise.stalls.busy``): a busy evaluation or save between two steps
must go on, a hang there must still be found. Each scenario supervises the tqdm loop of
tests/fixtures/output/programs/silent_eval.py (it knows nothing of trainbox) with a learned budget of a few seconds:

* **healthy**: a silent evaluation (pure-Python work) or save (a file written and fsynced) of ``SILENCE_S``, in the
  middle of the bar (``--every``, as nanoGPT evaluates every ``eval_interval`` and a Trainer saves every
  ``save_steps``) or after it. Any ``stall`` event is a false stall (goal: none);
* **hangs**, in the middle of the bar (trainbox.faults' ``output`` site): idle (a sleep), a stopped process, a busy
  spin. Each must be found: the time is the stall event's ``silent_s``, with its budget and rule.

The budgets are the defaults scaled down so that a run takes seconds (``SCALED``: a learned floor of 1 s from 5
intervals instead of 60 s from 20, a stall budget of 30 s instead of 300 s, an idle timeout of 10 s instead of
120 s), with silences of ``SILENCE_S`` (well past the learned budget, well under the stall budget), as a 75 s
evaluation stands to the defaults. Scenarios are interleaved per round, and the load average is recorded per run.
Run it against another checkout (the one before this rule) by putting that checkout's import root first on
``PYTHONPATH`` (see bench/results/busy-silences.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from common import REPO, events, train_cli, write_results

PROGRAM = REPO / "tests" / "fixtures" / "output" / "programs" / "silent_eval.py"
INJECTOR = REPO / "tests" / "fixtures" / "uninstrumented"
#: The defaults, scaled down (see the module docstring).
SCALED = ("--startup-timeout", "60", "--stall-timeout", "30", "--idle-timeout", "10", "--learned-floor", "1")
SCALED += ("--learned-min-samples", "5", "--max-restarts", "0", "--grace", "2", "--quiet")
#: A healthy silence: past the learned budget (a few seconds), under the stall budget (30 s).
SILENCE_S = 8.0
#: 40 steps 0.25 s apart, the silence after the 20th; a hang once 25 lines (step 24) were written.
BAR = ("--epochs", "1", "--steps", "40", "--delay", "0.25")
HANG_AT = ",attempt=0,lines>=25"


@dataclass(frozen=True)
class Scenario:
    label: str
    args: Tuple[str, ...]
    fault: str = ""

    @property
    def healthy(self) -> bool:
        return not self.fault


SCENARIOS = (
    Scenario("busy evaluation, mid-bar", (*BAR, "--every", "20", "--eval-s", str(SILENCE_S))),
    Scenario("busy save, mid-bar", (*BAR, "--every", "20", "--eval-s", str(SILENCE_S), "--work", "save")),
    Scenario("busy evaluation, after the bar", (*BAR, "--eval-s", str(SILENCE_S))),
    Scenario("busy save, after the bar", (*BAR, "--eval-s", str(SILENCE_S), "--work", "save")),
    Scenario("hang: idle, mid-bar", (*BAR, "--eval-s", "0"), "sleep@output" + HANG_AT),
    Scenario("hang: stopped process, mid-bar", (*BAR, "--eval-s", "0"), "stopped@output" + HANG_AT),
    Scenario("hang: busy spin, mid-bar", (*BAR, "--eval-s", "0"), "spin@output" + HANG_AT),
)


def run_once(scenario: Scenario) -> Dict[str, Any]:
    """Supervise the scenario once: its stall (budget, rule, cause, silence) or none."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        paths = [str(INJECTOR), os.environ.get("PYTHONPATH", "")]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "TRAIN_FAULT": scenario.fault}
        command = [sys.executable, str(PROGRAM), *scenario.args]
        code = train_cli(["supervise", "--run-dir", str(run_dir), *SCALED, "--", *command], env, timeout=600)
        history = events(run_dir)
    stall = next((e for e in history if e.get("event") == "stall"), None)
    found = {"code": code, "stalled": stall is not None}
    if stall is not None:
        found.update({key: stall.get(key) for key in ("budget", "budget_s", "silent_s", "rule", "cause")})
    return found


def measure(repeat: int) -> List[Dict[str, Any]]:
    rows = []
    for round_ in range(repeat):
        for scenario in SCENARIOS:
            load = os.getloadavg()[0]
            started = time.monotonic()
            found = run_once(scenario)
            rows.append(dict(found, round=round_, scenario=scenario.label, healthy=scenario.healthy, load=round(load, 1),
                             seconds=round(time.monotonic() - started, 1)))  # fmt: skip
            said = f"stall {found.get('rule')} {found.get('budget')} at {found.get('silent_s')} s" * found["stalled"]
            print(f"round {round_ + 1}/{repeat} load {load:.1f} {scenario.label}: {said or 'no stall'}", flush=True)
    return rows


def _cell(values: List[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]" if values else "–"


def report(repeat: int, rows: List[Dict[str, Any]], version: str) -> str:
    loads = [row["load"] for row in rows]
    lines = [
        f"### {version}",
        "",
        f"Every scenario {repeat} times, interleaved; load average {min(loads):.1f}–{max(loads):.1f} during the runs.",
        "",
        "| scenario | runs | stalls | false-stall rate | found after (s), median [min–max] | budget, rule |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for scenario in SCENARIOS:
        mine = [row for row in rows if row["scenario"] == scenario.label]
        stalls = [row for row in mine if row["stalled"]]
        rate = f"{100 * len(stalls) / len(mine):.0f} %" if scenario.healthy else "–"
        found = _cell([row["silent_s"] for row in stalls]) if stalls else "–"
        kinds = sorted({(row["budget"], row["rule"]) for row in stalls})
        how = (
            "; ".join(
                f"{budget} ({_cell([r['budget_s'] for r in stalls if (r['budget'], r['rule']) == (budget, rule)])} s), {rule}"
                for budget, rule in kinds
            )
            or "–"
        )
        lines.append(f"| {scenario.label} | {len(mine)} | {len(stalls)} | {rate} | {found} | {how} |")
    healthy = [row for row in rows if row["healthy"]]
    false = sum(row["stalled"] for row in healthy)
    missed = sum(not row["stalled"] for row in rows if not row["healthy"])
    lines += ["", f"**False stalls: {false} of {len(healthy)} healthy runs** (goal 0); hangs missed: {missed}."]
    return "\n".join(lines) + "\n"


def main(repeat: int, name: Optional[str] = None) -> None:
    """Measure, print and write ``bench/results/<name>.{json,md}`` (``busy-silences`` by default)."""
    version = os.environ.get("BENCH_VERSION", "this checkout")
    rows = measure(repeat)
    text = report(repeat, rows, version)
    print(text)
    data = {"repeat": repeat, "version": version, "silence_s": SILENCE_S, "options": list(SCALED), "runs": rows}
    print(f"results: {write_results(name or 'busy-silences', data, text)}")
