"""What the child passes to Ultralytics beyond the user's arguments (train/yolo/runner.py)."""

from __future__ import annotations

import pytest
from ultralytics.utils import torch_utils

from trainbox.yolo import runner


@pytest.mark.parametrize("torch_2", [True, False], ids=["torch>=2", "torch<2"])
def test_determinism_is_asked_for_only_where_ultralytics_can_give_it(monkeypatch: pytest.MonkeyPatch, torch_2: bool) -> None:
    """The images' torch 1.13.1 would warn "Upgrade to torch>=2.0.0 for deterministic training" at every attempt."""
    monkeypatch.setattr(torch_utils, "TORCH_2_0", torch_2)
    assert runner._deterministic({}) == ({} if torch_2 else {"deterministic": False})
    assert runner._deterministic({"deterministic": True}) == {}, "the user's own choice stands"
