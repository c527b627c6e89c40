"""Why a child is silent: one :class:`Cause` and the evidence that decided it.

:func:`classify` works from what it is given: a :class:`trainbox.diagnose.window.Window`
(what the tree did while silent), the stacks the incident collected (py-spy dump
text or a faulthandler dump, :func:`trainbox.diagnose.incident.collect_stacks`) and the
kernel's GPU messages (:func:`trainbox.system.gpu_state.read`). The one thing it reads
itself is a stack frame's source line, where the file is at hand (rule 8). The
rules, first match wins:

1. ``kernel_compile``: a compile is making progress now (a compiler process using
   CPU, a kernel cache growing: :meth:`Window.compile_progress`).
2. ``stopped``: a process of the tree is stopped (state T, in most of the last samples: a SIGSTOP, a debugger,
   the shell's job control). Nothing it waits for can come; the evidence names the stopped processes apart from
   the ones that only wait for them (a main thread in a DataLoader's queue is then no loader deadlock).
3. ``gpu_wait``: GPU reset/ring-timeout/Xid messages in the kernel log, or a thread in
   D state inside the GPU driver.
4. ``io_wait``: a thread in D state elsewhere (the block layer, a network filesystem).
5. ``gil_held``: a thread holds the GIL while off the CPU (py-spy's ``owns_gil`` on a thread that is not active:
   a C call that never released it, a deadlock inside an extension), in a process that does not compute; every
   other thread of it waits for the GIL wherever it was. The evidence names the holder and its top frames first.
6. ``kernel_compile``: the main thread in a known compile frame (Inductor, Triton, Dynamo's
   frame conversion, a C++ extension build, MIOpen).
7. ``loader_deadlock``: the main thread waits on a DataLoader (torch's ``_try_get_data``,
   a queue get or connection poll under ``dataloader.py``, an Ultralytics loader frame) while
   it and its workers neither compute nor read.
8. ``gpu_wait``: the main thread in a device synchronise or copy (``torch.cuda.synchronize``,
   a source line calling ``.item()``/``.cpu()``/``.to(``, a function named like ``copy_to_device``)
   without the GIL (CUDA's default synchronise spins a core, so CPU does not decide it).
9. ``busy_python`` / ``busy_native``: a process wants over :data:`BUSY_CORES` (CPU used and waited for, or a
   thread runnable at every sample: :meth:`trainbox.diagnose.window.Window.demand_cores`); py-spy's
   ``+gil`` (or a top frame outside torch/numpy) says Python, else native code.
10. ``io_wait``: a thread reading (dataset frames: PIL, Ultralytics' ``load_image``, ``read``)
   in a process whose reads still trickle in.
11. ``gpu_wait``: the tree is idle but holds GPU memory on a GPU at full utilisation in every
   reading (nvidia-smi/rocm-smi): a kernel that does not end. In a container, where the tools' pids are the
   host's, the GPU's used memory stands in for the tree's (:mod:`trainbox.system.gpu_memory`).
12. ``idle``: the whole tree is idle.
13. ``unknown``.

Every rule that fires says why in a few short strings, most decisive first.
"""

from __future__ import annotations

import linecache
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import psutil

from trainbox.diagnose.evidence import SAMPLE_EVERY_S, ProcSample
from trainbox.diagnose.window import IDLE_CPU_CORES, IDLE_IO_BYTES_PER_S, Window
from trainbox.rundir.events import Cause  # re-exported: causes are named here

#: A process above this many cores is busy (a Python spin runs at 1.0; allowance for a loaded machine).
BUSY_CORES = 0.8
#: Whether a process works *now* is judged over the last two sampling intervals (and a half, for the samples'
#: jitter): a silence's first interval often still holds the start of what then hangs (imports, forking the
#: DataLoader's workers), which must not make a deadlocked loader look busy.
RECENT_S = 2.5 * SAMPLE_EVERY_S
#: A D state counts when seen in at least this share of the last samples (a single D is a page fault).
D_STATE_SHARE = 0.5
#: How many of the last samples the D-state rule looks at.
D_STATE_SAMPLES = 5
#: A GPU this busy in every reading of an idle tree's silence is running a kernel that does not end.
GPU_BUSY_PCT = 90


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    evidence: Tuple[str, ...]  # short quoted strings, most decisive first

    def to_dict(self) -> Dict[str, Any]:
        return {"cause": self.cause.value, "evidence": list(self.evidence)}


# --- stacks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # as the dump shows it: py-spy's short form ("torch/utils/data/dataloader.py") or a full path
    line: int

    @property
    def where(self) -> str:
        return f"{short_path(self.file)}:{self.function}"


@dataclass(frozen=True)
class ThreadStack:
    ident: str  # py-spy: the native thread id; faulthandler: the pthread handle ("0x7f...")
    name: str  # py-spy's thread name ("MainThread"), "" where the dump has none
    status: str  # py-spy: "idle", "active", "active+gil"; faulthandler: "current" or ""
    frames: Tuple[Frame, ...]  # innermost first

    @property
    def top(self) -> Optional[Frame]:
        return self.frames[0] if self.frames else None

    def is_main(self, pid: int) -> bool:
        if self.name == "MainThread" or self.ident == str(pid):
            return True
        # faulthandler names no thread: every other thread started in threading's _bootstrap.
        return self.name == "" and bool(self.frames) and not _THREAD_START.search(self.frames[-1].where)


_THREAD_START = re.compile(r"threading\.py:(?:\S+\.)?_bootstrap$")
_PY_SPY_THREAD = re.compile(r'^Thread (?P<ident>\d+) \((?P<status>[^)]*)\)(?::\s*"(?P<name>.*)")?\s*$')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<ident>0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+?)\s*$')


def parse_stacks(text: str) -> List[ThreadStack]:
    """The threads of one process's dump, py-spy's text format or faulthandler's."""
    threads: List[ThreadStack] = []
    header: Optional[Tuple[str, str, str]] = None
    frames: List[Frame] = []

    def close() -> None:
        if header is not None:
            threads.append(ThreadStack(header[0], header[1], header[2], tuple(frames)))

    for line in text.splitlines():
        spy, fh = _PY_SPY_THREAD.match(line), _FH_THREAD.match(line)
        if spy or fh:
            close()
            frames = []
            if spy:
                header = (spy["ident"], spy["name"] or "", spy["status"])
            elif fh:
                header = (fh["ident"], "", "current" if fh["current"] == "Current thread" else "")
            continue
        if header is None:
            continue
        frame = _PY_SPY_FRAME.match(line) or _FH_FRAME.match(line)
        if frame:
            frames.append(Frame(frame["function"], frame["file"], int(frame["line"])))
    close()
    return threads


_SHORTEN = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python3\.\d+)/")


def short_path(path: str) -> str:
    """A frame's file as py-spy shows it: from the package down (full paths come from faulthandler)."""
    return _SHORTEN.sub("", path)


def main_thread(threads: Sequence[ThreadStack], pid: int) -> Optional[ThreadStack]:
    return next((t for t in threads if t.is_main(pid)), None)


def _source(frame: Frame, cwd: Optional[str]) -> str:
    """The source line a frame is at, when its file can be found here ('' otherwise)."""
    candidates = [frame.file] if os.path.isabs(frame.file) else ([os.path.join(cwd, frame.file)] if cwd else [])
    for path in candidates:
        linecache.checkcache(path)  # the file may have changed since an earlier attempt's stall
        text = linecache.getline(path, frame.line).strip()
        if text:
            return text
    return ""


# --- what frames mean ---------------------------------------------------------------------------

#: py-spy shows a method as its qualified name ("_MultiProcessingDataLoaderIter._try_get_data"),
#: faulthandler as the bare name: patterns accept both.
_QUALIFIED = r"(?:\S+\.)?"

#: DataLoader waits: torch's loader fetching from its workers' queue, and Ultralytics' loaders.
LOADER_FRAMES = re.compile(
    rf"torch/utils/data/dataloader\.py:{_QUALIFIED}(_try_get_data|_get_data|_next_data|__next__)$"
    r"|torch/utils/data/_utils/pin_memory\.py"
    r"|ultralytics/data/"
)
#: The name torch's DataLoader gives its worker processes (``_worker_loop`` sets it, fork or spawn).
DATALOADER_WORKER = "pt_data_worker"
#: Innermost frames that mean "waiting for another process or thread".
WAIT_FRAMES = re.compile(
    rf"multiprocessing/(queues|connection|synchronize|popen_\w+)\.py|queue\.py:{_QUALIFIED}get$"
    rf"|threading\.py:{_QUALIFIED}(wait|join|acquire)$"
    r"|selectors\.py:select|socket\.py"
)
#: Known compile frames: Inductor's compilation (not its runtime), Triton's compiler, Dynamo's frame
#: conversion, C++ extension builds, cuDNN/MIOpen set-up (on ROCm torch.backends.cudnn fronts MIOpen),
#: and MIOpen or comgr by name (frames of a ``py-spy --native`` dump).
COMPILE_FRAMES = re.compile(
    r"torch/_inductor/(compile_fx|codecache|async_compile|graph|scheduler|lowering|select_algorithm"
    r"|autotune_process|compile_worker/)"
    r"|torch/_dynamo/(convert_frame|symbolic_convert)\.py"
    r"|triton/compiler/|triton/runtime/build\.py|torch/utils/cpp_extension\.py|torch/backends/cudnn/"
    r"|miopen|comgr",
    re.IGNORECASE,
)
#: Python frames that wait on the device: synchronisations and host copies.
DEVICE_FRAMES = re.compile(
    rf"torch/cuda/(__init__|streams)\.py:{_QUALIFIED}(synchronize|wait_event|wait_stream|_lazy_init)$"
    r"|torch/cuda/memory\.py:empty_cache$|ultralytics/utils/torch_utils\.py:time_sync$"
    rf"|torch/_tensor\.py:{_QUALIFIED}(__array__|__repr__|__format__)$"
)
#: Source lines that block on the device (a copy to the host needs the queued kernels finished).
DEVICE_CALLS = re.compile(r"\.(item|cpu|numpy|tolist)\(\)|\.(to|cuda)\(|synchronize\(")
#: Function names that copy to or from the device or wait for it (what a dump of a program whose
#: source is not at hand still says).
DEVICE_FUNCTIONS = re.compile(r"synchroni[sz]e|to_device|to_host|to_cpu|device_get", re.IGNORECASE)
#: GPU driver functions a thread in D state may sleep in (amdgpu/KFD/DRM/TTM, dma fences, NVIDIA).
GPU_WCHAN = re.compile(r"amdgpu|kfd|drm|ttm_|dma_fence|^nv|_nv\d|nvidia|os_acquire", re.IGNORECASE)
#: Kernel messages that mean the GPU hung or reset: amdgpu's reset and ring timeouts, NVIDIA's Xid.
GPU_RESET = re.compile(
    r"gpu reset|ring \S+ timeout|amdgpu_job_timedout|gpu (hang|fault)|VM_[A-Z0-9_]*PROTECTION_FAULT"
    r"|NVRM: Xid|GPU has fallen off the bus",
    re.IGNORECASE,
)
#: NVIDIA's Xid 45 is the driver cleaning up the channels of a process that was killed (a previous
#: attempt's, perhaps): not a sign that the GPU hung.
KILLED_CHANNEL = re.compile(r"NVRM: Xid \([^)]*\): 45\b")
#: GPU messages logged this long before the silence's first sample still count (the reset that
#: silenced the child comes before the sampling starts); older ones belong to an earlier attempt.
KERNEL_LOOKBACK_S = 300.0
#: Innermost frames that read files (a dataset's images, labels, cached arrays).
READ_FRAMES = re.compile(
    r"PIL/(Image|ImageFile|JpegImagePlugin|PngImagePlugin)\.py|numpy/lib/(npyio|format)\.py|torch/serialization\.py"
    rf"|ultralytics/data/(base|utils|dataset)\.py:{_QUALIFIED}(load_image|cache\w*|verify\w*)$"
    rf"|:{_QUALIFIED}(read|readinto|readline|read_bytes|read_text|open|imread|load|fromfile)$"
)
#: How deep in a stack (innermost first) a read frame counts: deeper, the thread has moved on to other work.
READ_DEPTH = 4
#: Frames whose code runs in native libraries (a busy process there is busy in C/C++, not in Python).
NATIVE_FILES = re.compile(r"^(torch|numpy|cv2|scipy|PIL|torchvision|triton)/")


@dataclass
class _Facts:
    """What classify works from, gathered once."""

    window: Window
    threads: Dict[int, List[ThreadStack]]  # pid -> parsed stacks
    main_pid: int
    kernel_text: str
    cores: Dict[int, float]  # pid -> cores used over the window
    demand: Dict[int, float]  # pid -> cores wanted (used + waited for) over the window
    io: Dict[int, float]  # pid -> characters read + written per second over the window
    last: Dict[int, ProcSample]  # pid -> the latest sample
    recent_demand: Dict[int, float]  # as ``demand``, over the last RECENT_S only
    recent_io: Dict[int, float]  # as ``io``, over the last RECENT_S only

    def stack_of(self, pid: int) -> List[ThreadStack]:
        return self.threads.get(pid, [])

    def main(self) -> Optional[ThreadStack]:
        return main_thread(self.stack_of(self.main_pid), self.main_pid)

    def workers(self) -> List[ProcSample]:
        """DataLoader workers: torch names them ``pt_data_worker`` (any start method); else the main's children."""
        return [
            p
            for p in self.last.values()
            if p.pid != self.main_pid and not p.compiler and (p.name == DATALOADER_WORKER or p.ppid == self.main_pid)
        ]

    def cwd(self) -> Optional[str]:
        try:
            return os.readlink(f"/proc/{self.main_pid}/cwd")
        except OSError:
            return None


def _pct(cores: float) -> str:
    return f"{100 * cores:.1f} % CPU"


def _first_match(thread: ThreadStack, pattern: re.Pattern[str]) -> Optional[Frame]:
    return next((f for f in thread.frames if pattern.search(f.where)), None)


def _user_frame(thread: ThreadStack) -> Optional[Frame]:
    """The innermost frame outside the standard library's waiting machinery (what the thread was doing)."""
    for frame in thread.frames:
        if not WAIT_FRAMES.search(frame.where) and not frame.file.startswith(("threading.py", "<frozen")):
            return frame
    return thread.top


def _compiling(facts: _Facts) -> Optional[Diagnosis]:
    lines = facts.window.compile_progress()
    return Diagnosis(Cause.KERNEL_COMPILE, lines) if lines else None


def _gpu_trouble(facts: _Facts) -> Optional[Diagnosis]:
    first = facts.window.first
    since = first.wall - KERNEL_LOOKBACK_S if first is not None and first.wall else None
    resets = gpu_resets(facts.kernel_text, since)
    blocked = _blocked(facts, gpu=True)
    if not resets and not blocked:
        return None
    shown = [f"kernel: {_without_time(line)[:160]}" for line in resets[:2]]
    if len(resets) > 2:
        shown.append(f"{len(resets) - 2} more GPU reset or timeout messages in kernel.txt")
    return Diagnosis(Cause.GPU_WAIT, tuple(shown + blocked)[:4])


def _without_time(line: str) -> str:
    """A kernel message without its time stamp (dmesg's ISO or uptime prefix, journalctl's "time host kernel:")."""
    stamp = _ISO_TIME.match(line) or _UPTIME.match(line)
    if stamp:
        return line[stamp.end() :].strip()
    journal = _JOURNAL_TIME.match(line)
    return line[journal.end() :].split("kernel: ", 1)[-1].strip() if journal else line


_ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[.,]?\d*([+-]\d\d):?(\d\d)")
_JOURNAL_TIME = re.compile(r"^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) ")
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)\]")


def kernel_time(line: str, boot: float) -> Optional[float]:
    """When a kernel message was logged (epoch seconds), from ``dmesg --time-format iso``, journalctl's
    short format (local time, no year) or dmesg's seconds since boot; None when the line has no time."""
    iso = _ISO_TIME.match(line)
    if iso:
        offset = timedelta(hours=int(iso[2]), minutes=int(iso[3]) * (1 if iso[2][0] == "+" else -1))
        return datetime.strptime(iso[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone(offset)).timestamp()
    journal = _JOURNAL_TIME.match(line)
    if journal:
        now = time.time()
        logged = time.mktime(time.strptime(f"{time.localtime(now).tm_year} {journal[1]}", "%Y %b %d %H:%M:%S"))
        return logged if logged <= now + 86400 else logged - 365 * 86400  # logged last December
    uptime = _UPTIME.match(line)
    return boot + float(uptime[1]) if uptime else None


def gpu_resets(kernel_text: str, since: Optional[float] = None, boot: Optional[float] = None) -> List[str]:
    """Kernel lines that say the GPU hung or reset, logged at ``since`` or later (lines without a time count).

    ``boot``: when the machine booted (dmesg's seconds-since-boot lines count from it); this machine's by default.
    """
    boot = psutil.boot_time() if boot is None else boot
    found = []
    for line in kernel_text.splitlines():
        if not GPU_RESET.search(line) or KILLED_CHANNEL.search(line):
            continue
        logged = kernel_time(line.strip(), boot) if since is not None else None
        if logged is None or logged >= since:  # type: ignore[operator]
            found.append(line.strip())
    return found


def _blocked(facts: _Facts, gpu: bool) -> List[str]:
    """Threads in D state in most of the last samples, inside (gpu) or outside the GPU driver."""
    recent = facts.window.samples[-D_STATE_SAMPLES:]
    seen: Dict[Tuple[int, int], List[str]] = {}
    for sample in recent:
        for proc in sample.procs:
            for tid, wchan in proc.blocked:
                seen.setdefault((proc.pid, tid), []).append(wchan)
    lines = []
    for (pid, tid), wchans in sorted(seen.items()):
        if len(wchans) < max(1, D_STATE_SHARE * len(recent)):
            continue
        wchan = wchans[-1]
        if bool(GPU_WCHAN.search(wchan)) != gpu:
            continue
        name = facts.last[pid].name if pid in facts.last else "?"
        which = f"pid {pid}" if tid == pid else f"pid {pid} thread {tid}"
        lines.append(f"{which} ({name}) in D state in {len(wchans)} of {len(recent)} samples, wchan {wchan}")
    return lines


def _io_blocked(facts: _Facts) -> Optional[Diagnosis]:
    blocked = _blocked(facts, gpu=False)
    return Diagnosis(Cause.IO_WAIT, tuple(blocked[:4])) if blocked else None


#: Where a stopped process stands: the letter /proc shows for SIGSTOP and job-control stops (``t`` is a tracer's
#: stop, which py-spy's own dumps cause for a moment).
STOPPED_STATE = "T"


def _stopped(facts: _Facts) -> Optional[Diagnosis]:
    """Processes stopped in most of the last samples; the main thread's wait, told apart from them."""
    recent = facts.window.samples[-D_STATE_SAMPLES:]
    seen: Dict[int, int] = {}
    for sample in recent:
        for proc in sample.procs:
            if proc.state == STOPPED_STATE:
                seen[proc.pid] = seen.get(proc.pid, 0) + 1
    stopped = [pid for pid, count in sorted(seen.items()) if count >= max(1, D_STATE_SHARE * len(recent))]
    if not stopped:
        return None
    lines = [
        f"pid {pid} ({facts.last[pid].name if pid in facts.last else '?'}) stopped (state T: SIGSTOP or a job-control "
        f"stop) in {seen[pid]} of {len(recent)} samples"
        for pid in stopped[:3]
    ]
    if len(stopped) > 3:
        lines.append(f"{len(stopped) - 3} more stopped processes")
    main = facts.main() if facts.main_pid not in stopped else None
    frame = _user_frame(main) if main else None
    if frame is not None:
        lines.append(f"main thread waits in {frame.where} (not stopped)")
    return Diagnosis(Cause.STOPPED, tuple(lines))


#: py-spy's status of a thread that holds the GIL off the CPU (rendered from its ``--json`` dump's ``owns_gil`` and
#: ``active``, :func:`trainbox.diagnose.incident.render_py_spy`).
HOLDS_GIL_IDLE = "idle+gil"


def _gil_held(facts: _Facts) -> Optional[Diagnosis]:
    """A thread holding the GIL while it does not run, in a process with other threads that cannot run Python."""
    for pid, threads in sorted(facts.threads.items()):
        holder = next((t for t in threads if t.status == HOLDS_GIL_IDLE), None)
        if holder is None or len(threads) < 2 or facts.recent_demand.get(pid, 0.0) >= BUSY_CORES:
            continue
        frames = ", ".join(frame.where for frame in holder.frames[:3]) or "no Python frame"
        name = f" ({holder.name})" if holder.name else ""
        lines = [f"pid {pid} thread {holder.ident}{name} holds the GIL off the CPU (a C call that kept it) in {frames}"]
        others = [t for t in threads if t is not holder]
        main = main_thread(others, pid)
        frame = _user_frame(main) if main else None
        waits = f"; the main thread in {frame.where}" if frame is not None else ""
        lines.append(f"{len(others)} other thread(s) of pid {pid} wait for the GIL{waits}")
        return Diagnosis(Cause.GIL_HELD, tuple(lines))
    return None


def _compile_frame(facts: _Facts) -> Optional[Diagnosis]:
    main = facts.main()
    frame = _first_match(main, COMPILE_FRAMES) if main else None
    if frame is None:
        return None
    cores = facts.cores.get(facts.main_pid, 0.0)
    return Diagnosis(Cause.KERNEL_COMPILE, (f"main thread in {frame.where}", f"main process at {_pct(cores)}"))


def _loader_deadlock(facts: _Facts) -> Optional[Diagnosis]:
    main = facts.main()
    frame = _first_match(main, LOADER_FRAMES) if main else None
    if main is None or frame is None:
        return None
    if _working(facts, facts.main_pid):
        return None  # the main process loads in-process (no workers), and still computes or reads
    workers = facts.workers()
    if any(_working(facts, w.pid) for w in workers):
        return None  # workers compute or read: slow, not deadlocked
    evidence = [f"main thread in {frame.where}"]
    span = facts.window.span_s()
    if workers:
        shown = " ".join(str(w.pid) for w in workers[:6])
        cores = max(facts.cores.get(w.pid, 0.0) for w in workers)
        where = _worker_place(facts, workers)
        evidence.append(f"workers {shown}: {_pct(cores)} for {span:.0f} s" + (f", blocked in {where}" if where else ""))
    elif facts.last:
        evidence.append(f"no worker processes; main process at {_pct(facts.cores.get(facts.main_pid, 0.0))}")
    return Diagnosis(Cause.LOADER_DEADLOCK, tuple(evidence))


def _working(facts: _Facts, pid: int) -> bool:
    """The process computes, does I/O, or sits in a file read whose data still trickles in, lately (RECENT_S)."""
    io = facts.recent_io.get(pid, 0.0)
    if facts.recent_demand.get(pid, 0.0) >= BUSY_CORES or io >= IDLE_IO_BYTES_PER_S:
        return True
    return io > 0 and any(_read_frame(t) is not None for t in facts.stack_of(pid))


def _read_frame(thread: ThreadStack) -> Optional[Frame]:
    """A file read among the thread's innermost frames."""
    return next((f for f in thread.frames[:READ_DEPTH] if READ_FRAMES.search(f.where)), None)


def _worker_place(facts: _Facts, workers: Sequence[ProcSample]) -> str:
    """Where the workers' main threads are, from their stacks, else their wchan."""
    for worker in workers:
        main = main_thread(facts.stack_of(worker.pid), worker.pid)
        frame = _user_frame(main) if main else None
        if main is not None and frame is not None:
            item = next((f for f in main.frames if f.function.endswith("__getitem__")), None)
            return frame.where + (f" (from {item.where})" if item is not None and item is not frame else "")
    return next((w.wchan for w in workers if w.wchan), "")


def _device_wait(facts: _Facts) -> Optional[Diagnosis]:
    """The main thread in a device synchronise or copy, holding no GIL (a Python loop around one is busy_python).

    CPU does not decide it: a blocking wait sleeps (HIP, CUDA's blocking-sync mode) but CUDA's default
    spins a core inside ``cudaStreamSynchronize``; the evidence quotes the CPU either way.
    """
    main = facts.main()
    if main is None or main.status == "active+gil":
        return None
    where = f"main process at {_pct(facts.cores.get(facts.main_pid, 0.0))}"
    frame = _first_match(main, DEVICE_FRAMES)
    if frame is not None:
        return Diagnosis(Cause.GPU_WAIT, (f"main thread in {frame.where}", where))
    top = _user_frame(main)
    if top is None:
        return None
    line = _source(top, facts.cwd())
    if line and DEVICE_CALLS.search(line):
        return Diagnosis(Cause.GPU_WAIT, (f"main thread at {top.where}: {line[:80]}", where))
    if DEVICE_FUNCTIONS.search(top.function):
        return Diagnosis(Cause.GPU_WAIT, (f"main thread in {top.where}", where))
    return None


def _busy(facts: _Facts) -> Optional[Diagnosis]:
    busy = sorted(((c, pid) for pid, c in facts.demand.items() if c >= BUSY_CORES), reverse=True)
    if not busy:
        return None
    _, pid = busy[0]
    cores = facts.cores.get(pid, 0.0)
    proc = facts.last.get(pid)
    name = proc.name if proc else "?"
    threads = facts.stack_of(pid)
    span = facts.window.span_s()
    # py-spy marks the threads on a CPU; a faulthandler dump does not, and its main thread stands for them.
    running = [t for t in threads if t.status.startswith("active")] or [
        t for t in threads if t.status in ("", "current") and t.is_main(pid) and t.frames
    ]
    if not running:
        what = "no Python stack" if not threads else "no Python thread running"
        return Diagnosis(Cause.BUSY_NATIVE, (f"pid {pid} ({name}) at {_pct(cores)} for {span:.0f} s, {what}",))
    thread = running[0]
    top = thread.top
    where = top.where if top else "?"
    # py-spy says "active+gil" for a thread running Python, "active" for one in native code that let go of
    # the GIL; a faulthandler dump says neither, and the top frame decides: torch/numpy code runs in
    # native libraries, anything else in the interpreter.
    if thread.status.startswith("active"):
        in_python = thread.status == "active+gil"
    else:
        in_python = top is not None and not NATIVE_FILES.search(short_path(top.file))
    head = f"pid {pid} ({name}) at {_pct(cores)} for {span:.0f} s"
    if in_python:
        return Diagnosis(Cause.BUSY_PYTHON, (f"{head} in Python: {where}", "no compile sign, no progress"))
    return Diagnosis(Cause.BUSY_NATIVE, (f"{head} in native code called from {where}", "no compile sign"))


def _reading(facts: _Facts) -> Optional[Diagnosis]:
    """A thread inside a file read (one of its innermost frames) of a process whose reads still trickle in."""
    for pid, threads in facts.threads.items():
        rate = facts.io.get(pid, 0.0)
        if rate <= 0:
            continue
        for thread in threads:
            frame = _read_frame(thread)
            if frame is not None:
                cores = _pct(facts.cores.get(pid, 0.0))
                return Diagnosis(
                    Cause.IO_WAIT, (f"pid {pid} reading in {frame.where}", f"pid {pid}: {rate / 1024:.0f} KiB/s read at {cores}")
                )
    return None


def _gpu_busy_while_idle(facts: _Facts) -> Optional[Diagnosis]:
    """The tree waits at no CPU while its GPU stays fully busy: a kernel that does not finish."""
    if not _tree_idle(facts):
        return None
    readings = [s.gpu for s in facts.window.samples if s.gpu and s.gpu.get("utilisation_pct")]
    if not readings or not all(max(r["utilisation_pct"]) >= GPU_BUSY_PCT for r in readings):
        return None
    last = readings[-1]
    if last.get("host_pids"):  # in a container: whose memory it is cannot be told (trainbox.system.gpu_memory)
        if not last.get("used_mib"):
            return None
        shown = f"the GPU holds {last['used_mib']} MiB (per-process memory unknown: the tool's pids are the host's)"
    else:
        held = {int(pid): mib for pid, mib in last.get("memory_mib", {}).items() if mib}
        if not held:
            return None  # the busy GPU is someone else's
        shown = ", ".join(f"pid {pid} holds {mib} MiB" for pid, mib in sorted(held.items()))
    return Diagnosis(
        Cause.GPU_WAIT,
        (
            f"GPU at {max(readings[-1]['utilisation_pct'])} % utilisation in all {len(readings)} readings while the tree is idle",
            shown,
        ),
    )


def _tree_idle(facts: _Facts) -> bool:
    return facts.window.idle_for_s() > 0 or bool(facts.demand and sum(facts.demand.values()) < IDLE_CPU_CORES)


def _idle(facts: _Facts) -> Optional[Diagnosis]:
    if not _tree_idle(facts):
        return None
    idle_s = facts.window.idle_for_s()
    total = sum(facts.cores.values())
    span = idle_s if idle_s > 0 else facts.window.span_s()
    evidence = [f"whole tree idle for {span:.0f} s: {_pct(total)}, no I/O, no cache growth, no compiler"]
    main = facts.main()
    frame = _user_frame(main) if main else None
    if frame is not None:
        evidence.append(f"main thread in {frame.where}")
    return Diagnosis(Cause.IDLE, tuple(evidence))


RULES = (
    _compiling,
    _stopped,
    _gpu_trouble,
    _io_blocked,
    _gil_held,
    _compile_frame,
    _loader_deadlock,
    _device_wait,
    _busy,
    _reading,
    _gpu_busy_while_idle,
    _idle,
)


def classify(window: Window, stacks: Mapping[int, str], main_pid: int, kernel_text: str = "") -> Diagnosis:
    """The cause of the silence ``window`` covers; see the module docstring for the rules."""
    last = window.last
    facts = _Facts(
        window=window,
        threads={pid: parse_stacks(text) for pid, text in stacks.items() if text},
        main_pid=main_pid,
        kernel_text=kernel_text,
        cores=window.cpu_cores(),
        demand=window.demand_cores(),
        io=window.io_rates(),
        last={p.pid: p for p in last.procs} if last else {},
        recent_demand=window.demand_cores(RECENT_S),
        recent_io=window.io_rates(RECENT_S),
    )
    for rule in RULES:
        found = rule(facts)
        if found is not None:
            return found
    return Diagnosis(Cause.UNKNOWN, _unknown(facts))


def _unknown(facts: _Facts) -> Tuple[str, ...]:
    """What was seen, when no rule fits it."""
    if not facts.window.samples:
        seen = "no samples of the tree"
    else:
        seen = f"tree at {_pct(sum(facts.cores.values()))} over {facts.window.span_s():.0f} s"
    main = facts.main()
    frame = _user_frame(main) if main else None
    return (f"no rule matched: {seen}",) + ((f"main thread in {frame.where}",) if frame else ())
