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

Two things follow from the rule:

* **The echo never holds up the reading.** A terminal that stops reading (Ctrl-S, an SSH client asleep, ``| less``
  left on its first page) blocks whoever writes to it. So the reading thread only hands each chunk to the
  supervisor's one :class:`Echo` (a thread of its own behind a buffer of :data:`ECHO_BUFFER_BYTES`): when the
  buffer is full the chunk is not echoed, its bytes are counted, and the echo says, for each such pause, when it
  can write again and where the gap is, how much it left out (all of it is in the attempt's log). The child is
  drained, logged and read meanwhile.
* **A reader owns its file descriptors.** The reading thread closes the child's output and the log itself, as it
  ends; :meth:`OutputTee.close` only asks it to end (through a pipe of its own that wakes it) and waits a while.
  A reader that cannot end in time (a log write stuck on a hung disk) still holds its descriptors, so it can
  never read or write a number the kernel has given to the next attempt's output or log.

Every line the supervisor says starts on a line of its own, even where the child left its line unfinished (a tqdm
bar redrawn with ``\\r``, no newline yet): :class:`Echo` is the one place that knows, and ends that line first
(:meth:`Echo.start_line`, called by :func:`trainbox.errors.say`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any, Deque, List, Optional, Union

from trainbox import errors
from trainbox.errors import say
from trainbox.rundir.safe import Open, RunFiles
from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.terminal import TAIL_LINES, TerminalLines

#: Bytes of the child's output that may wait for a slow or stopped terminal: a few screens of a chatty program,
#: seconds of a bar's redraws. Past it the output is still logged and read, only not echoed.
ECHO_BUFFER_BYTES = 4 * 2**20
#: How long a line the supervisor says waits for the echo to write what it holds (:meth:`Echo.end_line`).
END_LINE_WAIT_S = 1.0
#: How long :meth:`OutputTee.close` waits for the reader to end (it drains what is left, then closes its fds).
CLOSE_WAIT_S = 2.0
#: One read of the child's output (a pty's buffer is 4 KiB to 64 KiB).
READ_BYTES = 65536
#: How long :meth:`OutputTee.read_to_end` waits at most for the output of a child that exited, and the quiet that
#: ends the wait sooner when a process that outlives it (a DataLoader worker) holds its terminal open: a traceback
#: and a bar's last state are written in one burst, milliseconds apart.
READ_TO_END_S, QUIET_S = 2.0, 0.25
#: Reads taken after :meth:`OutputTee.close` asked the reader to end: what the child left in its terminal's buffer
#: (64 KiB at most on Linux), and not forever when a process outside the ended tree keeps writing.
DRAIN_READS = 64


class Echo:
    """The supervisor's stdout, written by one thread of its own from a bounded buffer (see the module docstring).

    :meth:`put` never blocks. ``dropped`` counts the bytes that found the buffer full. A pause is the run of chunks
    dropped in a row: the first pause is said at once (:data:`NOT_ECHOED`, by a thread of its own: stderr may be the
    same stopped terminal), and each pause's true count where it was, in the echoed stream, once the buffer has room
    again (:func:`not_echoed_line`).

    It is also the one place that knows whether the echoed output ended mid-line (a bar redrawn with ``\\r``, no
    newline yet): :meth:`start_line` is called before every line the supervisor says (:func:`trainbox.errors.say`), so
    that line starts on a line of its own.
    """

    def __init__(self, fd: int, limit: int = ECHO_BUFFER_BYTES) -> None:
        self.fd = fd
        self.limit = limit
        self.dropped = 0
        #: The bytes dropped since the last chunk that found room: the pause under way.
        self._pause = 0
        #: Each chunk to write, or the byte count of a pause to say at that place in the stream.
        self._chunks: Deque[Union[bytes, int]] = collections.deque()
        self._size = 0
        self._on = True
        #: The last chunk taken did not end its line (a bar redrawn with ``\r``): see :meth:`end_line`.
        self._line_open = False
        #: The last chunk written did not end its line (what the terminal shows now).
        self._written_open = False
        #: A chunk is out of the buffer and being written.
        self._writing = False
        self._ready = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def put(self, chunk: bytes) -> None:
        """Echo ``chunk`` when the buffer has room for it; count it as dropped when not."""
        with self._ready:
            if not self._on:
                return
            if self._size + len(chunk) > self.limit:
                if not self.dropped:
                    _say_aside(NOT_ECHOED)
                self.dropped += len(chunk)
                self._pause += len(chunk)
                return
            if self._pause:  # the pause is over: its count is said where it was
                self._chunks.append(self._pause)
                self._pause = 0
            self._chunks.append(chunk)
            self._size += len(chunk)
            self._line_open = not chunk.endswith(b"\n")
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_all, name="echo", daemon=True)
                self._thread.start()
            self._ready.notify_all()

    def end_line(self, wait_s: float = END_LINE_WAIT_S) -> None:
        """End the line the echoed output left open (a bar), and give the echo ``wait_s`` to write what it holds, so
        that a line the supervisor says next starts on a line of its own (a stopped terminal is not waited for)."""
        if self._line_open:
            self.put(b"\n")
        with self._ready:
            self._ready.wait_for(lambda: not (self._chunks or self._writing) or not self._on, timeout=wait_s)

    def start_line(self) -> None:
        """Before a line of the supervisor's: the echoed output's open line is ended (:meth:`end_line`; from the echo's
        own thread, which cannot wait for itself, by writing the newline at once)."""
        if threading.current_thread() is not self._thread:
            self.end_line()
        elif self._written_open:
            self._written_open = not self._write(b"\n")

    def _write_all(self) -> None:
        while True:
            with self._ready:
                while not self._chunks:
                    self._ready.wait()
                chunk = self._chunks.popleft()
                self._size -= len(chunk) if isinstance(chunk, bytes) else 0
                self._writing = True
            if isinstance(chunk, int):
                say(not_echoed_line(chunk))
                written = True
            else:
                written = self._write(chunk)
                self._written_open = bool(chunk) and not chunk.endswith(b"\n")
            with self._ready:
                self._writing = False
                self._ready.notify_all()
                self._on = self._on and written

    def _write(self, chunk: bytes) -> bool:
        """Write ``chunk`` to the echo's descriptor; False when it is gone (then it is /dev/null from now on).

        Not through ``sys.stdout.buffer``: a write blocked there holds the buffer's lock, and the interpreter aborts
        at exit when a daemon thread holds it ("could not acquire lock ... at interpreter shutdown").
        """
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self.fd, view) :]
            return True
        except (OSError, ValueError):  # EPIPE, EIO from a hung-up terminal; ValueError: stdout was closed
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)  # not the run directory: /dev/null
                os.dup2(devnull, self.fd)
                os.close(devnull)
            return False


def not_echoed_line(count: int) -> str:
    """What the echo says where it left ``count`` bytes out (once per pause, with that pause's true count)."""
    return f"{count} bytes of the child's output were not echoed while stdout was not read (all are logged)"


#: Said once when the echo first has to leave output out.
NOT_ECHOED = (
    "stdout is not being read (a paused terminal, an unread pipe): the child's output is not echoed while it is not; "
    "it is still read and logged in full"
)


def _say_aside(line: str) -> None:
    """Say ``line`` from a thread of its own: a stderr on a stopped terminal blocks its writer, and that must not be the
    reader of the child's output."""
    threading.Thread(target=say, args=(line,), name="echo-notice", daemon=True).start()


_ECHO: Optional[Echo] = None
_ECHO_LOCK = threading.Lock()


def stdout_echo() -> Echo:
    """The process's one :class:`Echo`: every attempt's output goes to the same stdout, in the order it came."""
    global _ECHO
    with _ECHO_LOCK:
        if _ECHO is None:
            _ECHO = Echo(sys.stdout.fileno())
            errors.before_say(_ECHO.start_line)
        return _ECHO


class OutputTee:
    """Copies the child's output to our stdout and a log file, and reads it as display lines (see the module).

    ``stream`` is a pipe or a pseudo-terminal's master (read until EOF or EIO, which a pty's master returns once
    every process holding its slave is gone); the reader closes it, and the log, as it ends. ``progress`` is given
    every display state with the monotonic time it was read.
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
        self._echo = stdout_echo() if echo else None
        self.lines = TerminalLines()
        self._progress = progress
        self._reading = True
        #: When the child last showed a new display state (monotonic seconds), None before its first.
        self.last_output: Optional[float] = None
        #: When the reader last took a chunk of output (monotonic seconds).
        self._chunk_at = time.monotonic()
        # close() writes a byte here to wake the reader (and closes this write end); the reader closes the read end.
        self._wake_r, self._wake_w = os.pipe()
        self._closing = False
        self._thread = threading.Thread(target=self._pump, name="child-output", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while self._take(self._chunk(poller, None)):
                pass
            for _ in range(DRAIN_READS):  # asked to end: what the child wrote before is kept
                if not self._take(self._chunk(poller, 0)):
                    break
        finally:
            self._release()

    def _chunk(self, poller: select.poll, timeout_ms: Optional[int]) -> Optional[bytes]:
        """The next chunk of the child's output, waiting up to ``timeout_ms`` (None: until it comes or close() asks);
        None at its end (EOF, EIO), when close() asked, or when none came in time."""
        while not (self._closing and timeout_ms is None):
            ready = {fd for fd, _ in poller.poll(timeout_ms)}
            if self._fd in ready:
                try:
                    return os.read(self._fd, READ_BYTES) or None
                except OSError:
                    return None  # a pty whose slave every process has closed (EIO)
            if timeout_ms is not None:
                return None
        return None

    def _take(self, chunk: Optional[bytes]) -> bool:
        """Read, log and echo ``chunk``; False at the end of the output."""
        if chunk is None:
            return False
        self._chunk_at = time.monotonic()
        if self._reading:
            self._read(chunk)
        self._write_log(chunk)
        echo = self._echo  # once: end_echo() may take it away meanwhile
        if echo is not None:
            echo.put(chunk)
        return True

    def _release(self) -> None:
        """The reader's last act: its descriptors are closed by it, so none outlives it or is used after its close
        (the wake-up pipe's write end is close()'s)."""
        with contextlib.suppress(OSError):
            self._stream.close()
        for fd in (self._log, self._wake_r):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

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

    def end_echo(self) -> None:
        """Stop echoing this attempt (its output is still drained, logged and read), the line it left open ended: a
        tree being stopped draws no more over the line that says so."""
        echo, self._echo = self._echo, None
        if echo is not None:
            echo.end_line()

    def read_to_end(self, wait_s: float = READ_TO_END_S, quiet_s: float = QUIET_S) -> None:
        """Wait until what the child wrote has been read (after it exited: its last counter is where it ended): the
        output's end, every writer gone; or ``quiet_s`` without a chunk, or ``wait_s`` in all (a process that
        outlives the child holds its terminal open)."""
        deadline = time.monotonic() + wait_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            if time.monotonic() - self._chunk_at >= quiet_s:
                return
            self._thread.join(min(0.02, max(0.0, deadline - time.monotonic())))

    def tail_lines(self, count: int) -> List[str]:
        """The last ``count`` display lines, a bar's last state included."""
        return self.lines.tail(count)

    def tail(self) -> str:
        """The output tail an incident keeps (``output-tail.txt``): the last display lines, one per line."""
        return "\n".join(self.lines.tail(TAIL_LINES)) + "\n"

    def close(self) -> None:
        """Ask the reader to end: it reads what the child already wrote, then closes its descriptors itself."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError):  # EPIPE: the reader already ended, and closed the read end
            os.write(self._wake_w, b"x")
        os.close(self._wake_w)
        self._thread.join(timeout=CLOSE_WAIT_S)
