"""The restart policy, scripted: sequences of attempt outcomes in, the supervisor's decisions out (milliseconds).

As torchelastic tests its agent by scripting worker-state sequences, these run
``decide`` the way the supervisor loop does: count the outcome, decide, carry
the counters on, stop at the first decision that is not a restart. The real
supervisor against real faults is tests/supervise/test_supervisor.py.
"""

from __future__ import annotations

from typing import List, Sequence

import pytest

from trainbox.diagnose.causes import Cause
from trainbox.supervise.policy import (
    NO_BEAT_ATTEMPTS,
    NO_PROGRESS_READ,
    REPEATED_CRASH,
    RETRIES,
    CauseStreak,
    Counters,
    Decision,
    Outcome,
    OutcomeKind,
    Retry,
    Verdict,
    backoff_s,
    decide,
    position,
    retry_for,
)
from trainbox.supervise.settings import SupervisorSettings

SETTINGS = SupervisorSettings(max_restarts=10, backoff_s=2.0, backoff_max_s=60.0)


def crash(beats: int) -> Outcome:
    return Outcome(OutcomeKind.EXITED, code=1, beats=beats)


def stall(beats: int) -> Outcome:
    return Outcome(OutcomeKind.STALLED, beats=beats)


def completed(beats: int = 5) -> Outcome:
    return Outcome(OutcomeKind.EXITED, code=0, beats=beats)


def stopped(beats: int = 5) -> Outcome:
    return Outcome(OutcomeKind.STOPPED, beats=beats)


def script(outcomes: Sequence[Outcome], settings: SupervisorSettings = SETTINGS) -> List[Decision]:
    """The decisions for ``outcomes`` in order, as the supervisor loop takes them."""
    counters, decisions = Counters(), []
    for outcome in outcomes:
        decision = decide(outcome, counters.counted(outcome), settings)
        decisions.append(decision)
        counters = decision.counters
        if decision.verdict is not Verdict.RESTART:
            break
    return decisions


def verdicts(decisions: Sequence[Decision]) -> List[Verdict]:
    return [d.verdict for d in decisions]


def delays(decisions: Sequence[Decision]) -> List[float]:
    return [d.delay_s for d in decisions if d.verdict is Verdict.RESTART]


def test_a_run_that_completes_or_is_stopped_ends_there() -> None:
    assert verdicts(script([completed()])) == [Verdict.SUCCEEDED]
    assert verdicts(script([completed(beats=0)])) == [Verdict.SUCCEEDED], "exit 0 without a beat is still success"
    assert verdicts(script([stopped(beats=0)])) == [Verdict.STOPPED], "a stop is never a configuration error"
    assert verdicts(script([crash(0), stopped(0)])) == [Verdict.RESTART, Verdict.STOPPED]
    assert script([stopped()])[0].counters == Counters()


def test_crashes_and_stalls_restart_and_are_counted() -> None:
    decisions = script([crash(5), stall(7), completed()])
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.RESTART, Verdict.SUCCEEDED]
    assert decisions[-1].counters.published() == {"restarts": 2, "stalls": 1, "crashes": 1, "redone_steps": 0}


def test_no_beat_rule_two_attempts_in_a_row_without_a_beat_is_misconfigured() -> None:
    assert NO_BEAT_ATTEMPTS == 2
    decisions = script([crash(0), crash(0)])
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.MISCONFIGURED]
    assert decisions[-1].counters.restarts == 1
    assert verdicts(script([stall(0), crash(0)]))[-1] is Verdict.MISCONFIGURED, "a startup stall counts too"


def test_no_beat_streak_is_broken_by_any_beat() -> None:
    decisions = script([crash(0), crash(1), crash(0), stall(3), crash(0), completed()])
    assert verdicts(decisions) == [Verdict.RESTART] * 5 + [Verdict.SUCCEEDED]
    assert [d.counters.no_beat_streak for d in decisions[:-1]] == [1, 0, 1, 0, 1]


def test_no_beat_rule_comes_before_the_restart_budget() -> None:
    settings = SupervisorSettings(max_restarts=1)
    assert verdicts(script([crash(0), crash(0)], settings)) == [Verdict.RESTART, Verdict.MISCONFIGURED]


@pytest.mark.parametrize("max_restarts", [0, 1, 3])
def test_gives_up_when_the_restart_budget_is_spent(max_restarts: int) -> None:
    settings = SupervisorSettings(max_restarts=max_restarts)
    decisions = script([crash(4), stall(4)] * 5, settings)
    assert verdicts(decisions) == [Verdict.RESTART] * max_restarts + [Verdict.GAVE_UP]
    assert decisions[-1].counters.restarts == max_restarts
    counts = decisions[-1].counters
    assert counts.stalls + counts.crashes == max_restarts + 1


def test_backoff_rule_doubles_per_quick_failure_up_to_the_cap() -> None:
    settings = SupervisorSettings(max_restarts=10, backoff_s=2.0, backoff_max_s=20.0)
    quick = [crash(1), stall(0), crash(1), stall(1), crash(0), crash(1), crash(1)]
    assert delays(script(quick, settings)) == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0, 20.0]
    assert [backoff_s(n, settings) for n in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]


def test_backoff_starts_over_after_a_run_that_beat_more_than_once() -> None:
    decisions = script([crash(1), crash(1), crash(2), crash(1), stall(9), completed()])
    assert delays(decisions) == [2.0, 4.0, 2.0, 4.0, 2.0]
    assert [d.counters.failures for d in decisions[:-1]] == [1, 2, 1, 2, 1]


def test_zero_backoff_restarts_at_once() -> None:
    settings = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0)
    assert delays(script([crash(1), crash(1), crash(5)], settings)) == [0.0, 0.0, 0.0]


def test_outcome_kinds_are_the_words_events_jsonl_uses() -> None:
    assert [k.value for k in OutcomeKind] == ["exited", "stalled", "stopped", "moved", "slow"]
    assert crash(0).crashed and not completed().crashed and not stall(0).crashed
    assert not Outcome(OutcomeKind.SLOW, beats=40).crashed and Counters().counted(Outcome(OutcomeKind.SLOW)) == Counters()
    assert not Outcome(OutcomeKind.EXITED).crashed, "no exit status yet is not a crash"
    assert Counters().counted(completed()) == Counters() == Counters().counted(stopped())


def stall_at(at: str, cause: str = "idle", beats: int = 5) -> Outcome:
    return Outcome(OutcomeKind.STALLED, beats=beats, detail={"at": at, "cause": cause})


def test_repeat_rule_the_same_stall_twice_on_the_last_rung_gives_up_at_once() -> None:
    here = position({"phase": "train", "epoch": 3, "batch": 17, "step": 90}, "safe")
    assert here == "phase train, epoch 3 batch 17, profile safe"
    decisions = script([stall_at(here), stall_at(here)])
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.GAVE_UP]
    assert decisions[-1].counters.restarts == 1, "the remaining restarts are not spent"
    assert decisions[-1].reason == f"stalls again at {here} (cause idle) with nothing left to try"


def test_repeat_rule_needs_the_same_place_in_a_row_and_no_rung_left() -> None:
    a, b = position({"phase": "train", "step": 40}), position({"phase": "train", "step": 41})
    assert a == "phase train, step 40"
    assert verdicts(script([stall_at(a), stall_at(b), stall_at(a), completed()])) == [Verdict.RESTART] * 3 + [Verdict.SUCCEEDED]
    assert verdicts(script([stall_at(a), crash(5), stall_at(a), completed()]))[-1] is Verdict.SUCCEEDED, "a crash between"
    counters = Counters()
    for last_rung in (False, False, True):  # the planner still had a rung to try, twice; then none
        decision = decide(stall_at(a), counters.counted(stall_at(a)), SETTINGS, last_rung)
        counters = decision.counters
    assert decision.verdict is Verdict.GAVE_UP and counters.restarts == 2
    assert position(None) is None and position({}) is None, "before the first beat the no-beat rule applies"


def test_a_place_says_what_the_beat_says() -> None:
    assert position({"phase": "train", "epoch": 2, "step": 40}) == "phase train, epoch 2 step 40", "no 'batch ?'"
    assert position({"epoch": 3}) == "epoch 3"
    assert position({"batch": 5, "step": 9}) == "epoch ? batch 5"
    assert position({"phase": "val"}) == "phase val"


def test_no_beat_rule_an_attempt_whose_output_ran_is_a_run_without_readable_progress() -> None:
    ran = Outcome(OutcomeKind.STALLED, output_works=True)
    assert verdicts(script([ran, ran])) == [Verdict.RESTART, Verdict.GAVE_UP]
    assert script([ran, ran])[-1].reason == NO_PROGRESS_READ
    assert verdicts(script([ran, stall(0)])) == [Verdict.RESTART, Verdict.MISCONFIGURED], "the last attempt's output says"
    assert verdicts(script([stall(0), crash(0)])) == [Verdict.RESTART, Verdict.MISCONFIGURED]


def test_restart_budget_reason() -> None:
    decisions = script([crash(4), crash(4)], SupervisorSettings(max_restarts=1))
    assert decisions[-1].reason == "restart budget spent"


def test_retry_table_covers_every_cause_and_repeats_its_last_entry() -> None:
    assert set(RETRIES) == set(Cause)
    assert [retry_for("gpu_wait", n) for n in range(3)] == [Retry.GPU_RELEASE, Retry.NATIVE, Retry.NATIVE]
    assert [retry_for("busy_python", n) for n in range(3)] == [Retry.SAME, Retry.LADDER, Retry.LADDER]
    assert retry_for(None, 0) is retry_for("gibberish", 4) is Retry.LADDER
    assert retry_for("idle", 0, {"idle": [Retry.SAME]}) is Retry.SAME
    streak = CauseStreak()
    assert [streak.count(c) for c in ("idle", "idle", "gpu_wait", "idle", "idle", "idle")] == [0, 1, 0, 0, 1, 2]


def test_a_slow_restart_is_a_restart_that_made_progress() -> None:
    """``--on-slow restart`` ended an attempt that beat many times: the first delay, and one restart of the budget."""
    slow = Outcome(OutcomeKind.SLOW, beats=400, detail={"suspect": "memory"})
    decisions = script([slow, slow, slow], SupervisorSettings(max_restarts=2, backoff_s=2.0, backoff_max_s=60.0))
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.RESTART, Verdict.GAVE_UP]
    assert delays(decisions) == [2.0, 2.0]
    assert decisions[-1].reason == "restart budget spent"
    assert decisions[-1].counters.stalls == decisions[-1].counters.crashes == 0


def named_crash(exception: str, at: str = "at step 3", beats: int = 3) -> Outcome:
    return Outcome(OutcomeKind.EXITED, code=1, beats=beats, detail={"exception": exception, "crash_at": at})


def test_a_crash_that_repeats_word_for_word_at_the_same_place_gives_up_on_the_second() -> None:
    same = [named_crash("RuntimeError: operator torchvision::nms does not exist") for _ in range(5)]
    decisions = script(same)
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.GAVE_UP]
    assert decisions[-1].reason == f"{REPEATED_CRASH} at step 3"
    before = [named_crash("ImportError: x", at="before any progress", beats=1) for _ in range(2)]
    assert verdicts(script(before)) == [Verdict.RESTART, Verdict.GAVE_UP], "before any progress counts as one place"


def test_a_crash_that_differs_or_moves_or_has_no_exception_line_is_retried_as_before() -> None:
    differing = [named_crash(f"RuntimeError: flaky {n}") for n in range(4)]
    assert verdicts(script(differing)) == [Verdict.RESTART] * 4
    moving = [named_crash("RuntimeError: same", at=f"at step {n}") for n in range(4)]
    assert verdicts(script(moving)) == [Verdict.RESTART] * 4, "a resumed run that got further is not a repeat"
    assert verdicts(script([crash(3)] * 4)) == [Verdict.RESTART] * 4, "a crash without an exception line has no name"
    between = [named_crash("E: a"), stall(3), named_crash("E: a")]
    assert verdicts(script(between)) == [Verdict.RESTART] * 3, "two crashes in a row, not two crashes"


def test_a_repeated_crash_with_another_rung_to_try_is_retried_there() -> None:
    counters = decide(named_crash("E: a"), Counters(), SETTINGS).counters
    assert decide(named_crash("E: a"), counters, SETTINGS, last_rung=False).verdict is Verdict.RESTART


def transient_crash(beats: int = 3, at: str = "at step 20") -> Outcome:
    exception = "ConnectionResetError: [Errno 104] Connection reset by peer"
    return Outcome(OutcomeKind.EXITED, code=1, beats=beats, detail={"exception": exception, "crash_at": at, "transient": True})


def test_a_transient_crash_is_never_the_same_crash_and_backs_off_more_each_time() -> None:
    """An upload that fails for a few seconds at step 20: the same line at the same place, but retried (the third try
    passes), each wait longer than the one before, and within --max-restarts."""
    decisions = script([transient_crash(), transient_crash(beats=2), completed()], SupervisorSettings(max_restarts=5))
    assert verdicts(decisions) == [Verdict.RESTART, Verdict.RESTART, Verdict.SUCCEEDED]
    assert decisions[-1].counters.restarts == 2 and decisions[-1].counters.crashes == 2
    spent = script([transient_crash(beats=5)] * 9, SupervisorSettings(max_restarts=5, backoff_s=2.0, backoff_max_s=60.0))
    assert verdicts(spent) == [Verdict.RESTART] * 5 + [Verdict.GAVE_UP] and spent[-1].reason == "restart budget spent"
    assert delays(spent) == [2.0, 4.0, 8.0, 16.0, 32.0], "growing, though each attempt made progress"
    assert delays(script([transient_crash(), crash(5)])) == [2.0, 2.0], "a crash of another kind starts over"


def test_a_transient_crash_before_the_first_beat_is_no_configuration_error() -> None:
    """A download refused at start-up twice says nothing of the command; only the restart budget ends it."""
    early = [transient_crash(beats=0, at="before any progress")] * 3
    assert verdicts(script(early, SupervisorSettings(max_restarts=2))) == [Verdict.RESTART] * 2 + [Verdict.GAVE_UP]
    assert verdicts(script([transient_crash(beats=0), crash(0), crash(0)]))[-1] is Verdict.MISCONFIGURED
