"""train/supervise/stalls/budgets.py: which budget applies, and a declared timeout cannot switch detection off."""

from __future__ import annotations

import math

import pytest

from trainbox.supervise.stalls.budgets import MAX_DECLARED_S, Budget, BudgetPolicy, counting, rounded_up


def policy() -> BudgetPolicy:
    return BudgetPolicy(startup_s=600, stall_s=300, factor=3, floor_s=60, min_samples=20)


@pytest.mark.parametrize(
    "declared, expected",
    [
        (1800, Budget("phase:val", 1800.0)),
        (math.inf, Budget("phase:val", MAX_DECLARED_S)),
        (1e308, Budget("phase:val", MAX_DECLARED_S)),
        (math.nan, Budget("stall", 300.0)),
        (-5, Budget("stall", 300.0)),
        (True, Budget("stall", 300.0)),
        ("1800", Budget("stall", 300.0)),
    ],
)
def test_declared_timeouts_are_finite(declared: object, expected: Budget) -> None:
    assert policy().current({"phase": "val", "timeout": declared}) == expected


def test_no_beat_yet_is_the_startup_budget() -> None:
    assert policy().current(None) == Budget("startup", 600.0)


@pytest.mark.parametrize(
    "seconds, places, recorded",
    [(2.0004, 3, 2.001), (2.0, 3, 2.0), (10.04, 1, 10.1), (10.3, 1, 10.3), (10.0, 1, 10.0), (4.03, 3, 4.03), (0.0, 3, 0.0)],
)
def test_a_silence_past_its_bound_is_recorded_past_it(seconds: float, places: int, recorded: float) -> None:
    """2.0004 s past a 2 s budget reads 2.001, not 2.0; a value already on the step stays, float noise (4.03) included."""
    assert rounded_up(seconds, places) == recorded


def _bar(step: int, total: int = 40, **more: object) -> dict:
    return {"phase": "train", "step": step, "steps": total, "pattern": "tqdm", **more}


def _learn(policy: BudgetPolicy, intervals: list, total: int = 40) -> None:
    for step, silent in enumerate(intervals):
        policy.observe(_bar(step, total), silent, _bar(step + 1, total))


def test_a_learned_budget_judges_only_a_counter_still_counting() -> None:
    """Mid-bar: learned. After the bar's last step, the first reading of a new bar, a new phase or a new epoch, a beat
    with no counter: the plain budget (the silence there is an evaluation, a save, a re-scan)."""
    learned = policy()
    _learn(learned, [1.0] * 25)
    assert counting(_bar(20), _bar(21)) and learned.current(_bar(21), counting=True) == Budget("learned:train", 60.0, busy_s=300)
    assert not counting(_bar(39), _bar(40)), "the bar reached its total"
    assert not counting(_bar(40), _bar(0)), "a new bar (the count starts again)"
    assert not counting(_bar(5), _bar(1, 10)), "another bar (another total)"
    assert not counting(_bar(5), _bar(6, phase="val")), "a new phase"
    assert not counting({"epoch": 1, "batch": 9, "batches": 9}, {"epoch": 2, "batch": 1, "batches": 9})
    assert counting({"epoch": 2, "batch": 1, "batches": 9}, {"epoch": 2, "batch": 2, "batches": 9})
    assert not counting({"phase": "train"}, {"phase": "train", "loss": 0.1}), "no counter"
    assert counting({"step": 7}, {"step": 8}), "a counter with no total counts until another one shows"


def test_only_steps_of_one_counter_are_learned() -> None:
    """The gap from one bar's end to the next bar's first step (90 s of evaluation) is no step of a bar."""
    learned = policy()
    _learn(learned, [1.0] * 19)
    learned.observe(_bar(40), 90.0, _bar(0))
    learned.observe(_bar(40), 90.0, _bar(1, phase="val"))
    assert learned.rhythm["train"].samples == 19 and learned.rhythm["train"].longest_s == 1.0


@pytest.mark.parametrize(
    "intervals, expected",
    [
        ([2.0] * 4, None),  # too few to learn from
        ([2.0] * 5, 60.0),  # steady: learned at 5 (3 x 2 s x 20/5 = 24 s: the floor)
        ([10.0] * 5, 120.0),  # steps 10 s apart: the margin x4 at 5 of 20 intervals (3 x 10 x 20/5)
        ([10.0] * 10, 60.0),  # ... x2 at 10 of 20 (3 x 10 x 2)
        ([30.0] * 5, None),  # 3 x 30 x 4 = 360 s: not below the 300 s stall budget, so not in force
        ([0.5, 0.5, 0.5, 0.5, 9.0], None),  # not steady: the full count is awaited
        ([9.0] * 4 + [0.5] * 16, 60.0),  # the full count: learned as before, whatever the steadiness
    ],
)
def test_a_steady_counter_is_learned_sooner(intervals: list, expected: object) -> None:
    learned = policy()
    _learn(learned, intervals)
    assert learned.learned().get("train") == expected


def test_a_bar_nested_in_the_main_one_counts_on_its_own() -> None:
    """A save's or an evaluation's bar inside the training bar (its beats keep the main place, ``side_step`` apart):
    its own steps are a counter; its last one, and the main bar's next step after it, are not steps of one counter."""
    main = {"phase": "train", "step": 50, "steps": 100, "pattern": "tqdm", "counter": "tqdm::100"}
    save = dict(main, side_step=0, side_total=1, counter="tqdm:Writing model shards:1")
    saved = dict(save, side_step=1)
    evaluating = dict(main, phase="val", side_step=3, side_total=10, counter="tqdm::10")
    assert not counting(main, save) and not counting(save, saved), "a new bar; then a bar at its total"
    assert not counting(saved, dict(main, step=51)), "back to the main bar: its first reading after the save"
    assert counting(evaluating, dict(evaluating, side_step=4)) and not counting(evaluating, dict(evaluating, side_step=10))


def _in_force(intervals: int = 25) -> BudgetPolicy:
    """A policy that learned a 60 s budget (the floor) for the train bar."""
    learned = policy()
    _learn(learned, [1.0] * intervals)
    return learned


def test_a_learned_budget_is_a_suspicion_a_busy_tree_may_outlast_until_the_stall_budget() -> None:
    assert _in_force().current(_bar(21), counting=True) == Budget("learned:train", 60.0, busy_s=300.0)
    assert policy().current({"phase": "val", "timeout": 1800}).busy_s is None, "a program's own timeout is a verdict"
    assert policy().current(None).busy_s is None and policy().current(_bar(39)).busy_s is None


def test_long_silences_between_steps_are_kept_apart_from_the_rhythm_and_bound_their_repeats() -> None:
    """An evaluation of 70 s between two steps, twice: the rhythm stays 1 s (the floor still judges an idle hang), and
    the next busy silence there is judged at 3 x 70 s rather than the 300 s stall budget."""
    learned = _in_force()
    learned.observe(_bar(24), 70.0, _bar(25))
    assert learned.rhythm["train"].longest_s == 1.0 and learned.earlier_s("train") is None, "once is not a habit"
    assert learned.current(_bar(26), counting=True) == Budget("learned:train", 60.0, busy_s=300.0)
    learned.observe(_bar(29), 68.0, _bar(30))
    assert learned.current(_bar(31), counting=True) == Budget("learned:train", 60.0, busy_s=210.0, by_earlier=True)
    assert learned.learned() == {"train": 60.0}


def test_earlier_silences_never_allow_more_than_the_stall_budget() -> None:
    learned = _in_force()
    for step in (24, 29):
        learned.observe(_bar(step), 150.0, _bar(step + 1))
    assert learned.current(_bar(31), counting=True) == Budget("learned:train", 60.0, busy_s=300.0)


def _percent(**more: object) -> dict:
    return {"phase": "train", "pattern": "percent", "counter": "percent:train", "timeout": MAX_DECLARED_S, **more}


def test_a_bars_declared_budget_is_a_suspicion_and_a_given_stall_timeout_bounds_it() -> None:
    """A percentage-only bar declares a day before its first percent: the --stall-timeout the user gave bounds it."""
    assert policy().current(_percent()) == Budget("phase:train", MAX_DECLARED_S)
    bounded = BudgetPolicy(startup_s=600, stall_s=10, factor=3, floor_s=60, min_samples=20, bound_s=10)
    assert bounded.current(_percent()) == Budget("phase:train", 10.0)
    assert policy().current(_percent(timeout=120.0)) == Budget("phase:train", 120.0, busy_s=300.0)
