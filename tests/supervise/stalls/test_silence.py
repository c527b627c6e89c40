"""The silence judge, scripted: looks in, calls out, in milliseconds (the supervisor against real faults is
tests/supervise/stalls/test_stalls.py)."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from trainbox.diagnose.causes import Diagnosis
from trainbox.rundir.events import Cause
from trainbox.supervise.stalls import busy
from trainbox.supervise.stalls.budgets import Budget
from trainbox.supervise.stalls.silence import (
    Action,
    Call,
    Limits,
    Look,
    Rule,
    SilenceWatch,
    allow_line,
    extension,
    judge,
    sampling_due,
    sampling_interval,
    stall_line,
)

STARTUP = Budget("startup", 900.0)
LIMITS = Limits(idle_timeout_s=120.0, compile_cap_s=7200.0)
CC = ("cc1 running for 4 s",)


def script(
    looks: Sequence[Tuple[float, float, Tuple[str, ...]]], budget: Budget = STARTUP, limits: Limits = LIMITS
) -> List[Call]:
    """Judge (silent_s, idle_for_s, compiling) looks in order as SilenceWatch does, carrying the granted budget on."""
    granted, calls = budget.seconds, []
    for silent, idle, compiling in looks:
        call = judge(Look(silent, budget, idle, compiling), granted, limits)
        calls.append(call)
        granted = call.budget_s
        if call.action is Action.STALL:
            break
    return calls


def test_within_the_budget_a_busy_tree_is_watched() -> None:
    calls = script([(10.0, 0.0, ()), (500.0, 0.0, ()), (900.0, 0.0, ())])
    assert [c.action for c in calls] == [Action.WATCH] * 3
    assert {c.budget_s for c in calls} == {900.0}


def test_idle_is_enough_whatever_the_budget_says() -> None:
    calls = script([(30.0, 28.0, ()), (119.0, 117.0, ()), (123.0, 121.0, ())])
    assert [c.action for c in calls] == [Action.WATCH, Action.WATCH, Action.STALL]
    stall = calls[-1]
    assert stall.rule is Rule.IDLE and stall.budget_s == 900.0
    assert stall.evidence == ("whole tree idle for 121 s (--idle-timeout 120)",)


def test_idle_timeout_zero_turns_the_rule_off() -> None:
    calls = script([(800.0, 799.0, ()), (901.0, 900.0, ())], limits=Limits(0.0, 7200.0))
    assert [c.action for c in calls] == [Action.WATCH, Action.STALL]
    assert calls[-1].rule is Rule.BUDGET


def test_a_budget_that_runs_out_without_a_compile_is_a_budget_stall() -> None:
    [call] = script([(901.0, 0.0, ())])
    assert (call.action, call.rule, call.budget_s) == (Action.STALL, Rule.BUDGET, 900.0)


def test_a_compile_extends_by_one_budget_at_a_time_up_to_the_cap() -> None:
    budget = Budget("stall", 2.0)
    calls = script([(1.0, 0, CC), (2.5, 0, CC), (4.0, 0, CC), (4.6, 0, CC), (9.0, 0, CC), (10.5, 0, CC)], budget, Limits(120, 10))
    assert [c.action for c in calls] == [Action.WATCH, Action.EXTEND, Action.WATCH, Action.EXTEND, Action.EXTEND, Action.STALL]
    assert [c.budget_s for c in calls] == [2.0, 4.5, 4.5, 6.6, 10.0, 10.0]
    assert calls[1].evidence == CC, "an extension says what was compiling"
    assert calls[-1].rule is Rule.COMPILE_CAP
    assert calls[-1].evidence[0] == "still compiling after 10 s of silence (--compile-cap 10)" and CC[0] in calls[-1].evidence


def test_a_compile_that_ends_lets_the_extended_budget_run_out() -> None:
    budget = Budget("stall", 5.0)
    calls = script([(6.0, 0, CC), (10.0, 0, ()), (11.5, 0, ())], budget)
    assert [c.action for c in calls] == [Action.EXTEND, Action.WATCH, Action.STALL]
    assert calls[-1].rule is Rule.BUDGET and calls[-1].budget_s == 11.0


def test_a_cap_below_the_budget_never_shortens_it() -> None:
    calls = script([(100.0, 0, CC), (901.0, 0, CC)], limits=Limits(120, 60))
    assert [c.action for c in calls] == [Action.WATCH, Action.STALL]
    assert calls[-1].rule is Rule.COMPILE_CAP and calls[-1].budget_s == 900.0


def test_idle_wins_over_an_extended_budget() -> None:
    budget = Budget("stall", 5.0)
    calls = script([(6.0, 0, CC), (30.0, 10.0, ())], budget, Limits(10, 7200))
    assert [c.action for c in calls] == [Action.EXTEND, Action.STALL]
    assert calls[-1].rule is Rule.IDLE


def test_sampling_starts_past_one_interval_or_half_a_short_budget() -> None:
    assert not sampling_due(0.5, 900.0)
    assert sampling_due(2.5, 900.0)
    assert sampling_due(1.0, 2.0), "a 2 s budget is sampled from 1 s on, so a compile is seen before it runs out"
    assert sampling_interval(900.0) == 2.0 and sampling_interval(4.0) == 1.0, "two samples before a short budget ends"


def test_the_console_line_says_which_rule_called_the_stall() -> None:
    for rule, words in (
        (Rule.BUDGET, "silent 123.4 s > startup budget 900.0 s in phase 'setup'"),
        (Rule.IDLE, "silent 123.4 s with the whole tree idle for --idle-timeout 120 s (within its startup budget)"),
        (Rule.COMPILE_CAP, "silent 123.4 s and still compiling at --compile-cap 7200 s"),
    ):
        line = stall_line(3, 123.4, STARTUP, Call(Action.STALL, 900.0, rule), LIMITS, "setup")
        assert line.startswith("attempt 3 stalled: ") and words in line, line


class Cleared(SilenceWatch):
    """A SilenceWatch that counts how often its silence ended (no tree sampled: judging is pure bookkeeping)."""

    def __init__(self) -> None:  # the real one samples a process tree; none is needed here
        self.ended = 0
        self._judged = None

    def beat(self) -> None:
        self.ended += 1


def test_the_window_is_the_judged_silences_not_any_ranks() -> None:
    """Issue 33 item 13: only a new judged silence (another rank lags, or the lagging one made progress) ends it."""
    watch = Cleared()
    for who, silent in [(1, 1.0), (1, 1.5), (1, 2.0), (1, 2.5)]:  # rank 1 stays silent while rank 0 beats
        watch.judging(who, silent)
    assert watch.ended == 0, "rank 0's beats leave rank 1's silence alone"
    watch.judging(1, 0.1)  # rank 1 beat
    assert watch.ended == 1
    watch.judging(0, 0.3)  # now rank 0 lags
    assert watch.ended == 2
    watch.judging(None, 0.0)
    assert watch.ended == 3, "a single process: its beat ends its silence, as before"


def test_an_extension_records_its_silence_past_the_budget_it_passed() -> None:
    """Extended because 4.0004 s passed a 4 s budget: the event reads 4.001 s, never the budget itself."""
    budget = Budget("stall", 4.0)
    (call,) = script([(4.0004, 1.0, CC)], budget)
    assert call.action is Action.EXTEND
    assert extension(budget, call, 4.0004)["silent_s"] == 4.001


LEARNED = Budget("learned:train", 60.0, busy_s=300.0)
BUSY = busy.Activity(("pid 7 (python) wants 100 % CPU",), None, "evaluation?")
IDLE = busy.Activity(())
WAITING = busy.Activity(("pid 7 (python) wants 100 % CPU",), Diagnosis(Cause.GPU_WAIT, ("main thread in torch/cuda",)))


def judged(silences: Sequence[float], budget: Budget, activity: busy.Activity) -> List[Call]:
    """Judge a silence at ``silences`` as SilenceWatch does: the tree is looked at once its suspicion ran out."""
    granted, calls = budget.seconds, []
    for silent in silences:
        seen = activity if silent > granted or granted != budget.seconds else None
        calls.append(judge(Look(silent, budget, 0.0, (), seen), granted, LIMITS))
        granted = calls[-1].budget_s
        if calls[-1].action is Action.STALL:
            break
    return calls


def test_a_busy_tree_past_its_learned_budget_goes_on_until_the_stall_budget() -> None:
    """An evaluation of 75 s between two steps is no stall; a busy spin that never ends is one at the stall budget."""
    calls = judged([30.0, 61.0, 75.0, 200.0, 300.0, 301.0], LEARNED, BUSY)
    assert [c.action for c in calls] == [Action.WATCH, Action.ALLOW, Action.WATCH, Action.WATCH, Action.WATCH, Action.STALL]
    assert calls[1].budget_s == 300.0 and calls[1].evidence == BUSY.signs
    assert (calls[-1].rule, calls[-1].budget_s) == (Rule.STALL_BUDGET, 300.0)


def test_an_idle_or_waiting_tree_past_its_learned_budget_is_a_stall_at_once() -> None:
    for activity in (IDLE, WAITING):
        calls = judged([30.0, 61.0], LEARNED, activity)
        assert [c.action for c in calls] == [Action.WATCH, Action.STALL]
        assert (calls[-1].rule, calls[-1].budget_s) == (Rule.BUDGET, 60.0)
    assert judged([61.0], LEARNED, WAITING)[0].evidence == ("main thread in torch/cuda",)


def test_a_verdict_is_a_stall_busy_or_not() -> None:
    calls = judged([301.0], Budget("stall", 300.0), BUSY)
    assert (calls[-1].action, calls[-1].rule) == (Action.STALL, Rule.BUDGET)


def test_a_busy_repeat_is_judged_against_its_earlier_silences() -> None:
    """Evaluations of 70 s before: the one that runs on is judged at 210 s, and the event says by which rule."""
    calls = judged([61.0, 209.0, 211.0], Budget("learned:train", 60.0, busy_s=210.0, by_earlier=True), BUSY)
    assert [c.action for c in calls] == [Action.ALLOW, Action.WATCH, Action.STALL]
    assert (calls[-1].rule, calls[-1].budget_s) == (Rule.EARLIER, 210.0)


def test_idleness_still_ends_an_allowed_silence() -> None:
    """Busy at 61 s, then idle: the idle rule calls it at --idle-timeout, not the stall budget."""
    call = judge(Look(190.0, LEARNED, 121.0, (), BUSY), 300.0, LIMITS)
    assert (call.action, call.rule) == (Action.STALL, Rule.IDLE)


def test_the_console_lines_of_a_busy_silence() -> None:
    allowed = allow_line(2, LEARNED, Call(Action.ALLOW, 300.0, evidence=BUSY.signs), 61.0, "evaluation?")
    assert "silent 61 s, past its learned:train budget 60 s but busy (evaluation?: pid 7" in allowed
    assert "judged at 300 s (the stall budget)" in allowed
    stalled = stall_line(2, 301.0, LEARNED, Call(Action.STALL, 300.0, Rule.STALL_BUDGET), LIMITS, "train")
    assert "busy past its learned:train budget 60.0 s, > stall budget 300.0 s" in stalled
