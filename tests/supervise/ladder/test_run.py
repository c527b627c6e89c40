"""The ladder's ledger (what each rung measured on this run) in milliseconds, and one real run that climbs back.

The loop's decisions with scripted attempts are in test_loop.py (``test_the_ladder_stays_on_...``); the policy's
rules on scripted histories in test_ladder_policy.py. Here: what the ledger measures from an attempt's beats, that
untrusted beats cannot break it, and a real ``supervise --ladder FILE`` run with a hang injected on the fast rung.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

from tests.supervised import faulty_child, train_cli
from trainbox.supervise.ladder.command import CommandLadder
from trainbox.supervise.ladder.command import Rung as FileRung
from trainbox.supervise.ladder.policy import PolicyName, Rung
from trainbox.supervise.ladder.run import RungLedger, training
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome, OutcomeKind
from trainbox.supervise.settings import SupervisorSettings

RUNGS = (Rung("fast"), Rung("safe", 0.5))


def attempt(first: int, last: int, seconds: float, beat: Optional[Dict[str, Any]] = None, **fields: Any) -> Outcome:
    """An attempt launched at 1000 that took 2 s to its first step ``first`` and trained to ``last`` in ``seconds``."""
    outcome = Outcome(OutcomeKind.STALLED, started_ts=1000.0, first_step=first, first_step_ts=1002.0, **fields)
    outcome.last_beat = {"phase": "train", "step": last, "total_steps": 1000, **(beat or {})}
    outcome.last_beat_ts = 1002.0 + seconds
    return outcome


def test_the_ledger_measures_rate_restart_and_what_a_stall_cost() -> None:
    ledger = RungLedger(RUNGS, clock=lambda: 1040.0)
    stalled = attempt(200, 500, 30.0, checkpoint_ts=1022.0)
    stalled.detail["silent_s"] = 5.0
    assert training(stalled) == (300.0, 30.0)
    ledger.stalled("fast", stalled)
    history = ledger.situation("fast", stalled.last_beat).history["fast"]
    assert history.rate == 10.0 and math.isclose(history.hours, 30 / 3600)
    (stall,) = history.stalls
    assert (stall.at, stall.step, stall.phase) == ("phase train, step 500", 500, "train")
    # silent 5 s; handled: 1040 - 1032 - 5 = 3 s, plus the run's restart (2 s); redone since the checkpoint: 10 s
    assert (stall.silent_s, stall.handling_s, stall.redone_s) == (5.0, 5.0, 10.0)
    situation = ledger.situation("fast", stalled.last_beat)
    assert (situation.remaining_steps, situation.restart_s, situation.policy) == (500, 2.0, PolicyName.COST)


def test_a_child_that_says_no_total_is_weighed_on_the_work_done_and_the_event_says_so() -> None:
    ledger = RungLedger(RUNGS, clock=lambda: 1040.0)
    outcome = attempt(0, 100, 10.0, beat={"total_steps": None})
    ledger.stalled("fast", outcome)
    ledger.after_stall("fast", outcome)
    assert ledger.decided_by is PolicyName.COST and ledger.situation("fast", outcome.last_beat).remaining_steps == 100
    assert ledger.lacked() == ["total_steps", "checkpoint_ts"]
    assert "the work left taken as the 100 steps done (no total_steps" in ledger.lacking_words(outcome.last_beat)
    ledger.commit("fast", attempt(0, 100, 10.0, beat={"total_steps": None}, checkpoint_ts=1005.0))
    assert ledger.lacked() == ["total_steps"] and "epoch" not in ledger.lacking_words(outcome.last_beat)
    without_step = attempt(0, 0, 10.0, beat={"step": None, "total_steps": None})
    ledger.stalled("fast", without_step)
    ledger.after_stall("fast", without_step)
    assert ledger.decided_by is PolicyName.DOWN, "no count of work at all: nothing to weigh"


def test_an_epoch_that_moves_on_stands_for_a_checkpoint_until_one_is_told() -> None:
    outcome = Outcome(OutcomeKind.EXITED)
    said = [outcome.saw(beat, float(at)) for at, beat in enumerate([{"epoch": 0}, {"epoch": 0.5}, {"epoch": 1}, {"step": 3}])]
    assert said == [False, False, True, False]
    said = [outcome.saw(beat, 9.0) for beat in ({"epoch": 2, "checkpoint_ts": 5.0}, {"epoch": 3}, {"epoch": True})]
    assert said == [True, False, False], "once a checkpoint time is told, only checkpoint times count"


def test_untrusted_beats_are_ignored_not_believed() -> None:
    ledger = RungLedger(RUNGS, clock=lambda: 1040.0)
    for bad in ("300", None, math.nan, math.inf, True, [1]):
        outcome = attempt(0, 0, 10.0, beat={"step": bad, "total_steps": bad, "phase": bad})
        outcome.detail["silent_s"] = bad
        ledger.stalled("fast", outcome)
        ledger.after_stall("fast", outcome)
    assert ledger.worked["fast"].steps == 0 and ledger.total is None
    assert all(s.cost_s >= 0 and s.step is None for s in ledger.worked["fast"].stalls)


def test_a_run_hung_twice_at_one_place_on_fast_steps_down_then_probes_fast_again(tmp_path: Path) -> None:
    """Real processes: fast hangs at step 30 every time (trainbox.faults); the policy stays once (one stall is
    cheap), steps down when the same place hangs again, and probes fast from a checkpoint on safe past step 30."""
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(
        "rungs:\n"
        '  - {name: fast, args: ["--interval", "0.02"], env: {TRAIN_FAULT: "sleep@step,step=30"}}\n'
        '  - {name: safe, args: ["--interval", "0.08"], expected_speed: 0.25}\n'
    )  # safe 4x slower: the probe pays, and its wait is served, on a loaded machine too (at 2x it was not, once)
    run_dir = tmp_path / "run"
    # A 3 s stall budget: at 1 s, a checkpoint write waiting 1.3 s on a disk busy with CI's image builds was a stall
    # on safe (io_wait, submit_bio_wait), and the run saw one move more than the hangs make.
    budgets = ["--stall-timeout", "3", "--startup-timeout", "30", "--backoff", "0", "--backoff-max", "0", "--grace", "1"]
    child = faulty_child("--steps", "600", "--save-every", "20", "--checkpoint", str(tmp_path / "checkpoint"))
    done = train_cli(
        ["supervise", "--run-dir", str(run_dir), "--ladder", str(ladder), *budgets, "--", *child], run_dir, timeout=120
    )
    assert done.code == 0, done.stderr
    moves = [(e["event"], e["previous_profile"], e["profile"], e["ladder"]["kind"]) for e in done.events if e.get("ladder")]
    assert moves == [
        ("restart", "fast", "fast", "stay"),
        ("restart", "fast", "safe", "down"),
        ("probe", "safe", "fast", "probe"),
    ], done.stderr
    assert [e["profile"] for e in done.of("start")] == ["fast", "fast", "safe", "fast"]
    assert done.of("exit")[0]["stalls"] == 2 and (tmp_path / "checkpoint").read_text() == "600"
    assert "banned here" in done.of("restart")[1]["reason"] and "probing fast" in done.of("probe")[0]["reason"]
    status = train_cli(["status", "--run-dir", str(run_dir)], run_dir)
    assert "ladder    fast (probe, --ladder-policy cost): stalls cost" in status.stdout, status.stdout


def test_a_child_that_tells_neither_its_total_nor_its_checkpoints_climbs_back_at_an_epoch_end(tmp_path: Path) -> None:
    """Real processes, as above, with beats that carry an epoch but no total_steps and no checkpoint_ts: the cost
    policy still weighs (the work left taken as the work done) and probes fast where an epoch ends past step 30."""
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(
        "rungs:\n"
        '  - {name: fast, args: ["--interval", "0.02"], env: {TRAIN_FAULT: "sleep@step,step=30"}}\n'
        '  - {name: safe, args: ["--interval", "0.08"], expected_speed: 0.25}\n'
    )
    run_dir = tmp_path / "run"
    budgets = ["--stall-timeout", "3", "--startup-timeout", "30", "--backoff", "0", "--backoff-max", "0", "--grace", "1"]
    child = faulty_child("--steps", "600", "--save-every", "20", "--epoch-steps", "20", "--untold")
    child += ["--checkpoint", str(tmp_path / "checkpoint")]
    done = train_cli(
        ["supervise", "--run-dir", str(run_dir), "--ladder", str(ladder), *budgets, "--", *child], run_dir, timeout=120
    )
    assert done.code == 0, done.stderr
    moves = [(e["event"], e["profile"], e["ladder"]["kind"]) for e in done.events if e.get("ladder")]
    assert moves[:3] == [("restart", "fast", "stay"), ("restart", "safe", "down"), ("probe", "fast", "probe")], done.stderr
    probe = done.of("probe")[0]
    assert probe["ladder"]["lacked"] == ["total_steps", "checkpoint_ts"]
    assert "no total_steps in the beats" in probe["reason"] and "probes at epoch ends" in probe["reason"]
    assert (tmp_path / "checkpoint").read_text() == "600"


def test_the_settings_reach_the_ledger_of_either_ladder() -> None:
    settings = SupervisorSettings(ladder_policy="down", deadline="2030-01-01T07:00")
    launch = Launch(argv=["train.py"], startup_timeout=10.0, stall_timeout=5.0)
    ledger = CommandLadder(launch, [FileRung(name="fast"), FileRung(name="safe", expected_speed=0.5)], settings).ledger
    assert ledger.policy is PolicyName.DOWN and ledger.deadline_ts is not None and ledger.deadline_ts > 1.8e9
    assert [(r.name, r.prior_speed) for r in ledger.rungs] == [("fast", 1.0), ("safe", 0.5)]
