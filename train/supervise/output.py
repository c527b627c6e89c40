"""The child's output on its way out, and the supervisor's own one-line messages.

:class:`OutputTee` copies everything the child prints to the supervisor's stdout
and to the attempt's log, and keeps the last 64 KiB for the incident report and
the crash event. Its one rule: the child's pipe is always drained, because a
child that cannot write blocks, stops beating, and would be killed as stalled
for a fault that is ours (a closed terminal, a full disk). The log is opened
through :mod:`trainbox.rundir.safe`: a ``logs`` link or a FIFO in its place is
refused, said in one line, and the output is then only echoed and kept.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, Deque, List, Optional

from trainbox.errors import say
from trainbox.rundir.safe import Open, RunFiles

#: How much of the child's output an incident report and a crash event keep.
OUTPUT_TAIL_BYTES = 64 * 1024


class OutputTee:
    """Copies the child's output to our stdout and a log file, keeping the tail for reports.

    Whatever fails, the child's pipe is drained to its end: a child that cannot
    write its output blocks, stops beating and would be killed as stalled. A
    stdout that is gone (``| head``, a closed terminal) ends the echo for good
    (it is pointed at /dev/null, so the exit's flush cannot fail either); a log
    write that fails (a full disk) loses that chunk and is tried again with the
    next one; the tail is kept in memory either way.
    """

    def __init__(self, stream: Any, files: RunFiles, log_path: Path, echo: bool) -> None:
        self._fd = stream.fileno()
        self._stream = stream
        self._log_path = log_path
        opened = files.open_fd(log_path, Open.APPEND)
        self._log: Optional[int] = opened.value
        if opened.refused is not None:
            say(f"{opened.refused.line(log_path)}: the child's output of this attempt is not logged")
        self._log_failing = False
        self._echo = echo
        self._tail: Deque[bytes] = collections.deque()
        self._tail_size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="child-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                return  # our end of the pipe was closed (close() after a timeout): nothing left to drain
            if not chunk:
                return
            with self._lock:
                self._tail.append(chunk)
                self._tail_size += len(chunk)
                while self._tail_size - len(self._tail[0]) >= OUTPUT_TAIL_BYTES:
                    self._tail_size -= len(self._tail.popleft())
            self._write_log(chunk)
            if self._echo:
                self._write_stdout(chunk)

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

    def tail(self) -> bytes:
        with self._lock:
            return b"".join(self._tail)[-OUTPUT_TAIL_BYTES:]

    def tail_lines(self, count: int) -> List[str]:
        text = self.tail().decode("utf-8", "replace").replace("\r", "\n")
        return [line for line in text.splitlines() if line.strip()][-count:]

    def close(self) -> None:
        self._thread.join(timeout=2.0)
        self._stream.close()
        if self._log is not None:
            os.close(self._log)
