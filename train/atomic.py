"""Crash-safe file writes: temp file in the same directory, fsync, rename.

The temp file is ``.<name>.<random>.tmp`` beside the target and its writer
holds an exclusive ``flock`` on it until the rename. A kill -9 leaves the temp
file behind but always releases the lock (the kernel drops it with the
process), so :func:`remove_stale_temps` can tell a dead writer's leftover (a
4 GB half bundle) from a temp file another process is writing right now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Iterator, List, Optional, Union

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
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the fd closes: marks the temp file as alive
        if permissions is None:
            permissions = target.stat().st_mode & 0o7777 if target.exists() else NEW_FILE_MODE & ~current_umask()
        os.fchmod(fd, permissions)
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
            os.replace(tmp, target)  # still locked: remove_stale_temps cannot take it mid-rename
        if fsync:
            fsync_path(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_stale_temps(path: PathLike) -> List[Path]:
    """Delete the temp files that dead :func:`atomic_writer` calls for ``path`` left behind; return them.

    A temp file whose lock can be taken has no live writer; one that is locked is left alone.
    """
    target = Path(path)
    # mkstemp's random part: 8 characters of [a-z0-9_].
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.tmp")
    removed: List[Path] = []
    if not target.parent.is_dir():
        return removed  # nothing written there yet (atomic_writer creates the directory)
    for candidate in sorted(found for found in target.parent.iterdir() if pattern.fullmatch(found.name)):
        try:
            fd = os.open(candidate, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its writer is alive
        else:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
        finally:
            os.close(fd)
    return removed


def write_text_atomic(path: PathLike, text: str, fsync: bool = True, permissions: Optional[int] = None) -> None:
    with atomic_writer(path, "w", fsync=fsync, permissions=permissions) as handle:
        handle.write(text)
