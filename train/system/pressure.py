"""What can make a run slow, read from /proc: other processes' CPU, the kernel's pressure, swap, iowait, the tree.

A run that has slowed down (:mod:`trainbox.supervise.pace.detector`) is explained by
what changed on the machine since it ran at its pace
(:mod:`trainbox.diagnose.slowness`). This module reads those facts. A
:class:`Snapshot` is one moment (:func:`take`); two of them give rates
(:func:`compare` -> :class:`Pressure`):

* **CPU of every process outside the run** (``/proc/<pid>/stat`` utime + stime,
  in clock ticks), the top :data:`TOP_OUTSIDE` by % of one core with pid, start
  and name (enough that a baseline knows each busy neighbour, so that what
  changed can be told from what was always there), and the run tree's own
  share. The process taking the snapshot (the supervisor) is the observer,
  counted in neither;
* **PSI**, the kernel's pressure stall information (``/proc/pressure/cpu``,
  ``memory``, ``io``: the ``some avg10`` share of the last 10 s in which some
  task waited for that resource; Linux >= 4.20 with ``CONFIG_PSI``);
* **swap-in** (``/proc/vmstat`` ``pswpin``, pages) and **iowait**
  (``/proc/stat``'s ``cpu`` line: the share of all CPU time spent idle with I/O
  outstanding);
* the run tree's **RSS** and its anonymous part (``/proc/<pid>/status``
  ``VmRSS``, ``RssAnon``: a leak grows the anonymous part, while a memory-mapped
  dataset's pages come and go with the page cache), its **major page faults**
  (``/proc/<pid>/stat`` ``majflt``: pages read back from disk, its swapped-out
  memory or its mapped files evicted under memory pressure; swap-in counts only
  the former, and a machine without swap thrashes through the latter) and its
  **read bytes** (``/proc/<pid>/io`` ``read_bytes``: what reached the block device);
* how long the run's processes **waited for a CPU** (``/proc/<pid>/schedstat``'s
  run delay, of each process's main thread: the Python loop that steps), the
  direct measure of CPU contention: a run that sleeps or waits on a GPU loses
  nothing to a busy neighbour, a CPU-bound one waits in the run queue;
* the **memory cgroup** of the run's root process, its usage against its limit
  and how often it hit that limit (:mod:`trainbox.system.memcg`).

Every reader answers None (or leaves the process out) where a file is missing
or unreadable (no PSI in the kernel, ``/proc/<pid>/io`` of another user, a
process that ended meanwhile): nothing here raises. Processes are told apart by
pid and start time, so a pid recycled between two snapshots is a new process; a
new process's whole CPU time and reads fall within the interval.

Limits: RSS counts pages shared between forked DataLoader workers once per
process (PSS would need ``smaps_rollup``, which walks page tables: too slow for a
poll); a process that ended between two snapshots takes its CPU and reads with
it; iowait is machine-wide, not the dataset disk's.

Cost: one snapshot reads one ``stat`` per process: 7.5 ms of CPU (13-15 ms of
wall time at a load of 4) with 300 processes on the 2-core development machine,
median of 50; :func:`compare` 0.3 ms. ``cost_s`` carries each snapshot's own
figure for ``bench/``. Take one every few seconds, not every poll.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, Optional, Tuple

from trainbox.system import memcg
from trainbox.system.memcg import MemoryLimit

#: Processes outside the run that a Pressure keeps, busiest first: every busy neighbour of a shared machine (this
#: development machine's 2 cores: rarely more than 10 above 1 % of a core), so that a baseline's list holds them.
TOP_OUTSIDE = 20
#: The PSI resources read (``/proc/pressure/<name>``).
PSI_RESOURCES = ("cpu", "memory", "io")
#: ``/proc/stat``'s ``cpu`` line: user nice system idle iowait irq softirq steal (guest and guest_nice follow and
#: are already counted in user and nice, so they are left out of the total).
_CPU_FIELDS = 8
_IOWAIT_FIELD = 4
#: ``/proc/<pid>/stat`` fields after the name's closing parenthesis (0: the state, field 3 of the line).
_MAJFLT, _UTIME, _STIME, _STARTTIME = 9, 11, 12, 19
_KIB = 1024


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return 100  # USER_HZ on every Linux architecture


CLOCK_TICKS = _clock_ticks()


# --- parsers: pure, total, never raise ------------------------------------------------------------------------


def parse_stat(text: str) -> Optional[Tuple[str, int, int, int]]:
    """``/proc/<pid>/stat`` -> (name, start time in ticks after boot, CPU ticks user + system, major faults), None
    if malformed.

    The name may hold spaces and parentheses: it runs from the first "(" to the last ")".
    """
    opened, closed = text.find("("), text.rfind(")")
    if opened < 0 or closed < opened:
        return None
    fields = text[closed + 1 :].split()
    try:
        cpu = int(fields[_UTIME]) + int(fields[_STIME])
        return text[opened + 1 : closed], int(fields[_STARTTIME]), cpu, int(fields[_MAJFLT])
    except (IndexError, ValueError):
        return None


def parse_psi_some_avg10(text: str) -> Optional[float]:
    """``/proc/pressure/<resource>`` -> the ``some avg10`` percentage, None if absent."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] != ["some"]:
            continue
        for word in words[1:]:
            name, _, value = word.partition("=")
            if name == "avg10":
                return _number(value)
    return None


def parse_key_value(text: str, key: str) -> Optional[int]:
    """The whole number after ``key`` on its line (``/proc/vmstat`` ``pswpin 12``, ``/proc/<pid>/io``
    ``read_bytes: 4096``, ``/proc/<pid>/status`` ``VmRSS:  1234 kB``), None if absent."""
    for line in text.splitlines():
        name, _, rest = line.partition(":") if ":" in line else line.partition(" ")
        if name.strip() == key:
            words = rest.split()
            value = _number(words[0]) if words else None
            return int(value) if value is not None and value >= 0 and value == int(value) else None
    return None


def parse_run_delay(text: str) -> Optional[int]:
    """``/proc/<pid>/schedstat`` (``on-CPU ns, run-queue wait ns, timeslices``) -> the wait, None if malformed."""
    words = text.split()
    return int(words[1]) if len(words) >= 2 and words[1].isdigit() else None


def parse_cpu_line(text: str) -> Optional[Tuple[int, int]]:
    """``/proc/stat`` -> (all CPU time, iowait), in ticks summed over CPUs; None if its ``cpu`` line is missing."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["cpu"]:
            try:
                values = [int(word) for word in words[1 : 1 + _CPU_FIELDS]]
            except ValueError:
                return None
            return (sum(values), values[_IOWAIT_FIELD]) if len(values) > _IOWAIT_FIELD else None
    return None


def _number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


# --- reading /proc -----------------------------------------------------------------------------------------------


#: The most read of one /proc file: every file read here is far smaller (``/proc/vmstat``: about 8 KiB).
_READ_LIMIT = 64 * 1024


def _read(path: str) -> Optional[str]:
    """A small /proc file's text, None when unreadable (one os.read: under half of open()'s cost per file, and a
    snapshot reads one per process)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, _READ_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Process:
    """One process at one moment: its name, start (ticks after boot), CPU ticks and major page faults so far."""

    name: str
    started: int
    cpu_ticks: int
    major_faults: int = 0


def _processes(proc: str) -> Dict[int, Process]:
    found: Dict[int, Process] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            parsed = parse_stat(_read(f"{proc}/{entry}/stat") or "")
            if parsed is not None:
                found[int(entry)] = Process(*parsed)
    return found


@dataclass(frozen=True)
class Snapshot:
    """The machine and the run tree at one moment (``ts``: monotonic seconds)."""

    ts: float
    tree: FrozenSet[int]
    observer: int
    processes: Dict[int, Process]
    psi: Dict[str, Optional[float]]
    pswpin: Optional[int]
    cpu: Optional[Tuple[int, int]]
    tree_rss_bytes: Optional[int]
    #: read_bytes of each tree process whose /proc/<pid>/io is readable.
    tree_read: Dict[int, int] = field(default_factory=dict)
    #: The anonymous part of the tree's RSS (``RssAnon``), None where unreadable.
    tree_anon_bytes: Optional[int] = None
    #: The memory cgroup of the run's root process (None: not asked, or unreadable).
    memory_limit: Optional[MemoryLimit] = None
    #: Run-queue delay (ns) of each tree process's main thread whose schedstat is readable.
    tree_run_delay: Dict[int, int] = field(default_factory=dict)
    #: Seconds this snapshot took to read.
    cost_s: float = 0.0


def take(tree: Iterable[int], proc: str = "/proc", root: Optional[int] = None) -> Snapshot:
    """Read a snapshot; ``tree``: the pids of the run (the supervisor's tree scan), ``root``: the one whose memory
    cgroup is read. Never raises."""
    started = time.monotonic()
    pids = frozenset(tree)
    statuses = [_read(f"{proc}/{pid}/status") or "" for pid in pids]
    delays = {pid: parse_run_delay(_read(f"{proc}/{pid}/schedstat") or "") for pid in pids}
    reads = {pid: parse_key_value(_read(f"{proc}/{pid}/io") or "", "read_bytes") for pid in pids}
    return Snapshot(
        ts=time.monotonic(),
        tree=pids,
        observer=os.getpid(),
        processes=_processes(proc),
        psi={name: parse_psi_some_avg10(_read(f"{proc}/pressure/{name}") or "") for name in PSI_RESOURCES},
        pswpin=parse_key_value(_read(f"{proc}/vmstat") or "", "pswpin"),
        cpu=parse_cpu_line(_read(f"{proc}/stat") or ""),
        tree_rss_bytes=_total_kib(statuses, "VmRSS"),
        tree_read={pid: value for pid, value in reads.items() if value is not None},
        tree_anon_bytes=_total_kib(statuses, "RssAnon"),
        memory_limit=memcg.read(root, proc) if root is not None else None,
        tree_run_delay={pid: value for pid, value in delays.items() if value is not None},
        cost_s=time.monotonic() - started,
    )


def _total_kib(statuses: Iterable[str], key: str) -> Optional[int]:
    """The sum, in bytes, of ``key`` (kB) over ``/proc/<pid>/status`` texts; None when no text has it."""
    known = [kib for kib in (parse_key_value(text, key) for text in statuses) if kib is not None]
    return sum(known) * _KIB if known else None


# --- rates -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutsideProcess:
    pid: int
    name: str
    cpu_pct: float  # % of one core over the interval
    #: Its start (ticks after boot): with the pid, who it is (a pid may be reused between a baseline and now).
    started: int = 0


@dataclass(frozen=True)
class Pressure:
    """Rates between two snapshots. CPU in % of one core (200 % = two cores busy); None: not readable here."""

    interval_s: float
    outside: Tuple[OutsideProcess, ...]
    outside_cpu_pct: float
    tree_cpu_pct: float
    psi: Dict[str, Optional[float]]
    swap_in_per_s: Optional[float]
    iowait_pct: Optional[float]
    tree_rss_bytes: Optional[int]
    tree_read_bytes_per_s: Optional[float]
    #: The tree's major page faults per second (pages read back from disk), None where unreadable.
    tree_major_faults_per_s: Optional[float] = None
    tree_anon_bytes: Optional[int] = None
    #: The run's memory cgroup at the end of the interval, and how often it hit its limit per second meanwhile.
    memory_limit: Optional[MemoryLimit] = None
    limit_hits_per_s: Optional[float] = None
    #: % of the interval the tree's main threads waited for a CPU, summed (two processes waiting all along: 200).
    tree_wait_pct: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def _used(before: Dict[int, Process], pid: int, now: Process) -> Tuple[int, int]:
    """CPU ticks and major faults ``pid`` had since ``before``: all of them for a process that was not there (or a
    recycled pid)."""
    old = before.get(pid)
    if old is None or old.started != now.started:
        return now.cpu_ticks, now.major_faults
    return now.cpu_ticks - old.cpu_ticks, now.major_faults - old.major_faults


def _grown(before: Optional[int], after: Optional[int]) -> Optional[int]:
    return after - before if before is not None and after is not None and after >= before else None


def compare(before: Snapshot, after: Snapshot, top: int = TOP_OUTSIDE) -> Pressure:
    """What the machine did between two snapshots (``after`` later; a zero interval counts as a tick)."""
    seconds = max(after.ts - before.ts, 1.0 / CLOCK_TICKS)
    per_pct = 100.0 / CLOCK_TICKS / seconds
    outside, tree_ticks, tree_faults = [], 0, 0
    for pid, process in after.processes.items():
        ticks, faults = (max(0, n) for n in _used(before.processes, pid, process))
        if pid in after.tree:
            tree_ticks += ticks
            tree_faults += faults
        elif pid != after.observer and ticks:
            outside.append(OutsideProcess(pid, process.name, round(ticks * per_pct, 1), process.started))
    outside.sort(key=lambda p: (-p.cpu_pct, p.pid))
    swapped = _grown(before.pswpin, after.pswpin)
    cpu_total = _grown(before.cpu[0] if before.cpu else None, after.cpu[0] if after.cpu else None)
    iowait = _grown(before.cpu[1] if before.cpu else None, after.cpu[1] if after.cpu else None)
    read = sum(max(0, value - before.tree_read.get(pid, 0)) for pid, value in after.tree_read.items())
    return Pressure(
        interval_s=round(seconds, 3),
        outside=tuple(outside[:top]),
        outside_cpu_pct=round(sum(p.cpu_pct for p in outside), 1),
        tree_cpu_pct=round(tree_ticks * per_pct, 1),
        psi=dict(after.psi),
        swap_in_per_s=round(swapped / seconds, 1) if swapped is not None else None,
        iowait_pct=round(100.0 * iowait / cpu_total, 1) if iowait is not None and cpu_total else None,
        tree_rss_bytes=after.tree_rss_bytes,
        tree_read_bytes_per_s=round(read / seconds, 1) if after.tree_read else None,
        tree_major_faults_per_s=round(tree_faults / seconds, 1) if after.tree & after.processes.keys() else None,
        tree_anon_bytes=after.tree_anon_bytes,
        memory_limit=after.memory_limit,
        limit_hits_per_s=_limit_hits(before.memory_limit, after.memory_limit, seconds),
        tree_wait_pct=_waited(before, after, seconds),
    )


def _waited(before: Snapshot, after: Snapshot, seconds: float) -> Optional[float]:
    """% of ``seconds`` the tree's main threads waited in a run queue (processes seen in both snapshots only)."""
    common = [pid for pid in after.tree_run_delay if pid in before.tree_run_delay]
    if not common:
        return None
    waited = sum(max(0, after.tree_run_delay[pid] - before.tree_run_delay[pid]) for pid in common)
    return round(100.0 * waited / 1e9 / seconds, 1)


def _limit_hits(before: Optional[MemoryLimit], after: Optional[MemoryLimit], seconds: float) -> Optional[float]:
    """How often per second the cgroup hit its limit between two readings of the same cgroup."""
    if before is None or after is None or before.path != after.path or before.hits is None or after.hits is None:
        return None
    return round(max(0, after.hits - before.hits) / seconds, 1)
