"""Crash-safe file writes: temp file in the same directory, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]

#: mkstemp creates 0600 files; a replaced file keeps its mode, a new one gets the usual 0644.
NEW_FILE_MODE = 0o644


def fsync_path(path: PathLike) -> None:
    """fsync a file or, to persist a rename, the directory that holds the entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: PathLike, mode: str = "wb", fsync: bool = True) -> Iterator[IO]:
    """Yield a file that replaces ``path`` only once it is completely written.

    Until the rename, readers see the previous content (or no file); a crash
    leaves at most a stray ``.<name>.*.tmp`` beside it, never a torn file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, target.stat().st_mode & 0o7777 if target.exists() else NEW_FILE_MODE)
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
        if fsync:
            fsync_path(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: PathLike, text: str, fsync: bool = True) -> None:
    with atomic_writer(path, "w", fsync=fsync) as handle:
        handle.write(text)
