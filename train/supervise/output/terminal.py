"""The child's output as a terminal shows it: a pseudo-terminal to run it on, and its bytes read back as lines.

Why a terminal. A training script run with its output on a pipe does not print
what its user sees: Python block-buffers ``print()`` (4-8 KiB at a time), rich
draws no live bars (``Console.is_terminal`` is False) and a progress bar that
redraws itself with ``\\r`` never ends a line. On a pseudo-terminal the child
draws exactly as it does for a person, so its progress can be read the way a
person reads it (:mod:`trainbox.supervise.output.progress`) and the log keeps
what a person would have seen. :func:`open_pty` makes one; where none can be
made (no ``/dev/ptmx``, the kernel's pty limit), the caller falls back to a pipe
with ``PYTHONUNBUFFERED=1``.

How the supervisor uses it with :class:`subprocess.Popen`::

    pair = open_pty(*window_size(sys.stdout))
    if pair is None:                                    # no terminal: a pipe, unbuffered
        out, popen_out = None, subprocess.PIPE
    else:
        master, slave = pair
        popen_out = slave
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=popen_out, stderr=subprocess.STDOUT,
                            start_new_session=True, env={..., "PYTHONUNBUFFERED": "1"})
    if pair is not None:
        os.close(slave)                                 # else reading the master never ends
    # a reader thread: os.read(master, 65536) until it returns b"" or raises OSError (EIO on Linux:
    # every process holding the slave is gone), feeding TerminalLines; then os.close(master).

* Only stdout and stderr are the terminal. stdin stays ``/dev/null`` as today: a
  child whose stdin is a terminal may prompt (``input()``, a W&B login, a
  "continue? [y/N]") and wait for a person who is not there, which the
  supervisor would then have to call a stall; on ``/dev/null`` it reads EOF
  and fails at once, with its message in the log.
* ``start_new_session=True`` makes the child a session leader with *no*
  controlling terminal (the slave is inherited, not opened, so it never becomes
  one): no SIGHUP or SIGINT reaches the child through the terminal, and the
  supervisor's signals to the process group work as before. ``isatty()`` and
  ``TIOCGWINSZ`` need no controlling terminal, so programs draw as on a terminal.
* The master is created close-on-exec (PEP 446), so the child never holds it;
  the parent must close its copy of the slave, or the master never reads EIO.
  A descendant that outlives the child and keeps the slave open (a daemon, an
  orphaned worker) keeps the master open too: the reader must also stop when the
  supervisor ends the tree (``OutputTee.close`` wakes it, and it closes the master itself).
* Output post-processing turns LF into CR LF on a terminal (``ONLCR``); it is
  switched off so the log keeps the bytes the program wrote. The supervisor's
  own terminal adds its CR when it echoes them.

:class:`TerminalLines` reads the bytes back the way a terminal lays them out,
without a screen: text overwrites the line from the cursor; ``\\r`` returns to
its start, ``\\b`` and ``ESC[nD`` move back, ``ESC[K``/``ESC[2K`` erase; ``\\n``
ends the line. Cursor-up (``ESC[nA``, ``ESC[nF``: tqdm's nested bars, rich's live
display) goes back to the lines above, which are taken back from the finished
lines to be redrawn, as the terminal redraws them in place. Every other escape
sequence (colours, cursor visibility, window titles: CSI, OSC, DCS and the
short ESC forms of ECMA-48) is stripped. Each state a line goes through before it is
redrawn is reported, since a bar that redraws with ``\\r`` never ends a line:
:meth:`TerminalLines.feed` returns them, and :meth:`TerminalLines.tail`
includes the unfinished line, so the output tail of an incident shows a bar's
last state rather than "(no output)".

Limits: no screen model beyond the current line and the lines above it (a
cursor moved down or to another row by absolute position is not followed; the
lines below the cursor are forgotten when it moves up); tabs are kept as one
character; wide (CJK) characters count as one column. Memory is bounded by
:data:`MAX_LINE_CHARS`, :data:`MAX_ESCAPE_CHARS` and the tail's length, and time
is linear in the bytes (:data:`REDRAW_WORK_PER_CHAR`), whatever the child
writes: about 10 MB/s for a tqdm bar's bytes here, and at least 0.3 MB/s for a
stream made of control characters.
"""

from __future__ import annotations

import codecs
import collections
import fcntl
import os
import re
import struct
import termios
import threading
from typing import IO, Any, Deque, List, Optional, Tuple

#: The window a child draws for when the supervisor's own output is not a terminal (a container's log, a file).
#: Ultralytics fits its epoch line to the width and cuts the columns that do not fit: a detection line is
#: about 125 columns, a segmentation or pose line about 140; 160 keeps every column, so the epoch, the
#: losses and the batch counter are all read. 40 rows is a common terminal height (rich's live displays
#: crop to it).
DEFAULT_COLUMNS = 160
DEFAULT_ROWS = 40

#: A display line is cut at this many characters: a terminal wraps long before it, a progress line is
#: under 300, and a child that prints megabytes without a newline must not grow our memory.
MAX_LINE_CHARS = 4096
#: An escape sequence still unterminated after this many characters is dropped: real ones are under
#: 100 (CSI) or a few hundred (an OSC 8 hyperlink's URL); a stray ESC must not swallow the output.
MAX_ESCAPE_CHARS = 4096
#: Finished lines kept for :meth:`TerminalLines.tail`: more than an incident or a give-up message shows (20).
TAIL_LINES = 200
#: Making a redrawn line's state (or restoring a line above after a cursor-up) costs its length; a chunk may
#: spend this many times its own length on them, plus one line. A bar redraws its whole line each time, so its
#: states always fit (each costs less than the bytes that drew it); a child that writes ``\rX`` over a 4 KiB
#: line cannot make every byte cost a line: past the budget the chunk's redraws are skipped (its last state is
#: still reported), so reading stays linear in what the child writes.
REDRAW_WORK_PER_CHAR = 4

# ECMA-48 escape sequences, complete: CSI (ESC [ params intermediates final), the string controls OSC/DCS/
# SOS/PM/APC ended by BEL or ST (ESC \), nF (ESC intermediates final, e.g. ESC ( B) and the two-character forms.
_CSI = r"\x1b\[(?P<params>[0-?]*)[ -/]*(?P<final>[@-~])"
_STRING = r"\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"
_SHORT = r"\x1b[ -/]*[0-Z`-~]"
_TOKEN = re.compile(rf"{_CSI}|{_STRING}|{_SHORT}|(?P<text>[^\x00-\x1f\x7f-\x9f]+)|(?P<control>\r+|\n|\x08+|[\x00-\x1f\x7f-\x9f])")
#: An escape sequence that may still be completed by the next chunk.
_OPEN_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|[\]PX^_][^\x07\x1b]*(?:\x1b)?|[ -/]*)\Z")


def window_size(stream: Optional[IO[Any]] = None) -> Tuple[int, int]:
    """(columns, rows) of the terminal ``stream`` is on (what the person watching sees), else the defaults.

    The child draws for this window; a bar drawn wider than the terminal that
    echoes it would wrap, and each ``\\r`` redraw would leave a line behind.
    """
    try:
        size = os.get_terminal_size(stream.fileno()) if stream is not None else None
    except (OSError, ValueError, AttributeError):
        size = None
    if size is None or size.columns <= 0 or size.lines <= 0:
        return DEFAULT_COLUMNS, DEFAULT_ROWS
    return size.columns, size.lines


def open_pty(columns: int = DEFAULT_COLUMNS, rows: int = DEFAULT_ROWS) -> Optional[Tuple[int, int]]:
    """A pseudo-terminal (master, slave) of ``columns`` x ``rows``, LF not turned into CR LF; None if none can be made.

    The size matters: a pty made without one reports 0 columns, and programs
    then draw for no width at all (Ultralytics stops fitting its line, rich
    falls back to 80). See the module docstring for how to run a child on it.
    """
    try:
        master, slave = os.openpty()
    except OSError:
        return None
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        attributes = termios.tcgetattr(slave)
        attributes[1] &= ~termios.ONLCR  # oflag: keep the program's own line ends
        termios.tcsetattr(slave, termios.TCSANOW, attributes)
    except (OSError, termios.error):
        os.close(master)
        os.close(slave)
        return None
    return master, slave


class TerminalLines:
    """A child's bytes, fed as they come, read back as display lines (see the module docstring).

    Thread-safe: the output reader thread calls :meth:`feed`, the supervisor loop :meth:`tail`.
    """

    def __init__(self, tail_lines: int = TAIL_LINES) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # an escape sequence split across chunks
        self._line: List[str] = []
        self._shown: Optional[str] = ""  # the line's text, None when it changed since it was last made
        self._cursor = 0
        self._reported = ""  # the current line's state as last returned by feed()
        self._finished: Deque[str] = collections.deque(maxlen=max(1, tail_lines))
        self._states: List[str] = []
        self._work_left = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> List[str]:
        """The display states this chunk completed, in order: each line ended by ``\\n``, each state a redraw
        replaced, and the unfinished line as it stands at the chunk's end (when it changed), so a bar that stops
        at step k is read at k. Each state is reported once; trailing blanks are stripped; empty ones are left out.
        """
        with self._lock:
            text = self._pending + self._decoder.decode(bytes(data))
            self._pending = ""
            opened = _OPEN_ESCAPE.search(text, max(0, len(text) - MAX_ESCAPE_CHARS))
            if opened is not None:
                # An escape open for longer than the cap falls out of the searched window: its ESC is then read as
                # a lone control character (nothing shown) and what follows it as text.
                text, self._pending = text[: opened.start()], text[opened.start() :]
            self._work_left = REDRAW_WORK_PER_CHAR * len(text) + MAX_LINE_CHARS
            for token in _TOKEN.finditer(text):
                self._take(token)
            self._report(redraw=False)
            states, self._states = self._states, []
        return states

    def tail(self, count: int) -> List[str]:
        """The last ``count`` non-blank display lines, the unfinished one (a bar's last state) included."""
        with self._lock:
            lines = [line for line in list(self._finished) + [self._text()] if line.strip()]
        return lines[-count:] if count > 0 else []

    def _take(self, token: re.Match[str]) -> None:
        kind = token.lastgroup  # "final" for a CSI sequence; None for the other escapes, which show nothing
        if kind == "text":
            self._write(token.group(kind))
        elif kind == "control":
            self._control(token.group(kind))
        elif kind == "final":
            self._csi(token.group("params"), token.group("final"))

    def _write(self, text: str) -> None:
        end = min(self._cursor + len(text), MAX_LINE_CHARS)
        text = text[: max(0, end - self._cursor)]
        if not text:
            return
        if self._cursor > len(self._line):
            self._line.extend(" " * (self._cursor - len(self._line)))
        self._line[self._cursor : end] = text
        self._cursor, self._shown = end, None

    def _control(self, char: str) -> None:
        """A control character, or a run of carriage returns or backspaces."""
        if char == "\n":
            self._end_line()
        elif char[0] == "\r":  # a run of them is one
            self._report()
            self._cursor = 0
        elif char[0] == "\b":
            self._cursor = max(0, self._cursor - len(char))
        elif char == "\t":
            self._write("\t")
        # every other control character (BEL, NUL, C1 controls) displays nothing

    def _csi(self, params: str, final: str) -> None:
        count = _first_number(params, default=1)
        if final == "K":  # erase in line: 0 to the end, 1 from the start, 2 all; what it erases was shown
            self._report()
            mode = _first_number(params, default=0)
            if mode == 0:
                del self._line[self._cursor :]
            elif mode == 1:
                end = self._cursor + 1  # the cursor's own cell included (ECMA-48)
                if end >= len(self._line) or self._work_left <= 0:
                    self._line = []  # all of it blank; past the chunk's budget a hostile stream loses the rest too
                else:
                    self._line[:end] = " " * end
                    self._work_left -= end
            else:
                self._line = []
            self._shown = None
        elif final == "D":
            self._cursor = max(0, self._cursor - count)
        elif final == "C":
            self._cursor = min(MAX_LINE_CHARS, self._cursor + count)
        elif final == "G":
            self._cursor = min(MAX_LINE_CHARS, max(0, count - 1))
        elif final in "AF":
            self._up(count, keep_column=final == "A")
        # colours (m), cursor visibility (?25l/h) and the rest change nothing on the line

    def _up(self, count: int, keep_column: bool) -> None:
        """Cursor up ``count`` rows: the line above becomes the one being drawn (the current one is left behind)."""
        self._report()
        self._cursor = min(self._cursor, MAX_LINE_CHARS) if keep_column else 0
        moved = min(count, len(self._finished))
        if not moved:
            return  # already on the top line kept: the line stays as it is, and costs nothing more
        for _ in range(moved):
            above = self._finished.pop()
            self._line = list(above) if self._work_left > 0 else []  # past the chunk's budget: redrawn blank
            self._work_left -= len(above)
        self._shown = None
        self._reported = self._text()  # the line restored: as long as its copy, which the budget paid for

    def _end_line(self) -> None:
        self._report(redraw=False)
        self._finished.append(self._text())
        self._line, self._shown, self._cursor, self._reported = [], "", 0, ""

    def _report(self, redraw: bool = True) -> None:
        """Report the line's state if it changed; a redraw's only within the chunk's budget."""
        if redraw and self._shown is None:
            if self._work_left <= 0:
                return
            self._work_left -= len(self._line)
        state = self._text()
        if state and state != self._reported:
            self._states.append(state)
        self._reported = state

    def _text(self) -> str:
        if self._shown is None:
            self._shown = "".join(self._line).rstrip()
        return self._shown


def _first_number(params: str, default: int) -> int:
    """The first parameter of a CSI sequence (``"2;5"`` -> 2), ``default`` when absent or 0 where 0 means 1."""
    head = params.split(";", 1)[0].lstrip("?>=<")
    if not head.isdigit():
        return default
    value = int(head[:6])  # a six-digit count already exceeds every line and tail
    return value if value or default == 0 else default
