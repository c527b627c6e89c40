"""A watch that outlives the supervisor: every attempt's session ends with it, however the supervisor dies.

The supervisor's child dies with it (:func:`trainbox.system.proctree.die_with_parent`), but not what that child
started. A forkserver (trainbox's fast profile uses one) is a child of the training process, its DataLoader workers
are children of the forkserver, and each watches only its own parent, while the forkserver lives as long as a worker
holds its "alive" pipe, and multiprocessing's resource tracker as long as any of them holds its pipe: after a SIGKILL
of the supervisor (the OOM killer, a dropped SSH session's kill) four processes stay alive, re-parented to PID 1,
for ever. ``PR_SET_PDEATHSIG`` cannot be armed in processes trainbox does not start, and would fire on the death of
the *thread* that forked them.

So the supervisor starts one small process of its own, the guard (:class:`SessionGuard`), before its first attempt,
holding the write end of a pipe that is the guard's stdin. Each attempt runs in a session of its own (the id is its
root's pid, :func:`trainbox.supervise.attempt.start`), which everything it starts stays in unless it calls
``setsid`` itself: the supervisor tells the guard each session as the attempt starts (``+SID``) and as its tree has
been ended (``-SID``). When the pipe ends (the supervisor exited, by whatever signal) the guard SIGKILLs every process
still in a session it holds, until none is left, and exits; a supervisor that ended its trees has released them all,
and the guard only exits. The guard ignores the signals a terminal sends its group (Ctrl-C, a hang-up), so it is
there when they end the supervisor, and a scheduler's warning (:data:`trainbox.interrupt.WARNING_SIGNAL`), which
Slurm sends every process of a job step.

A session id is a pid the kernel does not hand out again while any process of that session lives, so a session held
names only the attempt's processes. The guard's side (:func:`main`) imports nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import IO, FrozenSet, Iterable, List, Optional, Set

from trainbox import module_command
from trainbox.interrupt import WARNING_SIGNAL

#: How long the guard keeps killing after the supervisor died (a tree that forks as it is killed), polling this often.
KILL_FOR_S, KILL_POLL_S = 5.0, 0.05


def session_of(stat: str) -> Optional[int]:
    """The session id in the text of ``/proc/PID/stat`` (the fourth field after the command's closing parenthesis)."""
    fields = stat[stat.rfind(")") + 1 :].split()
    return int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else None


def in_sessions(sessions: Set[int]) -> List[int]:
    """The pids of the live processes in ``sessions`` (zombies included: they are gone once their parent reaps them)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/stat") as handle:
            if session_of(handle.read()) in sessions and int(name) != os.getpid():
                found.append(int(name))
    return found


def kill_sessions(sessions: Set[int], for_s: float = KILL_FOR_S) -> None:
    """SIGKILL every process in ``sessions`` until none is left alive, for ``for_s`` at most."""
    deadline = time.monotonic() + for_s
    while sessions and time.monotonic() < deadline:
        alive = in_sessions(sessions)
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(KILL_POLL_S)


def held(lines: Iterable[str]) -> Set[int]:
    """The sessions still held after reading the supervisor's ``+SID`` and ``-SID`` lines (anything else is passed over)."""
    sessions: Set[int] = set()
    for line in lines:
        sign, number = line[:1], line[1:].strip()
        if sign in "+-" and number.isdigit():
            (sessions.add if sign == "+" else sessions.discard)(int(number))
    return sessions


def main() -> int:
    """The guard: read the supervisor's lines from stdin until it ends, then end the sessions still held."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, WARNING_SIGNAL):
        signal.signal(signum, signal.SIG_IGN)
    sessions = held(sys.stdin)
    kill_sessions(sessions)
    return 0


class SessionGuard:
    """The supervisor's side: starts the guard once, then tells it each attempt's session (see the module)."""

    def __init__(self) -> None:
        self._pipe: Optional[IO[str]] = None
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> None:
        """Start the guard, once (before the first attempt: it is no orphan of any attempt's tree)."""
        if self.process is not None:
            return
        self.process = subprocess.Popen(
            module_command("trainbox.system.guard"),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._pipe = self.process.stdin

    def pids(self) -> FrozenSet[int]:
        """The guard's pid, when it runs (it is the supervisor's own child, never part of an attempt's tree)."""
        return frozenset({self.process.pid}) if self.process is not None else frozenset()

    def _say(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(line + "\n")
            self._pipe.flush()
        except (OSError, ValueError):  # the guard is gone (killed from outside): the attempts run on unguarded
            self._pipe = None

    def hold(self, session: int) -> None:
        """The session ``session`` is an attempt's: ended with the supervisor, whatever ends it."""
        self._say(f"+{session}")

    def release(self, session: int) -> None:
        """The attempt's tree in ``session`` has been ended: nothing of it is the guard's any more."""
        self._say(f"-{session}")


#: The supervisor process's one guard (a process that runs several supervisors, as the tests do, shares it).
GUARD = SessionGuard()


if __name__ == "__main__":
    raise SystemExit(main())
