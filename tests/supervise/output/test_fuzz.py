"""Whatever a child prints: no exception, bounded memory, time linear in what it wrote (Hypothesis and hostile streams)."""

from __future__ import annotations

import time
import tracemalloc
from typing import List

import pytest

from tests.reading import read_stream
from trainbox.supervise.output.progress import MAX_READ_CHARS, OutputProgress, ProgressPatternError, read, user_pattern
from trainbox.supervise.output.terminal import MAX_LINE_CHARS, TAIL_LINES, TerminalLines

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Pieces of what terminals get: controls, escape sequences (whole and cut), UTF-8 cut in two, bar characters, counters.
PIECES = [
    b"\r",
    b"\n",
    b"\r\n",
    b"\b",
    b"\t",
    b"\x07",
    b"\x00",
    b"\x1b",
    b"\x1b[",
    b"\x1b[2K",
    b"\x1b[K",
    b"\x1b[1K",
    b"\x1b[3A",
    b"\x1b[999999F",
    b"\x1b[5D",
    b"\x1b[12C",
    b"\x1b[40G",
    b"\x1b[?25l",
    b"\x1b[1;32m",
    b"\x1b]0;title\x07",
    b"\x1b]8;;",
    b"\x1b\\",
    b"\x1bP",
    b"\x1b(B",
    b"\x9b",
    b"\xe2\x94",
    b"\x81",
    b"\xe2\x94\x81" * 5,
    b"\xff",
    b" 45%|",
    b"| 45/100 [",
    b"00:04<00:05, 9.80it/s]",
    b"Epoch 3",
    b": ",
    b"12/100 ",
    b"step=",
    b"1200",
    b"Class Images Instances",
    b"{'epoch': 0.5}",
    b"x" * 300,
]
STREAMS = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=64)), max_size=200)
LINES = st.lists(
    st.sampled_from(
        [
            "Epoch",
            " ",
            "3",
            "/",
            "10",
            ":",
            "%",
            "|",
            "━",
            "─",
            "[",
            "]",
            "00:01",
            "step",
            "=",
            "iter",
            "{'epoch': ",
            "'",
            "}",
            "Class",
            "Instances",
            "\t",
            "it/s",
            "4.5k",
            "?",
            "Validation",
            "train: ",
            "9" * 30,
            "#",
        ]
    ),
    max_size=60,
).map("".join)


def consumed(chunks: List[bytes]) -> TerminalLines:
    lines = TerminalLines()
    for chunk in chunks:
        for state in lines.feed(chunk):
            assert 0 < len(state) <= MAX_LINE_CHARS and state == state.rstrip()
    return lines


@settings(max_examples=300, deadline=None)
@given(STREAMS, st.integers(min_value=1, max_value=64))
def test_terminal_lines_take_any_bytes(pieces: List[bytes], size: int) -> None:
    data = b"".join(pieces)
    lines = consumed([data[i : i + size] for i in range(0, len(data), size)])
    tail = lines.tail(TAIL_LINES + 5)
    assert len(tail) <= TAIL_LINES + 1 and all(len(line) <= MAX_LINE_CHARS for line in tail)
    # the display does not depend on how the bytes were cut
    assert consumed([data]).tail(30) == lines.tail(30)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(LINES, st.text(max_size=200)), max_size=30))
def test_output_progress_takes_any_lines(lines: List[str]) -> None:
    progress = OutputProgress()
    for number, line in enumerate(lines):
        beat = progress.observe(line, float(number))
        if beat is not None:
            places = {"phase", "epoch", "epochs", "batch", "batches", "step", "pattern"}
            assert set(beat) <= places | {"counter", "side_step", "side_total", "timeout"}
            assert any(key in beat for key in ("epoch", "batch", "step"))
            assert all(isinstance(value, (int, float, str)) for value in beat.values())
    assert progress.advances <= progress.recognised <= len(lines)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.text(max_size=80))
def test_a_user_pattern_is_taken_or_refused_in_one_line(text: str, line: str) -> None:
    try:
        pattern = user_pattern(text)
    except ProgressPatternError as refused:
        assert "\n" not in refused.message.replace(repr(text), "")
        return
    read(line, [pattern])


HOSTILE_LINES = [
    "|" * MAX_READ_CHARS,
    ":" * MAX_READ_CHARS,
    " " * (MAX_READ_CHARS - 4) + "1/2 ",
    "━" * MAX_READ_CHARS,
    "1/" * 2048,
    ": 1% " + "━" * 4000,
    "step" + " " * 4090 + "x",
    "epoch" + " " * 4090,
    "{'" + "x" * 4000,
    "a: |" * 1024,
    "9" * 5000,
    "Epoch 1: 5%|━| 1/2 [" * 200,
    "1%|" * 1365,
    "[0:00" * 819,
]


@pytest.mark.parametrize("line", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_a_long_hostile_line_is_read_in_linear_time(line: str) -> None:
    started = time.perf_counter()
    read(line)
    assert time.perf_counter() - started < 0.5  # about 5 ms here; a quadratic scan of 4 KiB takes about 300 ms


#: Streams that would grow an unbounded reader past MEMORY_BOUND: 4 MB each.
GROWING = {
    "no newline": b"x" * (4 << 20),
    "unterminated OSC": b"\x1b]0;" + b"t" * (4 << 20),
    "long lines": (b"y" * 4000 + b"\n") * 1024,
}
#: The tail (200 lines of at most 4 KiB), one chunk's text and its states, as str: under a megabyte and a half.
MEMORY_BOUND = 2 << 20


@pytest.mark.parametrize("name", sorted(GROWING))
def test_a_growing_stream_keeps_memory_bounded(name: str) -> None:
    tracemalloc.start()
    try:
        read_stream(GROWING[name])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"{name}: {peak} bytes"


#: Streams where each byte or two is a control: 256 KiB each.
STORMS = {
    "carriage returns over a long line": b"x" * MAX_LINE_CHARS + b"\rX" * (128 << 10),
    "cursor-up storm": (b"x" * MAX_LINE_CHARS + b"\n") * 30 + b"\x1b[A\n" * (64 << 10),
    "backspaces": b"x" * MAX_LINE_CHARS + b"\bX" * (128 << 10),
    "empty lines": b"\n" * (256 << 10),
}


@pytest.mark.parametrize("name", sorted(STORMS))
def test_a_control_storm_is_read_in_linear_time(name: str) -> None:
    elapsed = read_stream(STORMS[name])
    # linear: under a second here; making every control cost a 4 KiB line would take minutes
    assert elapsed < 30, f"{name}: {elapsed:.1f} s"
