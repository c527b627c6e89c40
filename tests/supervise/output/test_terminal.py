"""TerminalLines reads bytes as a terminal lays them out; open_pty gives a child a terminal of a known size."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import subprocess
import sys
import termios
from typing import List

import pytest

from trainbox.supervise.output.terminal import (
    DEFAULT_COLUMNS,
    DEFAULT_ROWS,
    MAX_ESCAPE_CHARS,
    MAX_LINE_CHARS,
    REDRAW_WORK_PER_CHAR,
    TerminalLines,
    open_pty,
    window_size,
)


def fed(*chunks: bytes) -> List[str]:
    lines = TerminalLines()
    return [state for chunk in chunks for state in lines.feed(chunk)]


def test_lines_end_at_newline_and_crlf() -> None:
    assert fed(b"one\ntwo\r\nthree\n") == ["one", "two", "three"]


def test_each_redraw_state_is_reported_and_the_last_one_stays() -> None:
    lines = TerminalLines()
    assert lines.feed(b"\r 10%| 1/10\r 20%| 2/10\r 30%| 3/10") == [" 10%| 1/10", " 20%| 2/10", " 30%| 3/10"]
    assert lines.tail(5) == [" 30%| 3/10"]  # the bar never ended a line; its last state is the tail


def test_a_shorter_redraw_overwrites_only_what_it_covers_as_a_terminal_does() -> None:
    assert fed(b"abcdef\rXY\n") == ["abcdef", "XYcdef"]


def test_erase_in_line_and_backspace() -> None:
    assert fed(b"abcdef\r\x1b[Kxy\n") == ["abcdef", "xy"]  # Ultralytics' "\r\033[K"
    assert fed(b"abcdef\x1b[2K\rz\n") == ["abcdef", "z"]
    assert fed(b"abc\b\bX\n") == ["aXc"]
    assert fed(b"abcdef\x1b[3D\x1b[1KZ\n") == ["abcdef", "   Zef"]


def test_colours_titles_and_cursor_visibility_are_stripped() -> None:
    data = b"\x1b[?25l\x1b]0;title\x07\x1b[1m12/40\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m 3ms/step\x1b(B\x1b7\n"
    assert fed(data) == ["12/40 ━━ 3ms/step"]


def test_an_escape_split_across_chunks_is_held_until_it_ends() -> None:
    lines = TerminalLines()
    assert lines.feed(b"a\x1b[3") == ["a"]
    assert lines.feed(b"2mb\x1b]8;;http://x\x1b") == ["ab"]
    assert lines.feed(b"\\c\n") == ["abc"]


def test_utf8_split_across_chunks() -> None:
    bar = "━━".encode()
    assert fed(b"x" + bar[:1], bar[1:4], bar[4:] + b"\n")[-1] == "x━━"


def test_cursor_up_returns_to_the_line_above_to_redraw_it() -> None:
    # rich's live display: two lines, then back up and redraw both in place.
    lines = TerminalLines()
    lines.feed(b"Epoch 1 0/15\nValidation 0/5")
    lines.feed(b"\r\x1b[2K\x1b[1A\x1b[2KEpoch 1 15/15\nValidation 5/5")
    assert lines.tail(5) == ["Epoch 1 15/15", "Validation 5/5"]


class Counted(TerminalLines):
    """TerminalLines that counts its work: the characters of every line it lays out again from its cells."""

    made = 0

    def _text(self) -> str:
        if self._shown is None:
            self.made += len(self._line)
        return super()._text()


@pytest.mark.parametrize("above", [0, 30], ids=["no line above", "30 long lines above"])
@pytest.mark.parametrize("up", [b"\x1b[A", b"\x1b[F", b"\x1b[3A"])
def test_cursor_up_after_a_long_line_costs_what_the_bytes_asking_for_it_pay(up: bytes, above: int) -> None:
    lines = Counted()
    data = (b"y" * MAX_LINE_CHARS + b"\n") * above + b"x" * MAX_LINE_CHARS + up * 20_000
    for start in range(0, len(data), 65536):  # as the reader feeds it
        lines.feed(data[start : start + 65536])
    chunks = -(-len(data) // 65536)
    # a line each time would be 20,000 x 4 KiB: 82 M characters for 64 KiB of cursor-ups
    assert lines.made <= REDRAW_WORK_PER_CHAR * len(data) + 2 * MAX_LINE_CHARS * chunks, lines.made


def test_erase_to_the_start_of_a_line_from_its_end_blanks_it() -> None:
    assert fed(b"abc\x1b[1KZ\n", b"abcdef\x1b[1K\x1b[1K\x1b[2DZ\n") == ["abc", "   Z", "abcdef", "    Z"]


def test_tail_counts_only_nonblank_lines() -> None:
    lines = TerminalLines()
    lines.feed(b"a\n\n  \nb\nc")
    assert lines.tail(2) == ["b", "c"]
    assert lines.tail(0) == []


def test_tail_is_bounded() -> None:
    lines = TerminalLines(tail_lines=3)
    lines.feed(b"".join(b"line %d\n" % i for i in range(10)))
    assert lines.tail(10) == ["line 7", "line 8", "line 9"]


def test_a_line_without_end_is_cut_at_the_cap() -> None:
    lines = TerminalLines()
    lines.feed(b"x" * (MAX_LINE_CHARS * 3))
    assert lines.tail(1) == ["x" * MAX_LINE_CHARS]


def test_an_escape_that_never_ends_does_not_swallow_the_output() -> None:
    lines = TerminalLines()
    lines.feed(b"\x1b]0;" + b"t" * MAX_ESCAPE_CHARS)
    lines.feed(b"t" * 100 + b"\nvisible\n")
    assert lines.tail(1) == ["visible"]


def test_each_state_is_reported_once() -> None:
    lines = TerminalLines()
    assert lines.feed(b"\r 5/10") == [" 5/10"]
    assert lines.feed(b"\r 5/10") == []
    assert lines.feed(b"\r\n") == []


def test_window_size_is_the_default_off_a_terminal() -> None:
    assert window_size(io.StringIO()) == (DEFAULT_COLUMNS, DEFAULT_ROWS)
    assert window_size(None) == (DEFAULT_COLUMNS, DEFAULT_ROWS)


def test_open_pty_gives_a_sized_terminal_that_keeps_line_ends() -> None:
    pair = open_pty(132, 33)
    assert pair is not None
    master, slave = pair
    try:
        rows, columns = struct.unpack("HHHH", fcntl.ioctl(slave, termios.TIOCGWINSZ, b"\0" * 8))[:2]
        assert (columns, rows) == (132, 33)
        assert not termios.tcgetattr(slave)[1] & termios.ONLCR
        assert not os.get_inheritable(master)
    finally:
        os.close(master)
        os.close(slave)


def read_child(argv: List[str]) -> bytes:
    """Run ``argv`` on a new pty as the supervisor does and read its master until EIO."""
    pair = open_pty()
    if pair is None:
        pytest.fail("no pseudo-terminal on this machine")
    master, slave = pair
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.STDOUT, start_new_session=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child (every holder of the slave) is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        assert proc.wait(timeout=30) == 0
    return b"".join(chunks)


def test_a_child_on_the_pty_sees_a_terminal_of_that_size_and_is_read_to_its_end() -> None:
    probe = "import os, sys; print(sys.stdout.isatty(), sys.stderr.isatty(), os.get_terminal_size().columns)"
    assert read_child([sys.executable, "-c", probe]) == f"True True {DEFAULT_COLUMNS}\n".encode()
