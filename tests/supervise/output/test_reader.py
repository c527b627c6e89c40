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
from typing import Any

import pytest

from tests.supervised import REPO, cli_env, read_events, survivors, wait_for
from trainbox.errors import ExitCode
from trainbox.rundir.safe import RunFiles
from trainbox.supervise.output.reader import NOT_ECHOED, Echo, OutputTee, not_echoed_line

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


#: A real tqdm bar that stops at 11/40 without its newline, then hangs (stall) or crashes (exit 1).
UNFINISHED_BAR = """
import sys, time
from tqdm import tqdm
bar = tqdm(total=40, mininterval=0)
for _ in range(11):
    bar.update(1)
    time.sleep(0.02)
if sys.argv[1] == "crash":
    sys.exit(1)
time.sleep(600)
"""


@pytest.mark.parametrize("ending", ["stall", "crash"])
def test_each_trainbox_line_starts_a_line_of_its_own_after_an_unfinished_bar(tmp_path: Path, ending: str) -> None:
    """Not ``...11/40 [00:00<00:00, 49.3it/s]trainbox: attempt 0 stalled``: stdout and stderr into one pipe, as on a
    terminal, and every trainbox line at the start of its line."""
    script = tmp_path / "bar.py"
    script.write_text(UNFINISHED_BAR)
    run_dir = tmp_path / "run"
    options = ["--stall-timeout", "2", "--startup-timeout", "20", "--grace", "1", "--max-restarts", "0"]
    argv = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(run_dir), *options]
    done = subprocess.run(
        [*argv, "--", sys.executable, str(script), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=cli_env(),
        cwd=REPO,
        timeout=120,
    )
    output = done.stdout.decode(errors="replace")
    said = [line for line in output.split("\n") if "trainbox: " in line]
    ended = {"stall": ExitCode.HUNG, "crash": ExitCode.GAVE_UP}[ending]
    assert done.returncode == ended and "11/40" in output, output
    assert len(said) >= 3 and all(line.startswith("trainbox: ") for line in said), said
    assert not survivors(run_dir)


def test_each_pause_of_the_echo_is_said_with_its_true_count_where_it_was(tmp_path: Path, capfd: Any) -> None:
    """Two pauses (a stdout nobody reads, then read, twice): each is said once, with the bytes it left out."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    echo = Echo(write_end, limit=8)
    for _ in range(2):
        echo.put(b"12345678")  # fills the buffer: the pipe is writable, so it is written at once
        wait_for(lambda: echo._size == 0, what="the echo to write what it holds")
        fill_pipe(write_end)  # now the echo's next write blocks
        echo.put(b"abcd")
        wait_for(lambda: echo._writing and not echo._chunks, what="the echo to block on the full pipe")
        for chunk in (b"x" * 5, b"y" * 7, b"z" * 5):
            echo.put(chunk)  # 5 held, then 5 + 7 and 5 + 5 are past the 8: dropped
        drain(read_end)
        wait_for(lambda: echo._size == 0, what="the echo to write again")
        echo.put(b"end\n")  # room again: the pause's count, then this
        wait_for(lambda: not echo._chunks and not echo._writing, what="the echo to catch up")
    err = capfd.readouterr().err
    assert err.count(not_echoed_line(12)) == 2, err
    assert err.count(NOT_ECHOED) == 1, "the first pause says why, once"
    assert echo.dropped == 24


def fill_pipe(fd: int) -> None:
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"\0")
    os.set_blocking(fd, True)  # the echo's write blocks, as on a paused terminal


def drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 65536):
            pass
