"""Find and end every process a child started, including ones that escaped.

A training child's tree holds DataLoader workers, compile helpers and, now and
then, a process that called ``setsid`` or whose parent died. Two mechanisms
keep all of them in reach:

* the supervisor makes itself a *child subreaper* (``prctl``), so an orphaned
  descendant is re-parented to the supervisor instead of to PID 1;
* :class:`ProcessTree` remembers every descendant it has seen (pid plus
  creation time, so a recycled pid is not mistaken for it) and keeps
  signalling those until they are gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any, Dict, Iterable, List, Tuple

import psutil

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants; False where the kernel or libc refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessTree:
    """The processes that descend from ``root_pid``, as far as ever observed."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.leader_pgid = root_pid
        self._seen: Dict[Tuple[int, float], psutil.Process] = {}
        self.scan()

    def _remember(self, proc: psutil.Process) -> None:
        try:
            self._seen.setdefault((proc.pid, proc.create_time()), proc)
        except psutil.Error:
            pass

    def scan(self) -> List[psutil.Process]:
        """Record the current descendants and orphans we adopted; return all live ones."""
        try:
            root = psutil.Process(self.root_pid)
            self._remember(root)
            for proc in root.children(recursive=True):
                self._remember(proc)
        except psutil.Error:
            pass
        for orphan in self._adopted_orphans():
            self._remember(orphan)
            try:
                for proc in orphan.children(recursive=True):
                    self._remember(proc)
            except psutil.Error:
                pass
        return self.alive()

    def _adopted_orphans(self) -> Iterable[psutil.Process]:
        """Our children other than the root: descendants re-parented to us, the subreaper.

        The supervisor starts nothing else that outlives a call (diagnostic
        tools are waited for), so every other child of ours came from this tree.
        """
        try:
            return [p for p in psutil.Process().children() if p.pid != self.root_pid]
        except psutil.Error:
            return []

    def alive(self) -> List[psutil.Process]:
        return [p for p in self._seen.values() if _alive(p)]

    def signal_all(self, signum: int) -> None:
        try:
            os.killpg(self.leader_pgid, signum)
        except OSError:
            pass
        for proc in self.scan():
            try:
                proc.send_signal(signum)
            except psutil.Error:
                pass

    def terminate(self, grace: float, poll: float = 0.05) -> Dict[str, List[int]]:
        """SIGTERM everything, SIGKILL what is left after ``grace`` s; return what happened.

        Rescans while waiting, so a process forked during shutdown is caught too.
        Returns ``{"terminated": [...], "killed": [...], "survivors": [...]}`` (pids).
        """
        started = self.scan()
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.scan() and time.monotonic() < deadline:
            self.reap()
            time.sleep(poll)
        killed = [p.pid for p in self.scan()]
        for _ in range(50):
            if not self.scan():
                break
            self.signal_all(signal.SIGKILL)
            self.reap()
            time.sleep(poll)
        self.reap()
        survivors = [p.pid for p in self.alive()]
        return {
            "terminated": sorted({p.pid for p in started} - set(killed)),
            "killed": sorted(killed),
            "survivors": survivors,
        }

    def reap(self) -> None:
        """Collect exit statuses of adopted orphans (the root is reaped by its Popen)."""
        for pid, _ in list(self._seen):
            if pid == self.root_pid:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            except OSError:
                pass


def describe(procs: Iterable[psutil.Process]) -> List[Dict[str, Any]]:
    """One record per process: what an incident report needs to see who was stuck where."""
    rows = []
    for proc in procs:
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                rows.append(
                    {
                        "pid": proc.pid,
                        "ppid": proc.ppid(),
                        "pgid": os.getpgid(proc.pid),
                        "sid": os.getsid(proc.pid),
                        "status": proc.status(),
                        "name": proc.name(),
                        "cmdline": proc.cmdline(),
                        "threads": proc.num_threads(),
                        "cpu_user_s": round(cpu.user, 2),
                        "cpu_system_s": round(cpu.system, 2),
                        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                        "started": round(proc.create_time(), 2),
                    }
                )
        except (psutil.Error, OSError):
            continue
    return rows


def caught_signals(pid: int) -> int:
    """The ``SigCgt`` mask of ``pid``: bit n-1 set means signal n has a handler."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0
