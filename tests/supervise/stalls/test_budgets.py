"""train/supervise/stalls/budgets.py: which budget applies, and a declared timeout cannot switch detection off."""

from __future__ import annotations

import math

import pytest

from trainbox.supervise.stalls.budgets import MAX_DECLARED_S, Budget, BudgetPolicy, rounded_up


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
