"""Slurm's warning: a checkpoint written since it, as any node's state.json tells (untrusted), and the status."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from hypothesis import given, settings

from tests.rundir import hostile
from trainbox.errors import ExitCode
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.slurm.warning import Warning, saved_since

WARNED = 1_000.0


def test_a_checkpoint_after_the_warning_is_seen_in_a_beat_or_in_the_newest_file() -> None:
    assert saved_since({"heartbeat": {"checkpoint_ts": WARNED + 1}}, WARNED)
    assert saved_since({"checkpoint": {"path": "x.pt", "mtime": WARNED + 1, "step": 3}}, WARNED)


def test_one_from_before_the_warning_is_not_the_next() -> None:
    assert not saved_since({"heartbeat": {"checkpoint_ts": WARNED - 1}, "checkpoint": {"mtime": WARNED}}, WARNED)
    assert not saved_since({"heartbeat": {"epoch": 3}}, WARNED)


@settings(max_examples=200, deadline=None)
@given(hostile.json_values())
def test_any_state_json_gives_an_answer_and_no_exception(state: Any) -> None:
    assert saved_since(state, WARNED) in (True, False)
    assert saved_since({"heartbeat": state, "checkpoint": state}, WARNED) in (True, False)


def test_the_stop_the_warning_made_exits_for_a_requeue_and_nothing_else_changes(tmp_path: Path) -> None:
    warning = Warning(RunDir(tmp_path / "node-0"), JobDir(tmp_path))
    assert warning.status(ExitCode.for_signal(signal.SIGTERM)) == 143, "not warned: a stop is a stop"
    warning.warned_at = WARNED
    assert warning.status(ExitCode.for_signal(signal.SIGTERM)) == ExitCode.INTERRUPTED
    assert warning.status(ExitCode.OK) == ExitCode.OK, "finished before the next checkpoint: completed"
    assert warning.status(ExitCode.HUNG) == ExitCode.HUNG
