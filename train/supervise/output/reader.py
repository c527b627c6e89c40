"""The child's output on its way out, read as a person reads it, and the supervisor's own one-line messages.

:class:`OutputTee` copies everything the child prints to the supervisor's stdout and to the attempt's log, and
reads it back as a terminal lays it out (:class:`~trainbox.supervise.output.terminal.TerminalLines`: ``\\r`` redraws are
lines, a bar's last state counts): each display state goes to the attempt's
:class:`~trainbox.supervise.output.progress.OutputProgress`, which tells a counter that advanced from chatter, and
the last lines are the output tail of incidents, crash events and give-up messages, a bar's last state included.

Its one rule: the child's output is always drained, because a child that cannot write blocks, stops making
progress, and would be killed as stalled for a fault that is ours (a closed terminal, a full disk, a bug in the
reading). So a reader that goes away only ends the echo, a failed log write loses that chunk, and a line that
cannot be read ends the reading for the attempt, never the draining. The log is opened through
:mod:`trainbox.rundir.safe`: a ``logs`` link or a FIFO in its place is refused, said in one line, and the output is
then only echoed and read.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

from trainbox.errors import say
from trainbox.rundir.safe import Open, RunFiles
from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.terminal import TAIL_LINES, TerminalLines


class OutputTee:
    """Copies the child's output to our stdout and a log file, and reads it as display lines (see the module).

    ``stream`` is a pipe or a pseudo-terminal's master (read until EOF or EIO, which a pty's master returns once
    every process holding its slave is gone). ``progress`` is given every display state with the monotonic time
    it was read.
    """

    def __init__(
        self, stream: Any, files: RunFiles, log_path: Path, echo: bool, progress: Optional[OutputProgress] = None
    ) -> None:
        self._fd = stream.fileno()
        self._stream = stream
        self._log_path = log_path
        opened = files.open_fd(log_path, Open.APPEND)
        self._log: Optional[int] = opened.value
        if opened.refused is not None:
            say(f"{opened.refused.line(log_path)}: the child's output of this attempt is not logged")
        self._log_failing = False
        self._echo = echo
        self.lines = TerminalLines()
        self._progress = progress
        self._reading = True
        #: When the child last showed a new display state (monotonic seconds), None before its first.
        self.last_output: Optional[float] = None
        self._thread = threading.Thread(target=self._pump, name="child-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return  # a pty whose slave every process has closed (EIO), or our end closed after a timeout
            if not chunk:
                return
            if self._reading:
                self._read(chunk)
            self._write_log(chunk)
            if self._echo:
                self._write_stdout(chunk)

    def _read(self, chunk: bytes) -> None:
        now = time.monotonic()
        try:
            states = self.lines.feed(chunk)
            for state in states:
                if self._progress is not None:
                    self._progress.observe(state, now)
        except Exception as exc:  # noqa: BLE001 - a reading bug must not stop the draining (see the module docstring)
            self._reading = False
            say(f"cannot read the child's output any more ({type(exc).__name__}: {exc}); it is still logged")
            return
        if states:
            self.last_output = now

    def _write_log(self, chunk: bytes) -> None:
        if self._log is None:
            return
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._log, view) :]
        except OSError as exc:
            if not self._log_failing:
                say(f"cannot write {self._log_path} ({exc.strerror}): the child's output is not logged until it can be")
            self._log_failing = True
            return
        self._log_failing = False

    def _write_stdout(self, chunk: bytes) -> None:
        try:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        except (OSError, ValueError):  # EPIPE, EIO from a hung-up terminal; ValueError: stdout was closed
            self._echo = False
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)  # not the run directory: /dev/null
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)

    def tail_lines(self, count: int) -> List[str]:
        """The last ``count`` display lines, a bar's last state included."""
        return self.lines.tail(count)

    def tail(self) -> str:
        """The output tail an incident keeps (``output-tail.txt``): the last display lines, one per line."""
        return "\n".join(self.lines.tail(TAIL_LINES)) + "\n"

    def close(self) -> None:
        self._thread.join(timeout=2.0)
        self._stream.close()
        if self._log is not None:
            os.close(self._log)
