"""One supervisor per run directory: an advisory lock held for the supervisor's life.

Two supervisors on one run directory would overwrite each other's heartbeat,
state and checkpoints and kill each other's children as "stalled". So the
supervisor takes an exclusive ``flock`` on ``RunDir.lock`` before it writes
anything and keeps the descriptor open until it exits; the kernel releases
the lock however the process ends (exit, SIGKILL, OOM kill), so a stale lock
never needs cleaning up. The holder writes its pid into the file, which is
only ever read to name the holder in the refusal.

``flock`` locks belong to the open file description: the descriptor is
opened close-on-exec, so the training child never inherits the lock and
cannot keep it after its supervisor is gone.

The lock file is opened through :mod:`trainbox.rundir.safe`: a ``supervisor.lock``
that is a link, a FIFO, a folder or has another hard link is refused in one
line (exit 2) and nothing is written (issue 33 item 3: a link to ``last.pt``
left 4 bytes of the checkpoint, holding a pid).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Optional

from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import Open, Refusal


class RunLock:
    """The lock on one run directory; ``acquire()`` it, ``release()`` it (or let the process end)."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        """Take the lock, or raise UserError naming the supervisor that holds it (or the refusal). Writes nothing
        when refused."""
        path = self.run_dir.lock
        opened = self.run_dir.files.open_fd(path, Open.LOCK)
        if opened.value is None:
            refusal = opened.refused or Refusal.UNREADABLE
            raise UserError(f"{refusal.line(path)}: the run directory cannot be locked; move it away and run again")
        fd = opened.value
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{self.run_dir.root} is already supervised by pid {holder}: stop that supervisor or give another --run-dir"
            ) from None
        self._fd = fd
        # Only a message depends on the pid: a full disk must not stop the run here (it is reported where it matters).
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def _holder(fd: int) -> str:
    """The pid the holder wrote, or "unknown" (it may not have written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
