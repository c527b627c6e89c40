"""A silence's samples, and the two judgements the supervisor acts on.

:class:`Window` keeps the samples :class:`trainbox.diagnose.evidence.Sampler` took since the last beat and turns
them into: how long the whole tree has been idle (:meth:`Window.idle_for_s`), and whether a kernel compile is
making progress (:meth:`Window.compile_progress`). :mod:`trainbox.diagnose.causes` reads the same window, with
stacks, to name the cause. Pure arithmetic over samples: tested with made-up ones in milliseconds, and an
incident's ``evidence.json`` reads back into a Window (:meth:`Window.from_json`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.diagnose.evidence import CacheSample, ProcSample, Sample

#: The whole tree is idle below this many cores of CPU demand (10 % of one core): a deadlocked trainer still
#: runs a few timer and watchdog threads (tqdm's monitor, torch's pin-memory thread), never more.
IDLE_CPU_CORES = 0.1
#: ... and below this rate of I/O (read + written characters, all processes): a beat-less child
#: that still reads its dataset or writes its log is working, a deadlocked one does neither.
IDLE_IO_BYTES_PER_S = 64 * 1024
#: A kernel cache that grew within this many seconds counts as compile progress: MIOpen compiles
#: one solver at a time in-process (comgr) and writes each kernel when done, seconds to a minute apart.
CACHE_PROGRESS_S = 60.0
#: A compiler process counts as progress when it used at least this much CPU in the last interval.
COMPILER_BUSY_CORES = 0.05

#: A process with a thread runnable (state R) in each of at least this many samples in a row wants that many
#: cores, whatever its schedstat says: the kernel adds a wait on the run queue to ``run_delay`` only when the task
#: runs again, so a spinning process that waits for a CPU at the moment of a sample is short of its open wait
#: (measured: a pure-Python spin behind three nice -10 hogs read 0.52 s demanded over a 1.0 s interval while in R at
#: every sample, and was taken for not busy). Three samples: a process at half a core is caught R in all of
#: them one time in eight, in two of them one time in four.
RUNNABLE_SAMPLES = 3

#: Samples a window keeps besides its first one (5 minutes at SAMPLE_EVERY_S): bounds memory and
#: the incident's evidence.json for silences of hours.
WINDOW_KEEP = 150


@dataclass
class Interval:
    """What changed between two samples."""

    seconds: float
    cpu_s: Dict[Tuple[int, float], float] = field(default_factory=dict)
    demand_s: Dict[Tuple[int, float], float] = field(default_factory=dict)  # falls back to cpu_s
    io: Dict[Tuple[int, float], int] = field(default_factory=dict)  # characters read + written
    written: int = 0  # characters the tree's processes wrote (wchar), where readable
    cache_growth: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # var -> (files, bytes) this tree added


def interval(before: Sample, after: Sample) -> Interval:
    """CPU used per process, I/O and cache growth from ``before`` to ``after``.

    A process new in ``after`` counts with all its CPU time and I/O (it started within the interval). A cache's
    growth counts only when this tree wrote it (:func:`_tree_wrote`).
    """
    change = Interval(seconds=max(after.ts - before.ts, 1e-6))
    for proc in after.procs:
        old = before.proc(proc.key)
        change.cpu_s[proc.key] = max(0.0, proc.cpu_s - (old.cpu_s if old else 0.0))
        if proc.demand_s is not None and (old is None or old.demand_s is not None):
            change.demand_s[proc.key] = max(0.0, proc.demand_s - (old.demand_s if old and old.demand_s else 0.0))
        else:
            change.demand_s[proc.key] = change.cpu_s[proc.key]
        if proc.io_chars is not None:
            base = old.io_chars if old is not None and old.io_chars is not None else 0
            change.io[proc.key] = max(0, proc.io_chars - base)
        if proc.io_written is not None:
            base = old.io_written if old is not None and old.io_written is not None else 0
            change.written += max(0, proc.io_written - base)
    earlier = {c.var: c for c in before.caches}
    for cache in after.caches:
        old_cache = earlier.get(cache.var)
        if old_cache is None:  # the directory appeared within the interval
            old_cache = CacheSample(cache.var, cache.path, 0, 0, 0.0, capped=False)
        files, size = cache.files - old_cache.files, cache.bytes - old_cache.bytes
        grew = files > 0 or size > 0 or cache.newest > old_cache.newest
        if grew and _tree_wrote(change, after, cache, size):
            change.cache_growth[cache.var] = (max(files, 0), max(size, 0))
    return change


def _tree_wrote(change: Interval, after: Sample, cache: CacheSample, size: int) -> bool:
    """Whether a cache's growth of ``size`` bytes is this tree's doing.

    The default caches (``~/.cache/miopen``, ``/tmp/torchinductor_<user>``) are shared with every other program of
    the user: another compile writing there must not pass for ours, or a spinning tree (or a CUDA sync spinning on a
    hung GPU) is taken for a compile and found up to ``--compile-cap`` late, and retried the wrong way (issue 33
    item 10). So the growth is the tree's only when its own write counters grew at least as much (``wchar``: MIOpen
    compiles in-process through comgr and writes each kernel itself), or one of its processes has a file under the
    cache open (a find-db), or a compiler of the tree is busy. Using CPU alone proves nothing.
    """
    return bool(change.written >= max(size, 1) or cache.opened_by or compiling(change, after))


def compiling(change: Interval, after: Sample) -> List[ProcSample]:
    """The compiler processes that used at least COMPILER_BUSY_CORES over the interval.

    A compiler that waits is not compiling: Inductor keeps its pool of compile workers for the
    process's whole life, idle between compiles.
    """
    return [p for p in after.procs if p.compiler and change.cpu_s.get(p.key, 0.0) / change.seconds >= COMPILER_BUSY_CORES]


def runnable_cores(samples: Sequence[Sample]) -> Dict[int, float]:
    """Per process (pid) in all of ``samples``, the fewest threads it had runnable in any of them.

    Empty under RUNNABLE_SAMPLES samples. A lower bound on the cores the process wants that the kernel's run-queue
    accounting cannot fall short of (see RUNNABLE_SAMPLES).
    """
    if len(samples) < RUNNABLE_SAMPLES:
        return {}
    fewest: Dict[Tuple[int, float], int] = {p.key: p.threads.get("R", 0) for p in samples[0].procs}
    for sample in samples[1:]:
        present = {p.key: p.threads.get("R", 0) for p in sample.procs}
        fewest = {key: min(count, present[key]) for key, count in fewest.items() if key in present}
    return {key[0]: float(count) for key, count in fewest.items() if count > 0}


def _across(samples: Sequence[Sample]) -> Optional[Interval]:
    """The interval from the first of ``samples`` to the last; None under two."""
    return interval(samples[0], samples[-1]) if len(samples) >= 2 else None


def is_idle(change: Interval, after: Sample) -> bool:
    """The whole tree wanted under IDLE_CPU_CORES, did under IDLE_IO_BYTES_PER_S, grew no cache, compiled nothing.

    Wanted, not used: CPU demand (time on a CPU and waiting for one, :attr:`Interval.demand_s`). On a loaded machine
    a process that works gets a fraction of a core (on 2 cores at a load of 20, a torch import ran at 8.6 %) and was
    taken for idle; a sleeping one wants nothing either way.
    """
    return (
        sum(change.demand_s.values()) / change.seconds < IDLE_CPU_CORES
        and sum(change.io.values()) / change.seconds < IDLE_IO_BYTES_PER_S
        and not change.cache_growth
        and not compiling(change, after)
    )


class Window:
    """The samples of the current silence; the supervisor clears it at every beat.

    Keeps the first sample and the last :data:`WINDOW_KEEP`; idleness is tracked as samples
    arrive, so it is exact however long the silence.
    """

    def __init__(self) -> None:
        self.first: Optional[Sample] = None
        self.recent: Deque[Sample] = deque(maxlen=WINDOW_KEEP)
        self._idle_since: Optional[float] = None
        self._last_growth: Dict[str, float] = {}  # cache var -> ts of the last sample that saw it grow
        self._grown: Dict[str, Tuple[int, int]] = {}  # cache var -> (files, bytes) the tree added

    def add(self, sample: Sample) -> None:
        previous = self.recent[-1] if self.recent else None
        if self.first is None:
            self.first = sample
        self.recent.append(sample)
        if previous is None:
            return
        change = interval(previous, sample)
        for var, (files, size) in change.cache_growth.items():
            self._last_growth[var] = sample.ts
            grown = self._grown.get(var, (0, 0))
            self._grown[var] = (grown[0] + files, grown[1] + size)
        if is_idle(change, sample):
            if self._idle_since is None:
                self._idle_since = previous.ts
        else:
            self._idle_since = None

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def samples(self) -> List[Sample]:
        """The kept samples, oldest first (the first one always included)."""
        kept = list(self.recent)
        if self.first is not None and (not kept or kept[0] is not self.first):
            kept.insert(0, self.first)
        return kept

    @property
    def last(self) -> Optional[Sample]:
        return self.recent[-1] if self.recent else None

    def span_s(self) -> float:
        """Seconds from the first sample to the last."""
        return self.recent[-1].ts - self.first.ts if self.first is not None and self.recent else 0.0

    def idle_for_s(self) -> float:
        """How long the whole tree has been continuously idle (see :func:`is_idle`); 0.0 if not idle now."""
        last = self.last
        return last.ts - self._idle_since if last is not None and self._idle_since is not None else 0.0

    def _since(self, since_s: Optional[float]) -> List[Sample]:
        """The kept samples of the whole window, or of its last ``since_s`` seconds."""
        last = self.last
        if last is None or since_s is None:
            return self.samples
        return [s for s in self.samples if last.ts - s.ts <= since_s]

    def _over(self, since_s: Optional[float]) -> Optional[Interval]:
        return _across(self._since(since_s))

    def cpu_cores(self, since_s: Optional[float] = None) -> Dict[int, float]:
        """Average cores used per live process (pid) over the window, or over its last ``since_s``."""
        change = self._over(since_s)
        return {key[0]: used / change.seconds for key, used in change.cpu_s.items()} if change else {}

    def demand_cores(self, since_s: Optional[float] = None) -> Dict[int, float]:
        """Average cores wanted (used + waited for) per live process (pid), as :meth:`cpu_cores`.

        At least the threads it had runnable in every sample (:func:`runnable_cores`), over RUNNABLE_SAMPLES or more.
        """
        samples = self._since(since_s)
        change = _across(samples)
        if change is None:
            return {}
        wanted = {key[0]: demand / change.seconds for key, demand in change.demand_s.items()}
        for pid, runnable in runnable_cores(samples).items():
            wanted[pid] = max(wanted.get(pid, 0.0), runnable)
        return wanted

    def io_rates(self, since_s: Optional[float] = None) -> Dict[int, float]:
        """Characters read and written per second per live process (pid), as :meth:`cpu_cores`."""
        change = self._over(since_s)
        return {key[0]: chars / change.seconds for key, chars in change.io.items()} if change else {}

    def compile_progress(self) -> Tuple[str, ...]:
        """Evidence lines when a compile made progress lately; () when none.

        Progress is a compiler process that used CPU in the last interval, or a kernel cache
        that this tree grew (:func:`_tree_wrote`) within the last :data:`CACHE_PROGRESS_S`.
        """
        samples = self.samples
        if len(samples) < 2:
            return ()
        before, last = samples[-2], samples[-1]
        change = interval(before, last)
        lines = []
        for proc in compiling(change, last):
            cpu = 100 * change.cpu_s[proc.key] / change.seconds
            lines.append(f"{proc.name} (pid {proc.pid}) running for {last.boot - proc.started:.0f} s, {cpu:.0f} % CPU")
        for var, grew_at in self._last_growth.items():
            if last.ts - grew_at <= CACHE_PROGRESS_S:
                files, size = self._grown[var]
                shown = var.replace(" (default)", "")
                lines.append(f"{shown} grew by {files} files ({size / 1024:.0f} KiB) in {self.span_s():.0f} s")
        return tuple(lines)

    def to_json(self) -> List[Dict[str, Any]]:
        """The kept samples, for the incident's evidence.json."""
        return [sample.to_dict() for sample in self.samples]

    @classmethod
    def from_json(cls, rows: Sequence[Mapping[str, Any]]) -> Window:
        """A window holding the samples :meth:`to_json` wrote."""
        window = cls()
        for row in rows:
            window.add(Sample.from_dict(row))
        return window
