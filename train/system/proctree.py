"""Find and end every process a child started, including ones that escaped.

A training child's tree holds DataLoader workers, compile helpers and, now and
then, a process that called ``setsid`` or whose parent died. Two mechanisms
keep all of them in reach:

* the supervisor makes itself a *child subreaper* (``prctl``), so an orphaned
  descendant is re-parented to the supervisor instead of to PID 1;
* :class:`ProcessTree` remembers every descendant it has seen (pid plus
  creation time, so a recycled pid is not mistaken for it) and keeps
  signalling those until they are gone. Which of our children are adopted
  orphans of the tree is told by start ticks (:func:`start_ticks`, the kernel's
  count since boot), never by wall-clock start times, which a clock step moves.

And two keep the tree from outliving the supervisor or hanging it:

* :func:`die_with_parent` arms ``PR_SET_PDEATHSIG`` in the child before it
  execs, so a supervisor killed with SIGKILL (the OOM killer, a dropped SSH
  session's kill) takes its child along instead of leaving it training
  unsupervised (and :mod:`trainbox.system.guard` ends the rest of its session:
  a forkserver, its workers, the resource tracker);
* a process that outlives SIGKILL is stuck in the kernel (state D, as in a hung
  GPU driver): :func:`stuck` describes it for the one line that asks for a reboot.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

import psutil

from trainbox.errors import Stuck
from trainbox.system import gpu_state, guard

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def become_subreaper() -> bool:
    """Adopt orphaned descendants; False where the kernel or libc refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that has the child SIGKILLed when the process that forked it dies.

    The kernel sends the death signal when the *thread* that forked the child
    ends, so call ``Popen`` from the main thread (the supervisor does). The
    function runs in the forked child before exec, where only async-signal-safe
    work is sound: libc's ``prctl`` is looked up here, in the parent, and the
    child only calls it. (subprocess warns that ``preexec_fn`` can deadlock when
    other threads hold locks at fork time; the supervisor forks between attempts,
    after the previous attempt's output thread has ended.) If the parent died
    between fork and prctl, the child is already orphaned and kills itself.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


#: The pid of the process that forks right now, as :func:`tie_to_parent`'s hook in the child sees it (a copy).
_forking_parent = 0


def _note_parent() -> None:
    global _forking_parent
    _forking_parent = os.getpid()


def tie_to_parent() -> None:
    """Have the kernel SIGKILL this process when its parent's thread that started it ends, and each process it forks
    from now on (and they in turn) when the one that forked it ends.

    For a process trainbox starts inside a training process without exec'ing it (the forkserver,
    :mod:`trainbox.yolo.forkserver_tie`): its DataLoader workers watch only the forkserver, which lives as long as
    a worker holds its pipe, so neither would ever end after the training process died. A child whose parent died
    between its fork and its ``prctl`` is orphaned already, and kills itself.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != _forking_parent:
            os.kill(os.getpid(), signal.SIGKILL)

    os.register_at_fork(before=_note_parent, after_in_child=arm)


#: Whether the kernel lists each thread's children (``/proc/PID/task/TID/children``, CONFIG_PROC_CHILDREN).
#: Reading those costs a few file reads per process of the tree; psutil's ``children()`` reads the
#: stat of every process on the machine (hundreds on a workstation), which the evidence sampler
#: (:mod:`trainbox.diagnose.evidence`) would pay every few seconds.
_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _child_pids(pid: int) -> List[int]:
    found: List[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue  # the thread ended
    return found


def children(proc: psutil.Process) -> List[psutil.Process]:
    """The direct children of ``proc`` (none when it is gone)."""
    if _CHILDREN_FILES:
        return _processes(_child_pids(proc.pid))
    try:
        return proc.children()
    except psutil.Error:
        return []


def descendants(proc: psutil.Process) -> List[psutil.Process]:
    """Every process below ``proc`` (none when it is gone)."""
    if not _CHILDREN_FILES:
        try:
            return proc.children(recursive=True)
        except psutil.Error:
            return []
    found: Dict[int, None] = {}  # ordered, and a set
    pending = [proc.pid]
    while pending:
        for child in _child_pids(pending.pop()):
            if child not in found:
                found[child] = None
                pending.append(child)
    return _processes(found)


def _processes(pids: Iterable[int]) -> List[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue  # ended since it was listed
    return found


#: /proc/<pid>/stat's fields after "(comm)": the state is the first, starttime (clock ticks after boot) the 20th.
_STARTTIME_FIELD = 19
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22); None when it is gone.

    Unlike a start time on the wall clock (psutil's ``create_time``, computed from the boot time the kernel
    reports, which moves when the clock is stepped), this never changes for a process: with :func:`boot_id` it
    names one process for good.
    """
    stat = _proc_text(pid, "stat")
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[_STARTTIME_FIELD])
    except (IndexError, ValueError):
        return None


def boot_id() -> str:
    """This boot's random id: start ticks are comparable within one boot only."""
    try:
        with open(BOOT_ID) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _started_at_or_after(proc: psutil.Process, ticks: Optional[int]) -> bool:
    started = start_ticks(proc.pid)
    return ticks is not None and started is not None and started >= ticks


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _group(proc: psutil.Process) -> Optional[int]:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


class ProcessTree:
    """The processes that descend from ``root_pid``, as far as ever observed.

    ``foreign_groups`` names process groups of our own that are not part of the tree although they are children
    of ours started after it (the ``--notify`` commands in flight: ``Notifier.groups``); it is asked after the
    children are listed, so a process listed is one it knows of.
    """

    def __init__(self, root_pid: int, foreign_groups: Callable[[], FrozenSet[int]] = frozenset) -> None:
        self.root_pid = root_pid
        self.leader_pgid = root_pid
        self._foreign_groups = foreign_groups
        self._seen: Dict[Tuple[int, float], psutil.Process] = {}
        self._root_started = start_ticks(root_pid)
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
            for proc in descendants(root):
                self._remember(proc)
        except psutil.Error:
            pass
        for orphan in self._adopted_orphans():
            self._remember(orphan)
            for proc in descendants(orphan):
                self._remember(proc)
        return self.alive()

    def _adopted_orphans(self) -> Iterable[psutil.Process]:
        """Our children other than the root, started after it: descendants re-parented to us, the subreaper.

        The supervisor starts nothing else that outlives a call, except its guard (:mod:`trainbox.system.guard`), a
        diagnostic tool it gave up on (a ``rocm-smi`` hung in the driver,
        :func:`trainbox.system.gpu_state.abandoned`) and the notifiers (``foreign_groups``), which are
        not part of any tree; every other child of ours that started after the root came from this tree.
        (A process that embeds the supervisor, such as the test suite, may have older children of its own: not ours.)
        """
        own_tools = gpu_state.abandoned() | guard.GUARD.pids()
        try:
            later = [
                p
                for p in children(psutil.Process())
                if p.pid != self.root_pid and p.pid not in own_tools and _started_at_or_after(p, self._root_started)
            ]
        except psutil.Error:
            return []
        if not later:
            return later
        foreign = self._foreign_groups()  # after the listing: every notifier listed is registered by now
        return [p for p in later if _group(p) not in foreign] if foreign else later

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

    def continue_stopped(self) -> List[int]:
        """SIGCONT to every process of the tree that is stopped (state T: SIGSTOP, a job-control stop); their pids.

        A stopped process keeps a SIGTERM pending and cannot act on it: without this the whole grace was spent
        waiting for it (30 s of every kill of a frozen tree). A tracer's stop (``t``) is left to the tracer.
        """
        woken = []
        for proc in self.scan():
            try:
                if proc.status() == psutil.STATUS_STOPPED:
                    proc.send_signal(signal.SIGCONT)
                    woken.append(proc.pid)
            except psutil.Error:
                continue
        return woken

    def terminate(self, grace: float, poll: float = 0.05) -> Dict[str, List[int]]:
        """SIGTERM everything, SIGCONT the stopped, SIGKILL what is left after ``grace`` s; return what happened.

        Rescans while waiting, so a process forked (or stopped) during shutdown is caught too.
        Returns ``{"terminated": [...], "killed": [...], "survivors": [...], "continued": [...]}`` (pids;
        ``continued``: stopped processes woken so that they act on the SIGTERM).
        """
        started = self.scan()
        self.signal_all(signal.SIGTERM)
        continued = set(self.continue_stopped())  # right after SIGTERM: it is the first thing they see
        deadline = time.monotonic() + grace
        while self.scan() and time.monotonic() < deadline:
            self.reap()
            continued.update(self.continue_stopped())
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
            "continued": sorted(continued),
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
                        **_ranks(proc),
                    }
                )
        except (psutil.Error, OSError):
            continue
    return rows


#: The variables torchrun gives each rank (and which its DataLoader workers inherit): whose stack is whose.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK")


def _ranks(proc: psutil.Process) -> Dict[str, int]:
    """``rank``, ``local_rank`` and ``group_rank`` (the node) from the process's environment, where torchrun set them."""
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return {}
    found = {}
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            found[name.lower()] = int(value)
    return found


def _proc_text(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text().strip()
    except OSError:
        return ""


def kernel_state(pid: int) -> Dict[str, Any]:
    """What the kernel says ``pid`` is doing: its state letter (R, S, D, T ...), ``wchan`` (where it waits) and name."""
    stat = _proc_text(pid, "stat")
    # /proc/PID/stat is "pid (comm) state ...": the name may hold spaces and parentheses, the state follows the last ")".
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return {"pid": pid, "state": state, "wchan": _proc_text(pid, "wchan") or "?", "name": _proc_text(pid, "comm") or "?"}


def stuck(pids: Iterable[int]) -> Stuck:
    """The error for processes that survived SIGKILL: pid, state, ``wchan`` (where in the kernel) and name.

    Its message is the one line the user reads; ``.processes`` goes into the ``give_up`` event.
    """
    processes = [kernel_state(pid) for pid in pids]
    shown = ", ".join(f"pid {p['pid']} ({p['name']}, state {p['state']}, wchan {p['wchan']})" for p in processes)
    if any(p["state"] == "D" for p in processes):
        message = f"a process is stuck in the GPU driver (D state): reboot needed; {shown} survived SIGKILL"
    else:
        message = f"a process survived SIGKILL: reboot needed; {shown}"
    return Stuck(message, processes)


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
