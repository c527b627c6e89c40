"""The beat side of the contract: atomic, throttled, progress ignores volatile fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervised import train_cli
from trainbox import heartbeat
from trainbox.errors import ExitCode
from trainbox.supervise.stalls.budgets import Budget, BudgetPolicy

CHILD = """
import json, sys
from trainbox import heartbeat
written = sum(heartbeat.beat("train", step=i, epoch=0, batch=i, loss=0.5) for i in range(20000))
written += heartbeat.beat("val", timeout=30)
print(json.dumps(written))
"""


def test_beat_is_throttled_and_atomic(tmp_path: Path) -> None:
    hb = tmp_path / "hb.json"
    env = dict(os.environ, TRAIN_HEARTBEAT_FILE=str(hb), TRAIN_RUN_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    written = json.loads(done.stdout)
    assert 2 <= written < 100, "20000 beats in well under a second must cause only a few writes"
    record = json.loads(hb.read_text())
    assert record["phase"] == "val" and record["timeout"] == 30 and record["step"] == 19999
    assert not list(tmp_path.glob(".hb.json.*")), "no temporary file left behind"
    assert (tmp_path / "stacks" / f"{record['pid']}.txt").exists(), "beat() registers the stack dump"


def test_beat_without_supervisor_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv(heartbeat.HEARTBEAT_ENV, raising=False)
    monkeypatch.setattr(heartbeat, "_beater", None)
    assert heartbeat.beat("train", step=1) is False


def test_progress_ignores_timestamp_and_pid() -> None:
    a = {"step": 3, "ts": 1.0, "pid": 10}
    assert heartbeat.progress_key(a) == heartbeat.progress_key({"step": 3, "ts": 2.0, "pid": 11})
    assert heartbeat.progress_key(a) != heartbeat.progress_key({"step": 4, "ts": 1.0, "pid": 10})


def test_budget_order_startup_declared_learned_stall() -> None:
    policy = BudgetPolicy(startup_s=600, stall_s=300, factor=3, floor_s=5, min_samples=3)
    assert policy.current(None) == Budget("startup", 600)
    assert policy.current({"phase": "val", "timeout": 900}) == Budget("phase:val", 900.0)
    assert policy.current({"phase": "train", "step": 3}, counting=True) == Budget("stall", 300)
    for step, silent in enumerate((1.0, 2.5, 0.5)):
        policy.observe({"phase": "train", "step": step}, silent, {"phase": "train", "step": step + 1})
    learned = Budget("learned:train", 7.5, busy_s=300)
    assert policy.current({"phase": "train", "step": 3}, counting=True) == learned, "a suspicion: busy for the stall budget"
    assert policy.current({"phase": "train", "step": 3}) == Budget("stall", 300), "only between steps of a counter"
    policy.observe({"phase": "train", "step": 3}, 500.0, {"phase": "train", "step": 4})
    assert policy.current({"phase": "train", "step": 4}, counting=True) == learned, "a long silence is kept apart"
    slow = BudgetPolicy(startup_s=600, stall_s=300, factor=3, floor_s=5, min_samples=3)
    for step, silent in enumerate((150.0, 120.0, 100.0)):
        slow.observe({"phase": "train", "step": step}, silent, {"phase": "train", "step": step + 1})
    assert slow.current({"phase": "train", "step": 3}, counting=True) == Budget("stall", 300), "below the stall budget only"
    assert "train" not in slow.learned()
    policy.observe({"phase": "val", "timeout": 900, "step": 1}, 800.0, {"phase": "val", "timeout": 900, "step": 2})
    assert "val" not in policy.learned(), "declared phases are not learned"


#: A child that writes what a bug (or a hostile script) might into its heartbeat file, then beats for real.
GARBAGE_THEN_BEATS = """
import os, sys, time
from pathlib import Path
from trainbox.heartbeat import beat
path = Path(os.environ["TRAIN_HEARTBEAT_FILE"])
for garbage in (sys.argv[1], "[" * 100000, "x" * (1 << 20), "[1, 2]", '{"step": 1'):
    path.write_text(garbage)
    time.sleep(0.3)
for step in range(3):
    beat("train", step=step, force=True)
    time.sleep(0.1)
"""


def test_garbage_in_the_heartbeat_file_is_no_beat_and_never_kills_the_supervisor(tmp_path: Path) -> None:
    """Before the fix, 100,000 '[' raised RecursionError in the supervisor: exit 1, no exit event."""
    result = train_cli(
        [
            "supervise",
            "--run-dir",
            str(tmp_path),
            "--startup-timeout",
            "30",
            "--stall-timeout",
            "30",
            "--quiet",
            "--",
            sys.executable,
            "-c",
            GARBAGE_THEN_BEATS,
            "{]",
        ],
        tmp_path,
    )
    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "exit"] and result.of("exit")[0]["beats"] >= 1  # polled: not every beat is seen


def test_garbage_alone_runs_out_the_startup_budget(tmp_path: Path) -> None:
    child = "import os, time; open(os.environ['TRAIN_HEARTBEAT_FILE'], 'w').write('[' * 100000); time.sleep(60)"
    result = train_cli(
        [
            "supervise",
            "--run-dir",
            str(tmp_path),
            "--startup-timeout",
            "2",
            "--grace",
            "1",
            "--max-restarts",
            "0",
            "--quiet",
            "--",
            sys.executable,
            "-c",
            child,
        ],
        tmp_path,
    )
    assert result.code == ExitCode.HUNG, result.stderr
    assert [e["budget"] for e in result.of("stall")] == ["startup"]


CHECKPOINTING = """
import json, os, sys, time
from trainbox import heartbeat
from trainbox.rundir.layout import RunDir
from pathlib import Path
request = RunDir(Path(os.environ["TRAIN_RUN_DIR"])).checkpoint_request
skew = float(sys.argv[1])  # how far the run directory's clock is from ours: its files' mtimes are set by it
heartbeat.beat("train", step=1, force=True)
before = heartbeat.checkpoint_requested()
request.write_text("{}")
os.utime(request, (time.time() + skew, time.time() + skew))
time.sleep(1.05)  # the request is looked for once a second at most
asked = heartbeat.checkpoint_requested()
again = heartbeat.checkpoint_requested()  # not answered yet: still asked for (a step with no checkpoint)
heartbeat.checkpointed()
time.sleep(1.05)
print(json.dumps([before, asked, again, heartbeat.checkpoint_requested()]))
"""


@pytest.mark.parametrize("skew", [0.0, -3600.0, 3600.0], ids=["same-clock", "clock-behind", "clock-ahead"])
def test_a_checkpoint_request_is_seen_once_and_answered_with_a_beat(tmp_path: Path, skew: float) -> None:
    """The supervisor's request (trainbox.supervise.pace.watch) as a child sees it: a stat a second, asked for until a
    checkpoint answers it, then answered, whatever clock stamps the run directory's files (NFS, a VM's shared
    folder): a request is told by its file's identity, never by its mtime against this process's clock."""
    hb = tmp_path / "heartbeat.json"
    stale = tmp_path / "checkpoint.request"
    stale.write_text("{}")  # left by an earlier attempt, before this process: not for it
    env = dict(os.environ, TRAIN_HEARTBEAT_FILE=str(hb), TRAIN_RUN_DIR=str(tmp_path))
    command = [sys.executable, "-c", CHECKPOINTING, str(skew)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [False, True, True, False]
    record = json.loads(hb.read_text())
    assert record["step"] == 1 and record["phase"] == "train" and "checkpoint_ts" in record
