"""`invoke ARGS` started as a user's shell starts it, for the tests that signal it while it runs.

``sigint_ignored`` starts it as a background job of a non-interactive shell does
(a CI runner, ``cmd &`` in a script): with SIGINT inherited *ignored*, which is
how issues #13 and #22 lost their Ctrl-C. Either way it leads its own process
group, and :meth:`Invoked.interrupt` signals that whole group, as a terminal's
Ctrl-C does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from tests.paths import REPO

ROOT = REPO


class Invoked:
    """`invoke ARGS` in the background, its output collected line by line while it runs."""

    def __init__(self, args: List[str], env: Dict[str, str], sigint_ignored: bool = True, cwd: Path = ROOT) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "invoke", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
        )
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """Signal the whole process group, as a terminal does for Ctrl-C."""
        os.killpg(self.process.pid, signum)

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, f"invoke ended before {what}:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{self.output[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout: float = 180) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def stop(self, signum: int, timeout: float = 30) -> Tuple[int, float]:
        """Signal the process group and wait: (exit status, seconds from the signal to the exit)."""
        sent = time.monotonic()
        self.interrupt(signum)
        code = self.finish(timeout=timeout)
        return code, time.monotonic() - sent


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]
