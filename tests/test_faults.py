"""trainbox.faults' ``chance=P``: a random hang at a set rate, and the same hangs again for the same seed."""

from __future__ import annotations

import pytest

from trainbox import faults


def fired(spec: str, monkeypatch: pytest.MonkeyPatch, seed: str = "0", steps: int = 2000) -> list:
    monkeypatch.setenv(faults.FAULT_ENV, spec)
    monkeypatch.setenv(faults.SEED_ENV, seed)
    (fault,) = faults.parse(spec)
    return [step for step in range(steps) if fault.matches("step", {"attempt": "0", "step": step})]


def test_chance_fires_at_its_rate_and_the_same_steps_for_the_same_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = fired("sleep@step,chance=5", monkeypatch)
    assert 60 <= len(hung) <= 140, "about 5 % of 2000 calls"
    assert fired("sleep@step,chance=5", monkeypatch) == hung, "repeatable"
    assert fired("sleep@step,chance=5", monkeypatch, seed="1") != hung, "another seed, other steps"
    assert set(fired("sleep@step,chance=5,step>=1000", monkeypatch)) == {s for s in hung if s >= 1000}
    assert fired("sleep@step,chance=0", monkeypatch) == [] and len(fired("sleep@step,chance=100", monkeypatch)) == 2000
