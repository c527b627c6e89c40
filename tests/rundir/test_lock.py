"""trainbox.rundir.lock: one supervisor per run directory, tried with a real second supervisor."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.supervised import faulty_child, start_cli, train_cli, wait_for
from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir

FAST = ["--startup-timeout", "10", "--stall-timeout", "5", "--grace", "1", "--backoff", "0.1", "--quiet"]


def test_second_supervisor_on_a_run_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    # A child that outlives any start-up of the second supervisor (a loaded machine takes seconds to import), ended
    # by SIGTERM once the refusal is checked: the test does not depend on how fast anything starts.
    first = start_cli(
        ["supervise", "--run-dir", str(tmp_path), *FAST, "--", *faulty_child("--steps", "100000", "--interval", "0.05")]
    )
    try:
        wait_for(lambda: run.state.exists() and json.loads(run.state.read_text())["state"] == "running", 30, "the first run")
        events_before = run.events.read_bytes()
        # The same command: another one's would be refused for the run it holds (trainbox.rundir.owner), not the lock.
        second = train_cli(["supervise", "--run-dir", str(tmp_path), *FAST, "--", *faulty_child("--steps", "1")], tmp_path)
        events_after = run.events.read_bytes()
    finally:
        first.send_signal(signal.SIGTERM)
        code = first.wait(timeout=60)

    assert second.code == 2
    assert len(second.stderr.splitlines()) == 1, second.stderr
    assert f"pid {first.pid}" in second.stderr and str(tmp_path) in second.stderr
    assert events_after == events_before, "the refused supervisor wrote nothing"
    assert code == ExitCode.for_signal(signal.SIGTERM)
    assert [json.loads(line)["event"] for line in run.events.read_text().splitlines()] == ["start", "exit"]


def test_the_lock_is_free_again_after_the_supervisor_ends(tmp_path: Path) -> None:
    for _ in range(2):
        started = time.monotonic()
        done = train_cli(["supervise", "--run-dir", str(tmp_path), *FAST, "--", *faulty_child("--steps", "2")], tmp_path)
        assert done.code == 0, done.stderr
        assert time.monotonic() - started < 60
