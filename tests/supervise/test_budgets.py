"""train/supervise/budgets.py: which budget applies, and a declared timeout cannot switch detection off."""

from __future__ import annotations

import math

import pytest

from trainbox.supervise.budgets import MAX_DECLARED_S, Budget, BudgetPolicy


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
