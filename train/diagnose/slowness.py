"""Why a run became slow: what changed on the machine and in the run since it ran at its pace.

When :mod:`trainbox.supervise.pace.detector` confirms a slowdown, the supervisor holds
two sets of :class:`Conditions`: the baseline's (taken while the run was at its
pace) and now's. Each holds a :class:`trainbox.system.pressure.Pressure` (rates
between two snapshots a few seconds apart), the GPUs' clocks
(:mod:`trainbox.system.gpu_clocks`), the DataLoader's worker pids and the share
of stack samples in which the main thread was in the DataLoader
(:func:`loader_wait_share`). :func:`explain` compares them and names one
suspect, with evidence that quotes the numbers.

The rules, in order. The first that fires on evidence about the run itself
(its GPU, its memory cgroup or page faults, its wait for a CPU, its stacks and
workers) names the suspect; only when none does, the first that fires on
machine-wide figures alone (PSI, swap-in, iowait). On a shared machine one run's
thrashing raises everyone's memory PSI: in the real-process tests here a run that
thrashed at its cgroup's limit took the machine's memory PSI from 0 to 22 %, and
a CPU-starved run beside it, whose own run-queue wait had gone from 39 to 92 %,
would otherwise have been called memory-bound. Every rule that fires adds its
evidence, the suspect's first:

1. ``thermal``: a GPU reports a slowdown reason (heat, a hardware slowdown or
   power brake: :data:`trainbox.system.gpu_clocks.SLOWDOWN_REASONS`) that it did
   not report in the baseline, or its clock fell by :data:`CLOCK_DROP` or more
   while it is at :data:`HOT_C` or hotter (rocm-smi reports no reasons). First:
   the GPU's own report is the most direct evidence there is, and heat is
   independent of what the CPU side does. A clock that fell on a cool GPU is a
   starved GPU (idle clocks), not a cause.
2. ``memory``: the run's memory cgroup is at :data:`LIMIT_FULL_SHARE` of its
   limit and hits it now, which it did not in the baseline (its page cache, a
   memory-mapped dataset or its own code, is then evicted and read back at every
   step: how a run thrashes on a machine without swap, :mod:`trainbox.system.memcg`);
   swap-in rose by :data:`SWAP_IN_RISE_PAGES_S` or more, or the run's own major
   page faults by as many; or memory pressure (PSI) by :data:`PSI_RISE_PCT`. Before contention and I/O, because swapping
   shows up as both (kswapd's CPU, swap reads). Swap-in and PSI are the machine's: where the run's own major page
   faults are read and did not rise, they are someone else's (a swapped-out page of the run comes back as a major
   fault of it), said as evidence but no suspect. In the real-process tests a run thrashing at its cgroup's limit
   took the machine's memory PSI to 23 %, and three runs beside it, slowed by something else entirely, had been
   called memory-bound for it.
3. ``contention``: the run waits for a CPU (its main threads' run-queue delay)
   :data:`RUN_WAIT_RISE_PCT` more of the time than in the baseline, and processes
   outside the run take :data:`CONTENTION_RISE_PCT` more CPU than they did then
   (counted process by process, pid and start, so that a neighbour that went
   quiet does not hide a new hog on a shared machine; the :data:`HOGS_SHOWN` whose CPU rose most are named with
   pid, name and their CPU now and then, whatever their rise: on a machine that was already busy three new hogs get
   under half a core each, and were named by no rule of a fixed size)
   or CPU pressure (PSI) rose by :data:`PSI_RISE_PCT`. The run's own wait comes
   first because a busy machine slows only a run that needs its CPU: on this
   development machine other people's jobs came and went all day, and a run that
   sleeps between steps (or waits on its GPU) is not theirs to slow. Where the
   kernel keeps no run delay, the outside rise alone decides.
4. ``io``: iowait rose by :data:`IOWAIT_RISE_PCT` or I/O pressure (PSI) by
   :data:`PSI_RISE_PCT`.
5. ``loader``: the main thread is in the DataLoader in at least
   :data:`LOADER_WAIT_SHARE` of the samples, :data:`LOADER_WAIT_RISE` more than
   in the baseline; or fewer DataLoader workers run than in the baseline. After
   the machine-wide rules: contention, swapping and a slow disk all starve the
   loader too, so a loader wait is the cause only when nothing explains it.
6. ``unknown``, with the readings that were compared.

Rises are measured against the baseline, never against absolutes alone: a
shared machine may sit at 70 % CPU pressure all day (this development machine
did), and a busy GPU sits at its power cap (SW_POWER_CAP is no slowdown).

``inside`` says whether the suspect lies inside the run, where a restart can
help: ``loader``, and ``memory`` when the run's own anonymous memory (its RSS
where the kernel does not split it) grew by :data:`RSS_GROWTH_BYTES` and
:data:`RSS_GROWTH_SHARE` (a leak: the pages of a memory-mapped dataset are
file-backed and come and go with the cache, a leak's are anonymous).
``--on-slow restart`` acts only then; never for contention or heat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

from trainbox.diagnose.causes import DATALOADER_WORKER, LOADER_FRAMES, main_thread, parse_stacks
from trainbox.system.gpu_clocks import GpuClocks
from trainbox.system.pressure import OutsideProcess, Pressure, Snapshot

SUSPECTS = ("thermal", "memory", "contention", "io", "loader", "unknown")

#: A GPU's clock this much below its baseline clock is clocked down (15 %: beyond the few % that boost clocks wander).
CLOCK_DROP = 0.15
#: A GPU this hot (°C, core/edge sensor) that also clocked down is throttling for heat: consumer NVIDIA cards start
#: lowering their boost clocks in the low 80s, and seed 004's user wanted theirs below 70.
HOT_C = 80.0
#: The run's memory cgroup holding this share of its limit is at its limit (the kernel reclaims from a little below).
LIMIT_FULL_SHARE = 0.9
#: Swap-in that rose by this many pages per second (256 KiB/s of 4 KiB pages) means the working set no longer fits:
#: a run at its pace reads nothing back from swap.
SWAP_IN_RISE_PAGES_S = 64.0
#: A PSI ``some avg10`` that rose by this many points: a fifth more of the time, some task waited for the resource.
PSI_RISE_PCT = 20.0
#: Outside CPU that rose by this much (% of one core): half a core taken from a run, a quarter of a 2-core machine.
CONTENTION_RISE_PCT = 50.0
#: The run's main threads waiting for a CPU this much more of the time (% of one CPU) than in the baseline: a tenth
#: of its time lost to the run queue.
RUN_WAIT_RISE_PCT = 10.0
#: How many outside processes the evidence names, the biggest rise of CPU first (a rise of any size: on a busy
#: machine a new hog may get a fifth of a core).
HOGS_SHOWN = 3
#: How many gone DataLoader workers the evidence names.
WORKERS_SHOWN = 4
#: Iowait (% of all CPU time) that rose by this many points: the disk holds the run up.
IOWAIT_RISE_PCT = 10.0
#: The main thread in the DataLoader in this share of samples or more is loader-bound ...
LOADER_WAIT_SHARE = 0.5
#: ... when that share rose by this much since the baseline (a well-fed loop waits in a few % of samples).
LOADER_WAIT_RISE = 0.25
#: The run's RSS grew by this much and this share since the baseline: its own memory grows (a leak).
RSS_GROWTH_BYTES = 512 * 2**20
RSS_GROWTH_SHARE = 0.2

_GIB = 2.0**30
_MIB = 2.0**20


@dataclass(frozen=True)
class Conditions:
    """The run and its machine over one interval; None (or empty) where it was not read."""

    pressure: Optional[Pressure] = None
    gpus: Tuple[GpuClocks, ...] = ()
    #: DataLoader worker pids (:func:`loader_workers`).
    workers: Optional[FrozenSet[int]] = None
    #: Share of stack samples with the main thread in the DataLoader (:func:`loader_wait_share`), 0..1.
    loader_wait: Optional[float] = None


class Finding(NamedTuple):
    """What one rule found: its evidence, and whether any of it is about the run itself rather than the machine."""

    lines: List[str]
    direct: bool
    #: False: said as evidence, but no suspect (machine-wide figures that the run's own readings clear).
    fires: bool = True


class Explanation(NamedTuple):
    suspect: str
    evidence: Tuple[str, ...]
    #: The suspect lies inside the run (a restart can help): see the module docstring.
    inside: bool


# --- what the supervisor gathers ---------------------------------------------------------------------------------


def loader_workers(snapshot: Snapshot) -> FrozenSet[int]:
    """The run's DataLoader workers in ``snapshot``: its processes that torch named ``pt_data_worker``."""
    return frozenset(pid for pid in snapshot.tree if getattr(snapshot.processes.get(pid), "name", "") == DATALOADER_WORKER)


def loader_wait_share(dumps: Sequence[str], pid: int) -> Optional[float]:
    """The share of ``dumps`` (stack dumps of process ``pid``, py-spy or faulthandler text) in which its main
    thread was in the DataLoader (:data:`trainbox.diagnose.causes.LOADER_FRAMES`); None when no dump shows a main thread."""
    seen = waiting = 0
    for dump in dumps:
        main = main_thread(parse_stacks(dump), pid)
        if main is None:
            continue
        seen += 1
        waiting += any(LOADER_FRAMES.search(frame.where) for frame in main.frames)
    return waiting / seen if seen else None


# --- the rules ---------------------------------------------------------------------------------------------------


def _rise(now: Optional[float], before: Optional[float]) -> Optional[float]:
    return now - before if now is not None and before is not None else None


def _psi_line(resource: str, now: Pressure, before: Pressure) -> Optional[str]:
    """Evidence when ``resource``'s PSI rose by PSI_RISE_PCT or more."""
    value, base = now.psi.get(resource), before.psi.get(resource)
    rise = _rise(value, base)
    if rise is None or rise < PSI_RISE_PCT:
        return None
    return f"{resource} pressure (PSI some avg10) {value:.0f} % (baseline {base:.0f} %)"


def _gpu_line(gpu: GpuClocks, base: Optional[GpuClocks]) -> str:
    temperature = f"{gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else "an unknown temperature"
    line = f"GPU {gpu.index} at {temperature}, clocks {_whole(gpu.clock_mhz)} of {_whole(gpu.max_clock_mhz)} MHz"
    reasons = ", ".join(gpu.slowdowns)
    if reasons:
        line += f", {reasons}"
    if base is not None:
        line += f" (baseline {_whole(base.clock_mhz)} MHz at {_whole(base.temperature_c)} °C)"
    return line


def _whole(value: Optional[float]) -> str:
    """A reading shown to the unit, "?" when unknown."""
    return f"{value:.0f}" if value is not None else "?"


def _throttled(gpu: GpuClocks, base: Optional[GpuClocks]) -> bool:
    new_reasons = set(gpu.slowdowns) - set(base.slowdowns if base else ())
    if new_reasons:
        return True
    if base is None or gpu.clock_mhz is None or not base.clock_mhz or gpu.temperature_c is None:
        return False
    return gpu.clock_mhz <= (1 - CLOCK_DROP) * base.clock_mhz and gpu.temperature_c >= HOT_C


def _thermal(now: Conditions, before: Conditions) -> Finding:
    baseline = {gpu.index: gpu for gpu in before.gpus}
    return Finding(
        [_gpu_line(gpu, baseline.get(gpu.index)) for gpu in now.gpus if _throttled(gpu, baseline.get(gpu.index))], True
    )


def _at_limit(pressure: Pressure) -> bool:
    """The run's memory cgroup is full and hit its limit during the interval."""
    limit = pressure.memory_limit
    if limit is None or not limit.limit_bytes or not pressure.limit_hits_per_s:
        return False
    return limit.usage_bytes >= LIMIT_FULL_SHARE * limit.limit_bytes


def _memory(now: Pressure, before: Pressure) -> Finding:
    lines = []
    if _at_limit(now) and not _at_limit(before) and now.memory_limit is not None:
        usage, limit = now.memory_limit.usage_bytes / _MIB, (now.memory_limit.limit_bytes or 0) / _MIB
        then = f"{before.memory_limit.usage_bytes / _MIB:.0f} MiB" if before.memory_limit is not None else "unknown"
        lines.append(
            f"the run's memory cgroup at {usage:.0f} of {limit:.0f} MiB, its limit hit {now.limit_hits_per_s:.0f} times/s "
            f"(baseline {then})"
        )
    faults = _rise(now.tree_major_faults_per_s, before.tree_major_faults_per_s)
    if faults is not None and faults >= SWAP_IN_RISE_PAGES_S:
        lines.append(
            f"the run's major page faults {now.tree_major_faults_per_s:.0f}/s (baseline {before.tree_major_faults_per_s:.0f}): "
            "its pages are read back from disk"
        )
    direct = bool(lines)
    rise = _rise(now.swap_in_per_s, before.swap_in_per_s)
    if rise is not None and rise >= SWAP_IN_RISE_PAGES_S:
        lines.append(f"swap-in {now.swap_in_per_s:.0f} pages/s (baseline {before.swap_in_per_s:.0f})")
    psi = _psi_line("memory", now, before)
    lines += [psi] if psi else []
    if lines and not direct and faults is not None:  # the run's own faults are read, and did not rise
        lines[-1] += (
            f", not this run's: its major page faults {now.tree_major_faults_per_s:.0f}/s "
            f"(baseline {before.tree_major_faults_per_s:.0f})"
        )
        return Finding(lines, False, fires=False)
    return Finding(lines, direct)


def _rss_growth(now: Pressure, before: Pressure) -> Optional[str]:
    """Evidence when the run's own anonymous memory (else its RSS) grew by RSS_GROWTH_BYTES and RSS_GROWTH_SHARE."""
    anon = now.tree_anon_bytes is not None and before.tree_anon_bytes is not None
    then, size = (before.tree_anon_bytes, now.tree_anon_bytes) if anon else (before.tree_rss_bytes, now.tree_rss_bytes)
    grown = _rise(size, then)
    if grown is None or not then or grown < max(RSS_GROWTH_BYTES, RSS_GROWTH_SHARE * then):
        return None
    what = "anonymous memory" if anon else "RSS"
    return f"the run's {what} {(size or 0) / _GIB:.1f} GiB, +{grown / _GIB:.1f} GiB since the baseline"


def _outside_rises(now: Pressure, before: Pressure) -> List[Tuple[float, OutsideProcess]]:
    """Each outside process's CPU rise since the baseline (a process not in the baseline's list rose from 0), the
    biggest first; only the rises."""
    then = {(p.pid, p.started): p.cpu_pct for p in before.outside}
    rises = [(p.cpu_pct - then.get((p.pid, p.started), 0.0), p) for p in now.outside]
    return sorted(((rise, p) for rise, p in rises if rise > 0), key=lambda item: (-item[0], item[1].pid))


def _contention(now: Pressure, before: Pressure) -> Finding:
    waited = _rise(now.tree_wait_pct, before.tree_wait_pct)
    if waited is not None and waited < RUN_WAIT_RISE_PCT:
        return Finding([], False)  # the run does not wait for a CPU more than it did: whatever others do, not contention
    rises = _outside_rises(now, before)
    psi = _psi_line("cpu", now, before)
    if sum(rise for rise, _ in rises) < CONTENTION_RISE_PCT:
        return Finding([psi] if psi else [], waited is not None)
    then = {(p.pid, p.started): p.cpu_pct for p in before.outside}
    lines = [
        f"pid {p.pid} ({p.name}) outside the run: {p.cpu_pct:.0f} % CPU (baseline {then.get((p.pid, p.started), 0.0):.0f} %)"
        for _, p in rises[:HOGS_SHOWN]
    ]
    if waited is not None:
        lines.append(f"the run waited for a CPU {now.tree_wait_pct:.0f} % of the time (baseline {before.tree_wait_pct:.0f} %)")
    lines.append(f"outside the run: {now.outside_cpu_pct:.0f} % CPU in all (baseline {before.outside_cpu_pct:.0f} %)")
    lines.append(f"the run's own CPU: {now.tree_cpu_pct:.0f} % (baseline {before.tree_cpu_pct:.0f} %)")
    return Finding(lines + ([psi] if psi else []), waited is not None)


def _io(now: Pressure, before: Pressure) -> Finding:
    lines = []
    rise = _rise(now.iowait_pct, before.iowait_pct)
    if rise is not None and rise >= IOWAIT_RISE_PCT:
        lines.append(f"iowait {now.iowait_pct:.0f} % of CPU time (baseline {before.iowait_pct:.0f} %)")
    psi = _psi_line("io", now, before)
    lines += [psi] if psi else []
    if lines and now.tree_read_bytes_per_s is not None and before.tree_read_bytes_per_s is not None:
        reads, base = now.tree_read_bytes_per_s / _MIB, before.tree_read_bytes_per_s / _MIB
        lines.append(f"the run reads {reads:.1f} MiB/s from disk (baseline {base:.1f})")
    return Finding(lines, False)


def _loader(now: Conditions, before: Conditions) -> Finding:
    lines = []
    rise = _rise(now.loader_wait, before.loader_wait)
    if rise is not None and now.loader_wait is not None and now.loader_wait >= LOADER_WAIT_SHARE and rise >= LOADER_WAIT_RISE:
        lines.append(
            f"main thread in the DataLoader in {100 * now.loader_wait:.0f} % of stack samples "
            f"(baseline {100 * (before.loader_wait or 0.0):.0f} %)"
        )
    if now.workers is not None and before.workers is not None and len(now.workers) < len(before.workers):
        gone = " ".join(str(pid) for pid in sorted(before.workers - now.workers)[:WORKERS_SHOWN])
        lines.append(f"DataLoader workers: {len(now.workers)} now, {len(before.workers)} in the baseline (gone: {gone})")
    return Finding(lines, True)


def _readings(now: Conditions, before: Conditions) -> List[str]:
    """What was compared, for an ``unknown``: the main figures, now and in the baseline."""
    if now.pressure is None or before.pressure is None:
        return ["no machine readings to compare (pressure not sampled)"]
    p, b = now.pressure, before.pressure
    return [
        f"outside the run: {p.outside_cpu_pct:.0f} % CPU (baseline {b.outside_cpu_pct:.0f} %)",
        f"the run's own CPU: {p.tree_cpu_pct:.0f} % (baseline {b.tree_cpu_pct:.0f} %)",
        f"iowait {_whole(p.iowait_pct)} % (baseline {_whole(b.iowait_pct)} %), swap-in {_whole(p.swap_in_per_s)} pages/s",
    ]


def explain(before: Conditions, now: Conditions) -> Explanation:
    """The suspect for a slowdown between the baseline's conditions and now's, with evidence (see the module)."""
    found: List[Tuple[str, Finding]] = [("thermal", _thermal(now, before))]
    rss = None
    if now.pressure is not None and before.pressure is not None:
        p, b = now.pressure, before.pressure
        rss = _rss_growth(p, b)
        memory = _memory(p, b)
        memory = memory._replace(lines=memory.lines + [rss]) if memory.lines and memory.fires and rss else memory
        found += [("memory", memory), ("contention", _contention(p, b)), ("io", _io(p, b))]
    found.append(("loader", _loader(now, before)))
    fired = [(suspect, finding) for suspect, finding in found if finding.lines and finding.fires]
    chosen = next((item for item in fired if item[1].direct), fired[0] if fired else None)
    ordered = ([chosen] if chosen else []) + [item for item in fired if item is not chosen]
    evidence = [line for _, finding in ordered for line in finding.lines] or _readings(now, before)
    evidence += [line for _, finding in found if not finding.fires for line in finding.lines]
    if rss is not None and rss not in evidence:
        evidence.append(rss)  # a growing run is worth saying even when it is not (yet) the cause
    suspect = chosen[0] if chosen else "unknown"
    return Explanation(suspect, tuple(evidence), suspect == "loader" or (suspect == "memory" and rss is not None))
