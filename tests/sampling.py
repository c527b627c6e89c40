"""Real process trees for the sampler and classifier tests, and a loop that samples them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator, List, Mapping, Optional

import pytest

from trainbox.diagnose import evidence
from trainbox.diagnose.window import Window
from trainbox.system import proctree


class Tree:
    """Real children started in their own process groups, all killed at the end of the test."""

    def __init__(self) -> None:
        self.started: List[subprocess.Popen] = []

    def python(self, code: str, *args: str, env: Optional[Mapping[str, str]] = None) -> subprocess.Popen:
        """``python -c code args...``; its stdout is a pipe (see :func:`wait_for_line`)."""
        argv = [sys.executable, "-c", code, *args]
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(child)
        return child

    def stop(self) -> None:
        for child in self.started:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass
            child.wait()
            if child.stdout is not None:
                child.stdout.close()


@pytest.fixture
def tree() -> Iterator[Tree]:
    started = Tree()
    yield started
    started.stop()


def watch(pid: int, seconds: float, env: Optional[Mapping[str, str]] = None, every: float = 0.5) -> Window:
    """Sample ``pid``'s tree every ``every`` s for ``seconds``."""
    sampler = evidence.Sampler(proctree.ProcessTree(pid), env if env is not None else os.environ)
    window = Window()
    deadline = time.monotonic() + seconds
    while True:
        window.add(sampler.sample())
        if time.monotonic() >= deadline:
            return window
        time.sleep(every)


def wait_for_line(child: subprocess.Popen, line: str) -> None:
    """Read the child's output up to ``line`` (it reached the point the test samples)."""
    assert child.stdout is not None
    for got in child.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"the child ended before printing {line!r}")


def wait_for_children(pid: int, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(proctree.ProcessTree(pid).scan()) < count + 1:
        assert time.monotonic() < deadline, f"pid {pid} did not start {count} children"
        time.sleep(0.1)
