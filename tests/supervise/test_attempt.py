"""The child's start and its output: a pseudo-terminal by default, a pipe where none can be made, always drained.

Real children (``python -c``), read by the real :class:`OutputTee`; no supervisor around them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

from trainbox.rundir.safe import RunFiles
from trainbox.supervise import attempt
from trainbox.supervise.output import terminal
from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.reader import OutputTee

#: What the child reports about itself: whether its output is a terminal, its width, and PYTHONUNBUFFERED.
PROBE = "import os, sys; print(sys.stdout.isatty(), os.get_terminal_size().columns if sys.stdout.isatty() else 0, "
PROBE += "os.environ.get('PYTHONUNBUFFERED'))"


def run(argv: List[str], log: Path, progress: Optional[OutputProgress] = None) -> OutputTee:
    proc, output = attempt.start(argv, dict(os.environ, PYTHONUNBUFFERED="1"))
    tee = OutputTee(output, RunFiles(log.parent), log, echo=False, progress=progress)
    proc.wait(timeout=60)
    tee.close()  # joins the reader, which stops at the end of the output (EOF, or EIO on a pty)
    return tee


def test_the_child_draws_on_a_terminal_of_the_supervisors_size(tmp_path: Path) -> None:
    tee = run([sys.executable, "-c", PROBE], tmp_path / "log")
    assert tee.tail_lines(1) == [f"True {terminal.window_size(sys.stdout)[0]} 1"]
    assert (tmp_path / "log").read_bytes() == f"True {terminal.window_size(sys.stdout)[0]} 1\n".encode(), "no CR LF"


def test_without_a_terminal_it_gets_a_pipe_and_stays_unbuffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(terminal, "open_pty", lambda columns, rows: None)  # no /dev/ptmx, the kernel's pty limit
    tee = run([sys.executable, "-c", PROBE], tmp_path / "log")
    assert tee.tail_lines(1) == ["False 0 1"]


def test_a_bar_redrawn_in_place_is_read_at_each_state_and_its_last_one_is_the_tail(tmp_path: Path) -> None:
    draw = "print(f'\\rEpoch 1: {n * 20:3d}%|##   | {n}/5 [00:01<00:02, 1.00it/s]', end='', flush=True)"
    bar = f"import time\nfor n in range(6):\n    {draw}; time.sleep(0.05)"
    progress = OutputProgress()
    tee = run([sys.executable, "-c", bar], tmp_path / "log", progress)
    last = {"phase": "train", "epoch": 1, "batch": 5, "batches": 5, "pattern": "tqdm", "counter": "tqdm:Epoch #:5"}
    assert progress.advances == 6 and progress.latest()[0] == last
    assert tee.tail_lines(5) == ["Epoch 1: 100%|##   | 5/5 [00:01<00:02, 1.00it/s]"], "the bar's last state"
    assert tee.tail() == "Epoch 1: 100%|##   | 5/5 [00:01<00:02, 1.00it/s]\n" and tee.last_output is not None


class Broken(OutputProgress):
    def observe(self, line: str, now: float) -> None:  # type: ignore[override]
        raise RuntimeError("a bug in the reading")


def test_a_reading_that_fails_never_stops_the_draining(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    started = time.monotonic()
    chatty = "import sys\nfor i in range(2000):\n    print('x' * 500)"  # 1 MB: blocks the child unless drained
    run([sys.executable, "-c", chatty], tmp_path / "log", Broken())
    assert time.monotonic() - started < 60
    assert (tmp_path / "log").stat().st_size == 2000 * 501, "everything logged"
    assert "cannot read the child's output any more (RuntimeError: a bug in the reading)" in capsys.readouterr().err
