"""Evidence about a silent child, sampled from outside: psutil and /proc only, nothing injected.

While a child is silent the supervisor calls :meth:`Sampler.sample` every
:data:`SAMPLE_EVERY_S` seconds and adds each :class:`Sample` to a
:class:`~trainbox.diagnose.window.Window` (cleared at every beat). A sample holds, per process of the
tree (:class:`trainbox.system.proctree.ProcessTree`, adopted ``setsid`` orphans
included):

* CPU time (user + system), the process state (R/S/D) and every thread's state,
  the ``wchan`` (where in the kernel it sleeps) of the main thread and of every
  thread in D state, and the I/O counters where ``/proc/PID/io`` is readable;
* whether it is a compiler (:data:`COMPILERS`, or an Inductor compile worker);

and for the tree as a whole the size and file count of each kernel cache
(:func:`trainbox.system.caches.watched`), and the GPU memory of the tree's processes where
``nvidia-smi`` answers (at most every :data:`GPU_EVERY_S`).

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
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.system import caches, gpu_state, proctree

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


@dataclass(frozen=True)
class Sample:
    ts: float  # time.monotonic() when taken
    procs: Tuple[ProcSample, ...]
    caches: Tuple[CacheSample, ...]
    gpu: Optional[Dict[str, Any]]  # {"source", "memory_mib": {pid: MiB}, "utilisation_pct"} or {"error"}
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
        caches = tuple(CacheSample(**c) for c in data["caches"])
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


def _io(pid: int) -> Tuple[Optional[int], Optional[int]]:
    """(rchar + wchar, read_bytes + write_bytes) from /proc/PID/io; Nones where unreadable (another user's process)."""
    fields: Dict[str, int] = {}
    for line in _read(f"/proc/{pid}/io").splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            fields[key] = int(value)
    try:
        return fields["rchar"] + fields["wchar"], fields["read_bytes"] + fields["write_bytes"]
    except KeyError:
        return None, None


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
    io_chars, io_disk = _io(pid)
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


#: ``rocm-smi --showpids`` rows: "PID  PROCESS NAME  GPU(s)  VRAM USED  SDMA USED  CU OCCUPANCY" (bytes; UNKNOWN
#: where the driver does not say), tab- or space-separated.
_ROCM_PID_ROW = re.compile(r"^(\d+)\s+(.*?)\s+(\d+)\s+(\d+|UNKNOWN|N/A)\s")
_ROCM_USE = re.compile(r"GPU use \(%\)\s*:\s*(\d+)")
_MIB = 2**20


def nvidia_memory(text: str) -> Dict[int, int]:
    """pid -> MiB from ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``."""
    memory: Dict[int, int] = {}
    for line in text.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and used.strip().isdigit():
            memory[int(pid)] = memory.get(int(pid), 0) + int(used)
    return memory


def rocm_memory(text: str) -> Dict[int, int]:
    """pid -> MiB of VRAM from ``rocm-smi --showpids`` (processes whose VRAM the driver does not report: 0)."""
    memory: Dict[int, int] = {}
    for line in text.splitlines():
        row = _ROCM_PID_ROW.match(line.strip() + " ")
        if row:
            memory[int(row[1])] = int(row[4]) // _MIB if row[4].isdigit() else 0
    return memory


@dataclass(frozen=True)
class _GpuTool:
    memory_argv: Tuple[str, ...]  # per-process memory
    parse_memory: Callable[[str], Dict[int, int]]
    use_argv: Tuple[str, ...]  # utilisation of each GPU
    use_pattern: re.Pattern[str]


GPU_TOOLS = (
    _GpuTool(
        ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"),
        nvidia_memory,
        ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"),
        re.compile(r"^\s*(\d+)\s*$", re.MULTILINE),
    ),
    _GpuTool(("rocm-smi", "--showpids"), rocm_memory, ("rocm-smi", "--showuse"), _ROCM_USE),
)


def _ask_memory(timeout: float) -> Optional[Tuple[_GpuTool, gpu_state.ToolResult]]:
    """The first installed tool and its answer to the per-process memory query; None when none is installed."""
    for tool in GPU_TOOLS:
        answer = gpu_state.query(tool.memory_argv, timeout)
        if answer is not None:
            return tool, answer
    return None


def gpu_memory_by_pid(timeout: float = GPU_TIMEOUT_S) -> Optional[Dict[int, int]]:
    """MiB of GPU memory per pid (nvidia-smi, else rocm-smi); None when no tool is installed or it does not answer."""
    asked = _ask_memory(timeout)
    if asked is None or not asked[1].ok:
        return None
    return asked[0].parse_memory(asked[1].text)


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
        asked = _ask_memory(GPU_TIMEOUT_S)
        if asked is None:
            return None
        tool, answer = asked
        source = tool.memory_argv[0]
        if not answer.ok:
            self.given_up = answer.hung
            return {"source": source, "error": answer.text}
        use = gpu_state.query(tool.use_argv, GPU_TIMEOUT_S)
        pct = [int(v) for v in tool.use_pattern.findall(use.text)] if use is not None and use.ok else []
        return {"source": source, "memory_mib": tool.parse_memory(answer.text), "utilisation_pct": pct}


class Sampler:
    """Samples one child's tree; ``env`` is the child's environment (it names the kernel caches)."""

    def __init__(self, tree: proctree.ProcessTree, env: Mapping[str, str]) -> None:
        self.tree = tree
        self.caches = caches.watched(env)
        self.gpu = _GpuPoller()
        self.cmdlines = _Cmdlines()

    def sample(self) -> Sample:
        started = time.thread_time()
        now = time.monotonic()
        pids = [p.pid for p in self.tree.scan()]
        self.cmdlines.keep(pids)
        procs = tuple(s for s in (_proc_sample(pid, self.cmdlines) for pid in pids) if s is not None)
        caches = tuple(c for c in (walk_cache(label, path) for label, path in self.caches) if c is not None)
        gpu = self.gpu.poll(now)
        if gpu and "memory_mib" in gpu:
            gpu = dict(gpu, memory_mib={pid: mib for pid, mib in gpu["memory_mib"].items() if pid in pids})
        cost = round(time.thread_time() - started, 4)
        boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return Sample(ts=now, procs=procs, caches=caches, gpu=gpu, cost_s=cost, wall=time.time(), boot=boot)
