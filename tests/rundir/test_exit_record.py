"""Final outcomes as a container engine with ``restart: on-failure`` must see them (train/rundir/exit_record.py).

Real ``python -m trainbox`` processes, with and without the container's setting.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from trainbox.errors import ExitCode
from trainbox.rundir import exit_record
from trainbox.rundir.layout import RunDir


def trainbox(args: List[str], run_dir: Path, engine_restarts: bool) -> subprocess.CompletedProcess:
    env: Dict[str, str] = {**os.environ, "TRAIN_RUN_DIR": str(run_dir)}
    env.pop(exit_record.ENGINE_RESTARTS_ENV, None)
    if engine_restarts:
        env[exit_record.ENGINE_RESTARTS_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "trainbox", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, code",
    [
        (["run", "--profile", "safe", "nosuchkey=1"], ExitCode.USAGE),
        (["demo", "nosuchkey=1"], ExitCode.USAGE),  # the image's default command, `docker compose up`'s
        (["supervise", "--max-restarts", "0", "--backoff", "0.1", "--", sys.executable, "-c", "print('x')"], ExitCode.OK),
        (["supervise", "--max-restarts", "0", "--backoff", "0.1", "--", sys.executable, "-c", "raise SystemExit(7)"], None),
    ],
    ids=["bad-input", "demo-bad-input", "completed", "gave-up-or-misconfigured"],
)
def test_final_outcomes_reach_the_engine_as_zero_and_are_recorded(tmp_path: Path, args: List[str], code: int) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plain = trainbox(args, tmp_path / "plain", engine_restarts=False)
    real = plain.returncode if code is None else code
    assert plain.returncode == real and ExitCode.is_final(real), plain.stderr
    assert not RunDir(tmp_path / "plain").container_exit.exists()
    contained = trainbox(args, run_dir, engine_restarts=True)
    assert contained.returncode == 0, contained.stderr
    assert exit_record.recorded(run_dir, socket.gethostname()) == real
    assert exit_record.recorded(run_dir, "another-container") is None
    said = f"exit status {real} is final: reported to Docker as 0"
    assert (said in contained.stderr) == (real != 0)


def test_other_commands_and_crashes_keep_their_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``health`` is Docker's HEALTHCHECK: its 1 must stay 1. A status that is not final reaches the engine as is."""
    unhealthy = trainbox(["health"], tmp_path, engine_restarts=True)
    assert unhealthy.returncode == 1 and not RunDir(tmp_path).container_exit.exists()
    assert not ExitCode.is_final(137) and not ExitCode.is_final(ExitCode.for_signal(15))
    monkeypatch.setenv(exit_record.ENGINE_RESTARTS_ENV, "1")
    assert exit_record.for_engine("run", ExitCode.for_signal(15), tmp_path) == 143
    assert exit_record.recorded(tmp_path, socket.gethostname()) is None  # the engine sees it: nothing to record
