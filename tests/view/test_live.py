"""``trainbox status --watch`` against a run in progress: on a pseudo-terminal (rich) and without one (plain lines)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pexpect
import pytest

from tests.invoked import Invoked
from tests.supervised import REPO, cli_env, start_cli, wait_for
from trainbox.rundir.layout import RunDir

#: "epoch 2/30, batch 3": what both modes say about the position.
POSITION = re.compile(r"epoch (\d+)/\d+, batch (\d+)")


@pytest.fixture
def run_in_progress(tmp_path: Path) -> Iterator[Path]:
    """A supervised run of ``tests.epochs`` that goes on longer than any watch here; stopped at the end."""
    child = [sys.executable, "-m", "tests.epochs", "--epochs", "30", "--batches", "4", "--interval", "0.3"]
    options = ["--stall-timeout", "20", "--startup-timeout", "60", "--quiet"]
    supervisor = start_cli(["supervise", "--run-dir", str(tmp_path), *options, "--", *child], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: RunDir(tmp_path).heartbeat.exists(), 60, "the run's first beat")
        yield tmp_path
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=60)


def positions(text: str) -> List[Tuple[int, int]]:
    return [(int(epoch), int(batch)) for epoch, batch in POSITION.findall(text)]


def test_watch_on_a_terminal_shows_the_batch_advancing_and_leaves_on_ctrl_c(run_in_progress: Path) -> None:
    watch = pexpect.spawn(
        sys.executable,
        ["-m", "trainbox", "status", "--watch", "--run-dir", str(run_in_progress), "--deadline", "23:59"],
        cwd=str(REPO),
        env=cli_env({"TERM": "xterm-256color", "COLUMNS": "140"}),
        dimensions=(30, 140),
        encoding="utf-8",
        timeout=30,
    )
    seen: List[Tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(set(seen)) < 3 and time.monotonic() < deadline:
        watch.expect(POSITION)
        seen.append((int(watch.match.group(1)), int(watch.match.group(2))))
    assert len(set(seen)) >= 3 and seen == sorted(seen), f"the batch did not advance: {seen}"
    for shown in ("img/s", "phase train: silent", "(stall)", "deadline", "restarts 0, stalls 0, crashes 0", "checkpoint"):
        watch.expect_exact(shown)
    watch.sendintr()
    watch.expect(pexpect.EOF, timeout=10)
    watch.close()
    assert watch.exitstatus == 0, (watch.exitstatus, watch.signalstatus, watch.before)
    assert "Traceback" not in (watch.before or "")


def test_invoke_watch_without_a_terminal_prints_plain_lines_until_ctrl_c(run_in_progress: Path) -> None:
    """Through tasks.py, started the way a script's background job is (SIGINT inherited ignored): Ctrl-C still ends it."""
    watch = Invoked(["status", "--watch", "--run-dir", str(run_in_progress)], cli_env(), sigint_ignored=True)
    # Three lines, one of them in training: a line is drawn from whatever the run is doing when the watch reads it,
    # and on a loaded machine three reads in a row once fell on setup and validation (a fifth of each epoch here).
    watch.wait_until(
        lambda: len(positions(watch.output)) >= 3 and "phase train: silent" in watch.output,
        "three status lines, one in training",
        timeout=40,
    )
    watch.interrupt(signal.SIGINT)
    assert watch.process.wait(timeout=30) == 0, watch.output
    time.sleep(0.2)  # the reader thread takes the last line
    lines = watch.output.splitlines()
    assert not any("\x1b" in line for line in lines), watch.output
    seen = positions(watch.output)
    assert len(seen) == len(lines) and seen == sorted(seen) and seen[-1] > seen[0], watch.output
    assert all("img/s" in line and ", ETA " in line and "checkpoint: " in line for line in lines), watch.output
    assert any("phase train: silent" in line for line in lines), watch.output
