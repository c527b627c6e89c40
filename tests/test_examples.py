"""examples/plain_pytorch.py: someone's own PyTorch script, supervised with one added line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.supervised import REPO, survivors, train_cli

pytestmark = pytest.mark.training  # the example trains with torch for real


def test_worker_hang_before_the_first_batch_is_caught_and_the_script_resumes(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "examples" / "plain_pytorch.py"), "--epochs", "2", "--samples", "128", "--workers", "2"]
    result = train_cli(
        [
            "supervise",
            "--run-dir",
            str(tmp_path),
            "--startup-timeout",
            "20",
            "--stall-timeout",
            "20",
            "--grace",
            "2",
            "--backoff",
            "0.5",
            "--quiet",
            "--",
            *script,
        ],
        tmp_path,
        env={"TRAIN_FAULT": "sleep@worker,attempt=0,index>=0"},
    )

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["budget"] == "startup", "the first batch never came"
    rows = json.loads((result.incident() / "processes.json").read_text())
    assert len(rows) >= 3, "the script and its two spawn-started workers"
    stacks = result.stacks()
    assert "hang_sleep" in stacks and "__getitem__" in stacks
    assert result.of("exit")[0]["beats"] > 0
    assert (tmp_path / "plain.pt").stat().st_size > 0
    assert not survivors(tmp_path)
