"""The supervisor against a hostile run directory (issue 33 items 2-7): real ``python -m trainbox supervise`` runs
whose run directory holds links, folders, FIFOs, absurd beats and broken history lines, planted before the start
or by the child itself. Each ran into a traceback, a hang or damage outside the run directory before
trainbox.rundir.safe and the typed parsers (trainbox.rundir.records); here each run ends as it should, within a
bound, and the world outside the run directory is untouched (tests/rundir/hostile.py's ``Outside``)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.rundir.hostile import DEEP_JSON, PRECIOUS_BYTES, Outside
from tests.supervised import REPO, Finished, cli_env, faulty_child, survivors, train_cli
from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir

OPTIONS = ["--startup-timeout", "10", "--stall-timeout", "5", "--grace", "1", "--backoff", "0.1", "--max-restarts", "1"]
#: A bound no healthy run of these comes near (seconds): a supervisor stuck on a FIFO never ends by itself.
BOUND_S = 90
#: The address space the supervisor is given where a runaway allocation is the bug (issue 33 item 6): room for
#: Python, psutil and the child's start (1 GiB), never for a set of 10**9 ranks (tens of GiB).
ADDRESS_SPACE = 1 << 30


def supervise(run_dir: Path, child: List[str], env: Optional[Dict[str, str]] = None) -> Finished:
    args = ["supervise", "--run-dir", str(run_dir), *OPTIONS, "--quiet", "--", *child]
    result = train_cli(args, run_dir, env, timeout=BOUND_S)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


def beating(steps: int = 5) -> List[str]:
    return faulty_child("--steps", str(steps), "--interval", "0.05")


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path / "outside").create()


def test_a_linked_heartbeats_folder_is_not_emptied(tmp_path: Path, outside: Outside) -> None:
    """Item 2: ``heartbeats -> ../outside/precious`` (holding best.pt) was emptied by the attempt's cleanup."""
    before = outside.snapshot()
    run = tmp_path / "run"
    run.mkdir()
    (run / "heartbeats").symlink_to(os.path.relpath(outside.folder, run))
    result = supervise(run, beating())
    assert result.code == ExitCode.OK, result.stderr
    outside.assert_intact(before)
    assert "heartbeats: a symbolic link, refused" in result.stderr


def test_a_folder_among_the_rank_files_is_left_alone(tmp_path: Path) -> None:
    """Item 4: ``heartbeats/old/`` ended the supervisor with IsADirectoryError at its first attempt."""
    old = tmp_path / "heartbeats" / "old"
    old.mkdir(parents=True)
    (old / "rank-0.json").write_text("{}")
    result = supervise(tmp_path, beating())
    assert result.code == ExitCode.OK, result.stderr
    assert (old / "rank-0.json").read_text() == "{}", "a folder is never descended into"
    assert "left alone: old (not a name trainbox writes)" in result.stderr


def test_a_linked_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    """Item 3: ``supervisor.lock -> train/weights/last.pt`` left 4 bytes of the checkpoint, holding a pid."""
    run = RunDir(tmp_path)
    run.last_checkpoint.parent.mkdir(parents=True)
    run.last_checkpoint.write_bytes(b"\x80" * PRECIOUS_BYTES)
    run.lock.symlink_to(os.path.relpath(run.last_checkpoint, tmp_path))
    result = supervise(tmp_path, beating())
    assert result.code == ExitCode.USAGE, result.stderr
    assert result.stderr.splitlines() == [
        f"trainbox: error: {run.lock}: a symbolic link, refused: the run directory cannot be locked; move it away and run again"
    ]
    assert run.last_checkpoint.read_bytes() == b"\x80" * PRECIOUS_BYTES
    assert not run.events.exists(), "nothing was started"


#: A child that makes a FIFO where it should beat, then goes on without ever writing to it, and ends.
FIFO_CHILD = """
import os, time
path = {path}
os.makedirs(os.path.dirname(path), exist_ok=True)
os.mkfifo(path)
time.sleep(3)
"""


@pytest.mark.parametrize("rank", [False, True], ids=["heartbeat", "rank-file"])
def test_a_fifo_in_place_of_a_beat_is_no_beat(tmp_path: Path, rank: bool) -> None:
    """Item 5: the supervisor opened the FIFO the child made and waited for a writer for good (SIGTERM ignored).
    Now the FIFO is never opened: no beat, and the child's exit 0 ends the run."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"} if rank else {}
    path = repr(str(RunDir(tmp_path).rank_heartbeat(0))) if rank else "os.environ['TRAIN_HEARTBEAT_FILE']"
    result = supervise(tmp_path, [sys.executable, "-c", FIFO_CHILD.format(path=path)], env)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"]


def test_a_fifo_in_place_of_the_history_is_refused_in_one_line(tmp_path: Path) -> None:
    """Item 5: an ``events.jsonl`` FIFO froze the supervisor before its first attempt."""
    os.mkfifo(RunDir(tmp_path).events)
    result = supervise(tmp_path, beating())
    assert result.code == ExitCode.USAGE
    assert result.stderr.splitlines() == [
        f"trainbox: error: {RunDir(tmp_path).events}: a FIFO, refused: the run's history cannot be written there; "
        "move it away and run again (training resumes from its last checkpoint)"
    ]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_a_beat_that_claims_a_billion_ranks_names_no_node(tmp_path: Path) -> None:
    """Item 6: one beat with ``local_world_size`` 10**9 had the supervisor build a set of 10**9 ranks every poll
    (MemoryError, or the OOM killer). The supervisor runs here in 1 GiB of address space."""
    env = cli_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": str(10**9)})
    args = ["supervise", "--run-dir", str(tmp_path), *OPTIONS, "--quiet", "--", *beating(10)]
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        preexec_fn=_limited,
    )
    assert done.returncode == ExitCode.OK, done.stderr
    assert RunDir(tmp_path).rank_heartbeat(0).exists(), "the child did beat as rank 0 of a node of 10**9 ranks"


def test_malformed_history_lines_are_skipped(tmp_path: Path) -> None:
    """Item 7: a line ``[1]`` (AttributeError), 100,000 ``[`` (RecursionError) or a byte 0xe9 (UnicodeDecodeError)
    in events.jsonl ended the supervisor before training started, and in a container at every restart."""
    history = RunDir(tmp_path).events
    history.write_bytes(b"\n".join([b"[1]", DEEP_JSON, b'{"event": "d\xe9j\xe0", "ts": 1}', b""]))
    result = supervise(tmp_path, beating())
    assert result.code == ExitCode.OK, result.stderr
    appended = history.read_bytes().split(b"\n")[3:]
    assert [line for line in appended if line][0].startswith(b'{"argv"'), "the run's own events follow the garbage"
