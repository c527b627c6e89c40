"""Ctrl-C, SIGTERM and SIGHUP for the host's long commands (``invoke train``, ``build``, ``logs -f``...).

Why trainbox installs its own handlers instead of relying on ``KeyboardInterrupt``:
a process started in the background by a shell without job control (``cmd &`` in
a script, a CI runner, a ``nohup`` wrapper) inherits SIGINT *ignored*, and Python
then installs no SIGINT handler at all (``signal.getsignal(SIGINT)`` is
``SIG_IGN``). A ``kill -INT`` (or a terminal's Ctrl-C reaching it later) is then
silently dropped while the main thread streams container logs: that was issue
#13's "Ctrl-C is lost, the run trains on". SIGTERM, Python's default, ends the
process without running any cleanup, so a stopped ``invoke`` would leave its
container training and its temporary files behind.

Inside :func:`stop_requests` every one of those signals raises
:class:`StopRequested` in the main thread, whatever it is blocked in (a socket
read inside the Docker SDK, a sleep, a file write). The first one starts the
orderly stop; the caller may catch a second one to force it (``invoke train``
kills the container at once). The exit status is the shell's ``128 + N``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator, Optional, Sequence

from trainbox.errors import ExitCode

#: The signals that mean "stop", to the host's tasks and to the supervisor alike: a terminal's Ctrl-C,
#: ``kill``/``docker stop``, a closed terminal.
STOP_SIGNALS: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: A scheduler's warning before its time limit (``sbatch --signal=USR2@120``): "stop at the next checkpoint", for the
#: supervisor (:mod:`trainbox.slurm.warning`). Its child starts with it ignored: a scheduler sends it to every process
#: of the job, and its default action would kill a rank that has no handler of its own.
WARNING_SIGNAL = signal.SIGUSR2


class StopRequested(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt, so ``except Exception`` lets it pass."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        #: What the stop ended, for the one line the user sees ("the build of trainbox:cpu"); see :func:`on_stop`.
        self.what: Optional[str] = None

    @property
    def exit_code(self) -> int:
        """The shell's status for a command ended by this signal: 130 for Ctrl-C, 143 for SIGTERM."""
        return ExitCode.for_signal(self.signum)

    @property
    def name(self) -> str:
        """``Ctrl-C`` for SIGINT, else the signal's name."""
        return signal_name(self.signum)


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``), as a stop is told to a person."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _raise(signum: int, _frame: Any) -> None:
    raise StopRequested(signum)


@contextlib.contextmanager
def stop_requests(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Within the block, each of ``signals`` raises :class:`StopRequested`; the previous handlers come back after.

    A block left by a :class:`StopRequested` leaves the signals ignored instead: the stop decided the
    outcome, and the caller only reports it and exits.

    Outside the main thread (where Python cannot install handlers) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise) for sig in signals}
    stopped = False
    try:
        yield
    except StopRequested:
        stopped = True
        raise
    finally:
        # After a stop the process only reports it and exits: another Ctrl-C could then only break
        # that (invoke turns a KeyboardInterrupt into exit 1, a default SIGTERM skips the rest).
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if stopped else handler)


class _Naming:
    """The context manager of :func:`on_stop`: a class whose ``__exit__`` returns None, so type
    checkers know it never swallows an exception (a ``contextlib.contextmanager`` might)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[type], stop: Optional[BaseException], traceback: Any) -> None:
        if isinstance(stop, StopRequested):
            stop.what = stop.what or self.what


def on_stop(what: str) -> _Naming:
    """Name what a :class:`StopRequested` raised in the block stopped, unless an inner block already did."""
    return _Naming(what)


def message(stop: StopRequested, command: str) -> str:
    """The one line printed when ``command`` ends on a stop signal."""
    return f"{command}: stopped {stop.what or 'before it finished'} ({stop.name})"
