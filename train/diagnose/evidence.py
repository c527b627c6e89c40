"""Evidence about a silent child, sampled from outside: psutil and /proc only, nothing injected.

While a child is silent the supervisor calls :meth:`Sampler.sample` every
:data:`SAMPLE_EVERY_S` seconds and adds each :class:`Sample` to a
:class:`~trainbox.diagnose.window.Window` (cleared at every beat). A sample holds, per process of the
tree (:class:`trainbox.system.proctree.ProcessTree`, adopted ``setsid`` orphans
included):

* CPU time (user + system), the process state (R/S/D) and every thread's state,
  the ``wchan`` (where in the kernel it sleeps) of the main thread and of every
  thread in D state, and the I/O counters where ``/proc/PID/io`` is readable
  (characters read and written, and written alone: ``wchar``);
* whether it is a compiler (:data:`COMPILERS`, or an Inductor compile worker);

and for the tree as a whole the size and file count of each kernel cache
(:func:`trainbox.system.caches.watched`), with the tree's processes that hold a file
under a cache that changed since the last sample open (``/proc/PID/fd``: only then, so a
quiet cache costs nothing), and the GPU memory of the tree's processes where
``nvidia-smi`` or ``rocm-smi`` answers (at most every :data:`GPU_EVERY_S`). Inside a
container those tools name processes by their pids on the host, which match no process
here (NVIDIA/nvidia-docker#1483; ``NSpid`` in ``/proc/PID/status`` does not help from
inside a pid namespace: it lists the inner pid only). When no pid of the answer is a
process here with the same name, per-process memory is unknown (not 0) and the
device's used memory (``--query-gpu=memory.used``) stands in (:class:`GpuMemory`).

The :class:`trainbox.diagnose.window.Window` turns samples into the judgements the supervisor acts on;
this module only takes them.

Cost (CPU time of the sampling thread, median of 50 samples; measured on the
2-core development machine at a load of 7, Python 3.11): a 10-process tree costs
2.8 ms with no kernel cache, 5.4 ms with a 500-file cache, 6.0 ms for a torch
main process with 9 DataLoader workers (20 threads) and a 500-file cache, and
14.6 ms when a cache holds more than the walk's cap (:data:`CACHE_WALK_LIMIT`).
The cache walk costs about 4 us per entry and dominates; /proc costs about 0.25 ms
per process. ``Sample.cost_s`` carries the figure for bench/. Samples are taken
only while the child is silent, so a beating run pays nothing.

Call :meth:`Sampler.sample` from the thread that scans the tree: it calls
``tree.scan()`` to see new compiler processes, and runs nvidia-smi/rocm-smi as
children of this process.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.system import caches, gpu_memory, gpu_state, proctree

#: Seconds between samples while the child is silent. A beat interval is seconds to minutes; 2 s
#: resolves a compiler process that lives a few seconds and keeps the cost near 0.5 % of a core.
SAMPLE_EVERY_S = 2.0

#: Process names that mean a compiler (or its linker/assembler) is running: GCC and Clang
#: drivers and their workers, the ROCm and CUDA compilers, and the tools Triton calls.
COMPILERS = frozenset(
    {
        "cc", "gcc", "c++", "g++", "cc1", "cc1plus", "as", "collect2", "ld", "ld.bfd", "ld.gold",
        "clang", "clang++", "ld.lld", "lld", "llc", "opt", "hipcc", "nvcc", "cicc", "ptxas", "fatbinary",
        "nvlink", "clang-offload-bundler",
    }
)  # fmt: skip
#: What a command line holds when the process is one of torch Inductor's compile workers (its
#: SubprocPool sidecar runs ``torch/_inductor/compile_worker/__main__.py``; the pool's workers fork from it).
COMPILE_WORKER_MARK = "torch/_inductor/compile_worker"

#: Entries walked per cache directory and sample: bounds the walk to about 12 ms (4 us per entry for
#: scandir plus stat, measured). A bigger cache is reported as at least this many files (``capped``), and its
#: growth is still seen through the files walked first (directories are walked newest first).
CACHE_WALK_LIMIT = 3000

#: Seconds between GPU queries, and how long one may take: nvidia-smi costs tens of ms, and one
#: that does not answer (a hung driver) is not asked again by this sampler.
GPU_EVERY_S = 10.0
GPU_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ProcSample:
    """One process at one moment."""

    pid: int
    ppid: int
    started: float  # start, seconds after boot (/proc/PID/stat): with pid, tells a recycled pid from the same process
    name: str
    cmdline: str  # first 200 characters
    cpu_s: float  # user + system, all threads
    demand_s: Optional[float]  # run time + run-queue wait of the live threads (schedstat); None when unreadable
    state: str  # R, S, D, Z, T... (the /proc letter)
    threads: Dict[str, int]  # thread state letter -> count
    wchan: str  # the main thread's, "" when unreadable or running
    blocked: Tuple[Tuple[int, str], ...]  # (tid, wchan) of threads in D state
    io_chars: Optional[int]  # rchar + wchar (every read/write, cached or not); None when unreadable
    io_disk: Optional[int]  # read_bytes + write_bytes (what reached the block device)
    compiler: bool
    io_written: Optional[int] = None  # wchar: characters written (a cache's growth is this tree's when these grow)

    @property
    def key(self) -> Tuple[int, float]:
        return (self.pid, self.started)


@dataclass(frozen=True)
class CacheSample:
    """One kernel-cache directory: which variable named it, its size and file count."""

    var: str  # e.g. "TORCHINDUCTOR_CACHE_DIR", or "TORCHINDUCTOR_CACHE_DIR (default)"
    path: str
    files: int
    bytes: int
    newest: float  # latest mtime of the files walked: shows growth in a cache too big to count
    capped: bool  # the walk stopped at CACHE_WALK_LIMIT entries
    opened_by: Tuple[int, ...] = ()  # the tree's processes with a file under it open (looked at only when it changed)


@dataclass(frozen=True)
class Sample:
    ts: float  # time.monotonic() when taken
    procs: Tuple[ProcSample, ...]
    caches: Tuple[CacheSample, ...]
    #: {"source", "memory_mib": {pid: MiB}, "utilisation_pct"}; inside a container, where the tool's pids are the
    #: host's, {"source", "host_pids": True, "used_mib", "utilisation_pct"} (trainbox.system.gpu_memory); or {"error"}
    gpu: Optional[Dict[str, Any]]
    cost_s: float  # CPU time (this thread) the sample took
    wall: float = 0.0  # time.time() when taken: dates the sample against kernel messages; 0.0 when unknown
    boot: float = 0.0  # seconds since boot when taken (the clock of ProcSample.started): ages processes

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """The sample :meth:`to_dict` wrote (after a JSON round trip): evidence.json read back, test fixtures."""
        procs = tuple(
            ProcSample(**dict(p, blocked=tuple((int(tid), str(wchan)) for tid, wchan in p["blocked"]))) for p in data["procs"]
        )
        caches = tuple(CacheSample(**dict(c, opened_by=tuple(c.get("opened_by", ())))) for c in data["caches"])
        return cls(
            ts=data["ts"],
            procs=procs,
            caches=caches,
            gpu=data.get("gpu"),
            cost_s=data.get("cost_s", 0.0),
            wall=data.get("wall", 0.0),
            boot=data.get("boot", 0.0),
        )

    def proc(self, key: Tuple[int, float]) -> Optional[ProcSample]:
        for proc in self.procs:
            if proc.key == key:
                return proc
        return None


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _state_of(stat: str) -> str:
    # /proc/PID/stat is "pid (comm) state ...": comm may hold spaces and parentheses, so split after the last ")".
    rest = stat.rsplit(")", 1)[-1].split()
    return rest[0] if rest else "?"


def _threads(pid: int) -> Tuple[Dict[str, int], Tuple[Tuple[int, str], ...], Optional[float]]:
    """Thread states of ``pid`` (counts), the wchan of its threads in D state, and their CPU demand.

    Demand is time on a CPU plus time waiting for one (``schedstat``'s first two fields, ns): a
    spinning thread on a loaded machine gets a third of a core but demands a whole one, so busy is
    judged by demand, not by CPU time.
    """
    counts: Dict[str, int] = {}
    blocked: List[Tuple[int, str]] = []
    demand: Optional[int] = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return counts, (), None
    for tid in tids:
        state = _state_of(_read(f"/proc/{pid}/task/{tid}/stat"))
        counts[state] = counts.get(state, 0) + 1
        if state == "D":
            blocked.append((int(tid), _read(f"/proc/{pid}/task/{tid}/wchan").strip() or "?"))
        fields = _read(f"/proc/{pid}/task/{tid}/schedstat").split()
        if demand is not None and len(fields) >= 2:
            demand += int(fields[0]) + int(fields[1])
        else:
            demand = None
    return counts, tuple(blocked), demand / 1e9 if demand is not None else None


def _io(pid: int) -> Tuple[Optional[int], Optional[int], Optional[int]]:
    """(rchar + wchar, read_bytes + write_bytes, wchar) from /proc/PID/io; Nones where unreadable (another user's)."""
    fields: Dict[str, int] = {}
    for line in _read(f"/proc/{pid}/io").splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            fields[key] = int(value)
    try:
        return fields["rchar"] + fields["wchar"], fields["read_bytes"] + fields["write_bytes"], fields["wchar"]
    except KeyError:
        return None, None, None


#: The kernel keeps the first 15 characters of a process's name (``comm``).
_COMM_LENGTH = 15
_COMPILER_COMMS = frozenset(name[:_COMM_LENGTH] for name in COMPILERS)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def is_compiler(name: str, cmdline: str) -> bool:
    return name[:_COMM_LENGTH] in _COMPILER_COMMS or COMPILE_WORKER_MARK in cmdline


def _name(comm: str, cmdline: str) -> str:
    """The full name when ``comm`` is the kernel's truncation of the command's (as psutil does)."""
    program = os.path.basename(cmdline.split(" ", 1)[0]) if cmdline else ""
    return program if len(comm) == _COMM_LENGTH and program.startswith(comm) else comm


class _Cmdlines:
    """Command lines by (pid, start, comm): read once per process and exec, not every sample."""

    def __init__(self) -> None:
        self.known: Dict[Tuple[int, float, str], str] = {}

    def get(self, pid: int, started: float, comm: str) -> str:
        key = (pid, started, comm)
        if key not in self.known:
            self.known[key] = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:200]
        return self.known[key]

    def keep(self, pids: Sequence[int]) -> None:
        live = set(pids)
        self.known = {key: line for key, line in self.known.items() if key[0] in live}


def _proc_sample(pid: int, cmdlines: _Cmdlines) -> Optional[ProcSample]:
    """One process from /proc (psutil would read the same files several times over)."""
    stat = _read(f"/proc/{pid}/stat")
    head, _, tail = stat.rpartition(")")
    fields = tail.split()
    if len(fields) < 20:
        return None  # gone
    # Fields after "(comm)": state, ppid, ..., utime and stime (ticks) at 11 and 12, starttime at 19 (proc(5)).
    comm = head.partition("(")[2]
    started = int(fields[19]) / _TICKS_PER_S
    cmdline = cmdlines.get(pid, started, comm)
    threads, blocked, demand = _threads(pid)
    io_chars, io_disk, io_written = _io(pid)
    wchan = _read(f"/proc/{pid}/wchan").strip()
    name = _name(comm, cmdline)
    return ProcSample(
        pid=pid,
        ppid=int(fields[1]),
        started=started,
        name=name,
        cmdline=cmdline,
        cpu_s=round((int(fields[11]) + int(fields[12])) / _TICKS_PER_S, 3),
        demand_s=round(demand, 3) if demand is not None else None,
        state=fields[0],
        threads=threads,
        wchan="" if wchan == "0" else wchan,
        blocked=blocked,
        io_chars=io_chars,
        io_disk=io_disk,
        compiler=is_compiler(name, cmdline),
        io_written=io_written,
    )


def walk_cache(label: str, path: str, limit: int = CACHE_WALK_LIMIT) -> Optional[CacheSample]:
    """Files and bytes under ``path``, walking at most ``limit`` entries; None when it does not exist."""
    if not os.path.isdir(path):
        return None
    files = size = seen = 0
    newest = 0.0
    pending = [path]
    while pending and seen < limit:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                subdirs = []
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        break
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            subdirs.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            stat = entry.stat(follow_symlinks=False)
                            files += 1
                            size += stat.st_size
                            newest = max(newest, stat.st_mtime)
                    except OSError:
                        continue
        except OSError:
            continue
        # Oldest pushed first so the newest directory is walked next: when the walk is capped,
        # the directories a compile is writing now are the ones counted.
        pending.extend(p for _, p in sorted(subdirs))
    return CacheSample(label, path, files, size, newest, capped=seen > limit or bool(pending))


class _GpuPoller:
    """The GPU memory of each process and the GPUs' utilisation, at most every GPU_EVERY_S.

    Runs the tools synchronously (each bounded by GPU_TIMEOUT_S) in the sampling thread: a tool run
    from another thread would be a child of the supervisor, a subreaper, and could be mistaken
    for part of the training tree by a concurrent ``scan()``. A tool that does not answer is
    not asked again: the driver is likely hung, which the result says.
    """

    def __init__(self) -> None:
        self.last: Optional[Dict[str, Any]] = None
        self.asked = -GPU_EVERY_S
        self.given_up = False

    def poll(self, now: float) -> Optional[Dict[str, Any]]:
        if self.given_up or now - self.asked < GPU_EVERY_S:
            return self.last
        self.asked = now
        self.last = self._query()
        return self.last

    def _query(self) -> Optional[Dict[str, Any]]:
        asked = gpu_memory.ask(GPU_TIMEOUT_S)
        if asked is None:
            return None
        tool, answer = asked
        if not answer.ok:
            self.given_up = answer.hung
            return {"source": tool.name, "error": answer.text}
        use = gpu_state.query(tool.use_argv, GPU_TIMEOUT_S)
        pct = [int(v) for v in tool.use_pattern.findall(use.text)] if use is not None and use.ok else []
        memory = gpu_memory.memory_from(tool, answer, GPU_TIMEOUT_S)
        if memory.by_pid is None:  # the tool's pids are the host's (a container): only the devices' total is known
            return {"source": tool.name, "host_pids": True, "used_mib": memory.used_mib, "utilisation_pct": pct}
        return {"source": tool.name, "memory_mib": memory.by_pid, "utilisation_pct": pct}


#: File descriptors looked at per process when a cache changed (a torch process holds a few hundred).
MAX_FDS_LOOKED_AT = 4096


def opened_under(pids: Sequence[int], path: str) -> Tuple[int, ...]:
    """The processes among ``pids`` that hold a file (or folder) under ``path`` open (``/proc/PID/fd`` links)."""
    prefix = path.rstrip("/") + "/"
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")[:MAX_FDS_LOOKED_AT]
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target == path or target.startswith(prefix):
                found.append(pid)
                break
    return tuple(found)


def _changed(cache: CacheSample, before: Optional[CacheSample]) -> bool:
    return before is None or (cache.files, cache.bytes, cache.newest) != (before.files, before.bytes, before.newest)


class Sampler:
    """Samples one child's tree; ``env`` is the child's environment (it names the kernel caches)."""

    def __init__(self, tree: proctree.ProcessTree, env: Mapping[str, str]) -> None:
        self.tree = tree
        self.caches = caches.watched(env)
        self.gpu = _GpuPoller()
        self.cmdlines = _Cmdlines()
        self._caches: Dict[str, CacheSample] = {}

    def sample(self) -> Sample:
        started = time.thread_time()
        now = time.monotonic()
        pids = [p.pid for p in self.tree.scan()]
        self.cmdlines.keep(pids)
        procs = tuple(s for s in (_proc_sample(pid, self.cmdlines) for pid in pids) if s is not None)
        walked = [c for c in (walk_cache(label, path) for label, path in self.caches) if c is not None]
        caches = tuple(
            replace(c, opened_by=opened_under(pids, c.path)) if _changed(c, self._caches.get(c.var)) else c for c in walked
        )
        self._caches = {c.var: c for c in caches}
        gpu = self.gpu.poll(now)
        if gpu and "memory_mib" in gpu:
            gpu = dict(gpu, memory_mib={pid: mib for pid, mib in gpu["memory_mib"].items() if pid in pids})
        cost = round(time.thread_time() - started, 4)
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return Sample(ts=now, procs=procs, caches=caches, gpu=gpu, cost_s=cost, wall=time.time(), boot=boot)
