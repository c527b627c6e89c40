"""A child's output read as the supervisor's reader reads it, for the tests and the benches that time or bound it."""

from __future__ import annotations

import time
from typing import Callable

from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.reader import READ_BYTES
from trainbox.supervise.output.terminal import TerminalLines


def read_stream(data: bytes, clock: Callable[[], float] = time.perf_counter) -> float:
    """Feed ``data`` as the reader does (``READ_BYTES`` at a time), every display state to OutputProgress; the time
    it took by ``clock`` (wall by default; ``time.process_time`` for CPU)."""
    lines, progress = TerminalLines(), OutputProgress()
    started = clock()
    for start in range(0, len(data), READ_BYTES):
        for state in lines.feed(data[start : start + READ_BYTES]):
            progress.observe(state, 0.0)
    return clock() - started
