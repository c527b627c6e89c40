"""The test suite's own background supervisors (tests/supervised.py's spawn) end with it when it is interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.paths import FIXTURES, REPO
from tests.supervised import cli_env, survivors, wait_for

RUNS = ("own-session", "own-group", "cli")


def of_run(run: Path) -> List[psutil.Process]:
    """The run's supervisor (its command line names the run) and what it started (their environment does)."""
    found = survivors(run)
    for process in psutil.process_iter():
        try:
            if str(run) in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE and process not in found:
                found.append(process)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("workers", [["-n", "0"], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_test_run_stopped_with_ctrl_c_leaves_no_supervisor_running(tmp_path: Path, workers: List[str]) -> None:
    """Ctrl-C (SIGINT to the foreground group) while a module fixture's supervisors train: none is left after 30 s."""
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers]
    env = dict(cli_env(), INTERRUPTED_BASE=str(tmp_path))
    pytest_run = subprocess.Popen(
        [*inner, str(FIXTURES / "interrupted" / "supervising.py")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal of its own: its Ctrl-C reaches its group alone
    )
    runs = [tmp_path / name for name in RUNS]
    try:
        wait_for(lambda: all(len(of_run(run)) >= 2 for run in runs), 120, "each supervisor and its child")
        os.killpg(pytest_run.pid, signal.SIGINT)
        pytest_run.wait(timeout=60)
        wait_for(lambda: not any(of_run(run) for run in runs), 30, "every supervisor and child of the run to end")
    finally:
        with_group = [pytest_run.pid] if pytest_run.poll() is None else []
        for pid in with_group:
            os.killpg(pid, signal.SIGKILL)
        for run in runs:
            for leftover in of_run(run):
                leftover.kill()
