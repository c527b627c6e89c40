"""A real tqdm loop on a real pty, read live as the supervisor will: its counter advances; hung, it does not.

The loop is tests/fixtures/output/programs/tqdm_loop.py (no beat(), nothing of trainbox; hung by trainbox.faults'
``output`` site through tests/fixtures/uninstrumented); the reader is the one the supervisor's output thread runs:
os.read on the master, TerminalLines, OutputProgress.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.terminal import TerminalLines, open_pty

pytest.importorskip("tqdm")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOOP = FIXTURES / "output" / "programs" / "tqdm_loop.py"
#: How long the hung loop is watched after it stops: 25 of its chatter lines, 100 of its steps had it gone on.
HUNG_WATCH_S = 2.5


class LiveChild:
    """A child on a pty, its output read as it comes: every display state and every beat, with when it was read."""

    def __init__(self, argv: List[str], fault: str = "") -> None:
        pair = open_pty()
        if pair is None:
            pytest.fail("no pseudo-terminal on this machine")
        self.master, slave = pair
        env = dict(os.environ, PYTHONUNBUFFERED="1", TRAIN_FAULT=fault, TRAIN_ATTEMPT="0")
        env["PYTHONPATH"] = os.pathsep.join([str(FIXTURES / "uninstrumented"), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        os.close(slave)
        self.lines, self.progress = TerminalLines(), OutputProgress()
        self.states: List[Tuple[float, str]] = []
        self.beats: List[Tuple[float, Dict[str, Any]]] = []

    def read(self, seconds: float, until: Optional[Callable[[], bool]] = None) -> bool:
        """Read for up to ``seconds`` or until ``until()``; True once the child's output ended (EIO)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return True
            if not chunk:
                return True
            now = time.monotonic()
            for state in self.lines.feed(chunk):
                self.states.append((now, state))
                beat = self.progress.observe(state, now)
                if beat is not None:
                    self.beats.append((now, beat))
            if until is not None and until():
                return False
        return False

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        os.close(self.master)


@pytest.fixture
def live() -> Iterator[Callable[..., LiveChild]]:
    children: List[LiveChild] = []

    def start(*args: str, fault: str = "") -> LiveChild:
        children.append(LiveChild([sys.executable, str(LOOP), *args], fault))
        return children[-1]

    yield start
    for child in children:
        child.end()


def test_a_tqdm_loop_is_read_advancing_as_it_runs(live: Callable[..., LiveChild]) -> None:
    child = live("--epochs", "1", "--steps", "40", "--delay", "0.05")
    assert child.read(60), "the loop did not finish"
    assert child.proc.wait(timeout=10) == 0
    train = [(at, beat["batch"]) for at, beat in child.beats if beat.get("phase") == "train"]
    assert [batch for _, batch in train] == list(range(41))  # every step, in order, none twice
    assert train[-1][0] - train[0][0] > 1.0  # read while it ran (40 steps of 50 ms), not all at the end
    assert child.beats[-1][1] == {"phase": "val", "step": 3, "steps": 3, "pattern": "tqdm", "counter": "tqdm:Validating:3"}
    assert child.lines.tail(1) == ["done"]


def test_the_same_loop_hung_while_a_thread_chatters_makes_no_progress(live: Callable[..., LiveChild]) -> None:
    # Each draw starts with \r: 11 line ends written once step 10 is drawn, so the next draw hangs (stuck at 10).
    child = live("--epochs", "1", "--steps", "100", "--delay", "0.02", "--chatter", "0.1", fault="sleep@output,lines>=11")
    reached = child.read(60, until=lambda: any(beat.get("batch") == 10 for _, beat in child.beats))
    assert not reached and child.beats[-1][1]["batch"] == 10
    stopped_at = time.monotonic()
    assert not child.read(HUNG_WATCH_S), "the hung loop exited"
    chatter = [state for at, state in child.states if at > stopped_at and "GPU memory 5.1 GB" in state]
    assert len(chatter) >= 10  # the thread kept printing ...
    assert [beat for at, beat in child.beats if at > stopped_at] == []  # ... and that is not progress
    beat, _ = child.progress.latest()
    assert beat == {"phase": "train", "epoch": 0, "batch": 10, "batches": 100, "pattern": "tqdm", "counter": "tqdm:Epoch #:100"}
    # the output tail shows the stuck bar, the first chatter line written after it on its line, then the chatter
    assert any("10/100" in line for line in child.lines.tail(40)) and child.lines.tail(1) == ["GPU memory 5.1 GB"]
