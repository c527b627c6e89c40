"""A child's output read as the supervisor's reader reads it, for the tests and the benches that time or bound it.

:func:`read_stream` times the reading of a stream; :func:`replay` feeds a recording (the chunks a pty's master gave,
each with the second it was read: tests/fixtures/corpus/) and says what the reader made of each display state.
Recordings are kept as ttyrec (:func:`load_ttyrec`): every chunk a 12-byte header (seconds, microseconds, length,
each a little-endian unsigned 32-bit int) before its bytes, the format ``ttyrec``/``ttyplay`` and asciinema's
converters read.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.reader import READ_BYTES
from trainbox.supervise.output.terminal import TerminalLines

#: One recorded chunk: the seconds since the program started when the master read it, and its bytes.
Chunk = Tuple[float, bytes]
_HEADER = struct.Struct("<III")


def read_stream(data: bytes, clock: Callable[[], float] = time.perf_counter) -> float:
    """Feed ``data`` as the reader does (``READ_BYTES`` at a time), every display state to OutputProgress; the time
    it took by ``clock`` (wall by default; ``time.process_time`` for CPU)."""
    lines, progress = TerminalLines(), OutputProgress()
    started = clock()
    for start in range(0, len(data), READ_BYTES):
        for state in lines.feed(data[start : start + READ_BYTES]):
            progress.observe(state, 0.0)
    return clock() - started


def ttyrec(chunks: Sequence[Chunk]) -> bytes:
    """``chunks`` as a ttyrec file's bytes (times to the microsecond)."""
    out = bytearray()
    for seconds, data in chunks:
        micros = round(seconds * 1e6)
        out += _HEADER.pack(micros // 10**6, micros % 10**6, len(data)) + data
    return bytes(out)


def load_ttyrec(path: Path) -> List[Chunk]:
    """The chunks of the ttyrec file at ``path``, in the order they were read."""
    data, chunks, at = path.read_bytes(), [], 0
    while at < len(data):
        seconds, micros, size = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        chunks.append((seconds + micros / 1e6, data[at : at + size]))
        at += size
    return chunks


@dataclass(frozen=True)
class Read:
    """One display state of a replay: when its chunk was read, the line, and the beat it gave (None: no progress)."""

    at: float
    line: str
    beat: Optional[Dict[str, Any]]


def replay(chunks: Sequence[Chunk], progress: Optional[OutputProgress] = None) -> List[Read]:
    """Every display state of ``chunks`` as the supervisor's reader meets it: each chunk through TerminalLines, each
    state to ``progress`` with the chunk's recorded time."""
    lines, progress = TerminalLines(), progress or OutputProgress()
    return [Read(at, state, progress.observe(state, at)) for at, data in chunks for state in lines.feed(data)]
