"""The reader of a child's output: it owns its file descriptors, and the echo to our stdout never holds it up.

Real pipes and real processes: a reader closed while its pipe is still open, the next attempt's pipe on the numbers
it freed; ``trainbox supervise`` with its stdout into a pipe nobody reads, and a healthy child that prints a lot.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.supervised import REPO, cli_env, read_events, survivors
from trainbox.errors import ExitCode
from trainbox.rundir.safe import RunFiles
from trainbox.supervise.output.reader import NOT_ECHOED, Echo, OutputTee

#: Lines the next attempt prints, one at a time: every reader blocked on the pipe is waiting for each of them.
LINES = 200
LINE_GAP_S = 0.002


def tee_on_a_pipe(tmp_path: Path, name: str) -> tuple[OutputTee, int]:
    read_end, write_end = os.pipe()
    tee = OutputTee(os.fdopen(read_end, "rb", buffering=0), RunFiles(tmp_path), tmp_path / name, echo=False)
    return tee, write_end


def test_a_closed_reader_never_reads_or_writes_the_numbers_the_next_attempt_is_given(tmp_path: Path) -> None:
    old, old_writer = tee_on_a_pipe(tmp_path, "attempt-0.log")  # its child's tree left a process holding the pipe
    old.close()
    new, new_writer = tee_on_a_pipe(tmp_path, "attempt-1.log")  # the kernel gives the lowest free numbers again
    with contextlib.suppress(BrokenPipeError):  # the reader ended and closed its end; else it wakes up now
        os.write(old_writer, b"late line of attempt 0\n")
    for number in range(1, LINES + 1):
        os.write(new_writer, f"step {number}\n".encode())
        time.sleep(LINE_GAP_S)
    os.close(new_writer)
    os.close(old_writer)
    new._thread.join(timeout=30)  # it ends at the end of its output (EOF)
    new.close()
    logged = (tmp_path / "attempt-1.log").read_text().splitlines()
    assert logged == [f"step {n}" for n in range(1, LINES + 1)], "every line, once, and nothing of attempt 0"
    assert new.tail_lines(1) == [f"step {LINES}"]
    assert "late" not in (tmp_path / "attempt-0.log").read_text() + "".join(new.tail_lines(LINES + 5))


def test_an_echo_that_cannot_write_drops_past_its_buffer_and_never_blocks_who_puts(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()  # a stdout nobody reads: 64 KiB and its writer blocks
    echo = Echo(write_end, limit=256 * 1024)
    chunk = b"x" * 4096
    putting = threading.Thread(target=lambda: [echo.put(chunk) for _ in range(1024)])  # 4 MiB
    putting.start()
    putting.join(timeout=30)
    assert not putting.is_alive(), "put() blocked"
    assert 3 * 2**20 <= echo.dropped <= 4 * 2**20 - 256 * 1024, echo.dropped
    os.close(read_end)  # the echo's blocked write fails (EPIPE): it stops echoing, its descriptor now /dev/null


def test_a_supervisor_whose_stdout_nobody_reads_does_not_kill_a_healthy_child(tmp_path: Path) -> None:
    # 40 steps of 0.05 s, each printing 160 KiB: 6.4 MiB, more than the echo's buffer and what a pipe and a pty hold
    child = "import time\nfor i in range(40):\n    print('step', i, 'x' * 163840, flush=True)\n    time.sleep(0.05)"
    options = ["--stall-timeout", "2", "--startup-timeout", "10", "--grace", "1", "--max-restarts", "1"]
    argv = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(tmp_path), *options]
    stderr = tmp_path.parent / f"{tmp_path.name}.stderr"
    with open(stderr, "wb") as err:
        supervisor = subprocess.Popen(
            [*argv, "--", sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=err, env=cli_env(), cwd=REPO
        )
        try:
            code = supervisor.wait(timeout=120)
        finally:
            supervisor.kill()
            supervisor.wait()
            assert supervisor.stdout is not None
            supervisor.stdout.close()
    kinds = [event["event"] for event in read_events(tmp_path)]
    assert (code, kinds) == (ExitCode.OK, ["start", "exit"]), stderr.read_text()
    assert stderr.read_text().count(NOT_ECHOED) == 1, "said once"
    assert (tmp_path / "logs" / "attempt-0.log").read_text().count("step") == 40, "logged in full"
    assert not survivors(tmp_path)
