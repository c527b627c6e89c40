"""Crash-safe file writes: temp file in the same directory, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

#: What open() asks for; the process umask takes its bits away (mkstemp alone would leave 0600).
NEW_FILE_MODE = 0o666


def current_umask() -> int:
    """This process's umask, read without changing it (Linux: /proc; else set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_path(path: PathLike) -> None:
    """fsync a file or, to persist a rename, the directory that holds the entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: PathLike, mode: str = "wb", fsync: bool = True, permissions: Optional[int] = None) -> Iterator[IO]:
    """Yield a file that replaces ``path`` only once it is completely written.

    Until the rename, readers see the previous content (or no file); a crash
    leaves at most a stray ``.<name>.*.tmp`` beside it, never a torn file. The
    file gets ``permissions`` when given (a secret: 0o600), else a replaced
    file keeps its mode and a new one gets 0o666 less the umask, as open() would.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if permissions is None:
            permissions = target.stat().st_mode & 0o7777 if target.exists() else NEW_FILE_MODE & ~current_umask()
        os.fchmod(fd, permissions)
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


def write_text_atomic(path: PathLike, text: str, fsync: bool = True, permissions: Optional[int] = None) -> None:
    with atomic_writer(path, "w", fsync=fsync, permissions=permissions) as handle:
        handle.write(text)
