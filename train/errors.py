"""Errors and exit statuses: the one place both are defined.

Every failure a user can fix is a :class:`TrainboxError` that carries the one
line they read and the status the command exits with. Every front end — the
``trainbox`` CLI, the Ultralytics runner, the warm-up, the doctor and the
invoke tasks — reports it through :func:`line`, so the prefix is the same
everywhere and no traceback is ever shown for a user's mistake (the
``tests/`` that run commands with bad input assert exactly one line).

The supervisor's own running commentary (a restart, a stall's cause) is not an error either, but it takes the
same road: :func:`say` writes one ``trainbox: ...`` line on stderr, and a stderr that is gone never ends anything.
Each such line starts on a line of its own: a child's bar echoed without its newline is ended first by whoever
echoes it (:func:`before_say`; the supervisor's echo, :mod:`trainbox.supervise.output.reader`).

A stop signal is not an error: :mod:`trainbox.interrupt` reports it, with the
shell's status 128 + N (:meth:`ExitCode.for_signal`).
"""

from __future__ import annotations

import contextlib
import errno
import sys
from enum import IntEnum
from typing import Any, Callable, Dict, List, Optional, TextIO

PREFIX = "trainbox: error: "


class ExitCode(IntEnum):
    """What a trainbox command's exit status means (the supervisor's is the container's too)."""

    #: The run completed (or the command did what it was asked).
    OK = 0
    #: The supervisor gave up on the program's own failure: the same crash again, its restart budget spent on crashes,
    #: no progress it could read; or its predecessors hung too often (:mod:`trainbox.supervise.watchdog`); or a check
    #: found a problem (``doctor``, ``health``, ``verify``). Running it again as it is will not help.
    GAVE_UP = 1
    #: Bad input: what was asked cannot be done as asked. Nothing was started or changed.
    USAGE = 2
    #: Two attempts in a row ended before their first beat: a configuration error, not a stall.
    MISCONFIGURED = 3
    #: The disk holding the run directory is full: the run's history cannot be written. Free space, run again.
    DISK_FULL = 4
    #: A process of the run survived SIGKILL (stuck in the kernel, D state, as in a hung GPU driver): reboot.
    STUCK = 5
    #: The supervisor gave up on a hang (or a slowdown) that came back after its restarts: the program made progress
    #: before, so the machine may be at fault, and running the job again elsewhere (a requeue) may help.
    HUNG = 6
    #: Stopped at a checkpoint on the scheduler's warning before its time limit (Slurm's ``--signal``): started again
    #: (requeued), the run goes on from that checkpoint. sysexits.h's EX_TEMPFAIL, "try again later".
    INTERRUPTED = 75

    @staticmethod
    def is_final(code: int) -> bool:
        """Whether a command that *returned* ``code`` reached an outcome that running it again on this machine cannot
        change: completed, gave up (on crashes or on hangs: the supervisor already restarted it), bad input,
        misconfigured, a full disk and a process stuck in the kernel (both need a person first). A crash of the
        command itself (an uncaught exception exits 1 without returning; a kill is 128+N) is not final: a container
        engine may retry it (:mod:`trainbox.rundir.exit_record`); nor is a stop on the scheduler's warning, which is
        there to be started again."""
        return code in (
            ExitCode.OK,
            ExitCode.GAVE_UP,
            ExitCode.USAGE,
            ExitCode.MISCONFIGURED,
            ExitCode.DISK_FULL,
            ExitCode.STUCK,
            ExitCode.HUNG,
        )

    @staticmethod
    def for_signal(signum: int) -> int:
        """The shell's status for a command ended by signal ``signum``: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + int(signum)


class TrainboxError(Exception):
    """A failure with the one line the user reads and the status the command exits with."""

    code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, code: Optional[ExitCode] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else type(self).__name__


class UserError(TrainboxError):
    """A problem the user can fix: a bad argument, profile or dataset, no daemon, no image, no device."""


#: The errnos that mean "no room left": the disk is full, or the user's quota is spent.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(TrainboxError):
    """What must be kept (the run's history) cannot be written: the disk is full."""

    code = ExitCode.DISK_FULL

    @classmethod
    def writing(cls, path: object, error: OSError) -> DiskFull:
        return cls(
            f"the disk is full: cannot write {path} ({error.strerror}); free space and run again "
            "(training resumes from its last checkpoint)"
        )


class Stuck(TrainboxError):
    """A process of the run survived SIGKILL: it is stuck in the kernel, and only a reboot frees it."""

    code = ExitCode.STUCK

    def __init__(self, message: str, processes: List[Dict[str, Any]]) -> None:
        super().__init__(message)
        #: What each process was doing (pid, state, wchan, name), for the ``give_up`` event.
        self.processes = processes


def line(error: TrainboxError) -> str:
    """The one line that reports ``error``."""
    return PREFIX + error.message


def report(error: TrainboxError, stream: Optional[TextIO] = None) -> int:
    """Write ``error``'s line to stderr (or ``stream``) and return the status to exit with."""
    (stream or sys.stderr).write(line(error) + "\n")
    return int(error.code)


def _nothing() -> None:
    """Before a line, with no echo to end (see :func:`before_say`)."""


#: Called before each line :func:`say` writes (see :func:`before_say`).
_line_start: Callable[[], None] = _nothing


def before_say(hook: Callable[[], None]) -> None:
    """Call ``hook`` before each line :func:`say` writes: the echo of a child's output ends the line it left open."""
    global _line_start
    _line_start = hook


def say(message: str) -> None:
    """One line on stderr, on a line of its own; a stderr that is gone (a closed terminal) must not end supervision."""
    _line_start()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"trainbox: {message}\n")
        sys.stderr.flush()
