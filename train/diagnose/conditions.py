"""Reading a run's :class:`~trainbox.diagnose.slowness.Conditions` a little at a time, from the supervisor's loop.

A slowdown is explained by what changed since the run was at its pace
(:func:`trainbox.diagnose.slowness.explain`), so the supervisor reads the same
conditions twice: now and then, while the run kept its pace. One reading is:

* two :func:`trainbox.system.pressure.take` snapshots :data:`PRESSURE_INTERVAL_S`
  apart (rates need an interval: other processes' CPU, swap-in, iowait, the
  tree's faults and reads, its memory cgroup's limit hits);
* one GPU reading (:mod:`trainbox.system.gpu_clocks`), from a tool that is asked
  again only while it answers (:class:`GpuReader`: a missing tool is not looked
  for again, a hung one never asked again);
* the DataLoader's workers (the second snapshot's ``pt_data_worker`` processes);
* when asked for, :data:`LOADER_SAMPLES` py-spy dumps of the training process
  (the one that beats), spread over the interval: the share in which its main
  thread waited in the DataLoader (:func:`trainbox.diagnose.slowness.loader_wait_share`).

The supervisor's loop must keep polling (beats, silences, ``state.json``), so a
reading never sleeps: :meth:`ConditionsProbe.step` is called once per poll and
does at most one snapshot or one dump, and returns the Conditions once both
snapshots are in. Its cost is counted (:attr:`ConditionsProbe.spent_s`, wall
seconds in the probe) for ``bench/slow.py``: a snapshot with 300 processes on
the development machine takes 7.5 ms of CPU (:mod:`trainbox.system.pressure`),
a py-spy dump of a small process about 30 ms, nvidia-smi's query 28 ms on an H100.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from trainbox.diagnose import incident
from trainbox.diagnose.slowness import Conditions, loader_wait_share, loader_workers
from trainbox.system import gpu_clocks, pressure
from trainbox.system.gpu_clocks import GpuClocks, Reading

#: Seconds between a reading's two snapshots: a rate over 5 s is steady enough on a busy machine (a second's burst
#: of a neighbour counts for a fifth) and short enough that an explanation follows its slowdown at once.
PRESSURE_INTERVAL_S = 5.0
#: Stack samples of the training process in a reading that asks for them: at 5, a share of 0.5 or more (the loader
#: rule's bar) is told from a well-fed loop's few % by 3 samples or more out of 5.
LOADER_SAMPLES = 5
#: ... spread this far apart over the interval, so that they see different steps.
LOADER_SPACING_S = 0.9
#: How long one py-spy dump may take inside the supervisor's loop (a small process dumps in ~0.1 s; a hung py-spy is
#: given up, and its sample is missing).
DUMP_TIMEOUT_S = 2.0

Dump = Callable[[int], Optional[str]]
Take = Callable[..., pressure.Snapshot]


def _dump(pid: int) -> Optional[str]:
    return incident.py_spy_stack(pid, DUMP_TIMEOUT_S)


class GpuReader:
    """The GPUs' clocks, from :func:`trainbox.system.gpu_clocks.query`, given up for good once no tool answers."""

    def __init__(self, query: Callable[[], Optional[Reading]] = gpu_clocks.query) -> None:
        self.query = query
        self.given_up = False

    def read(self) -> Tuple[GpuClocks, ...]:
        if self.given_up:
            return ()
        reading = self.query()
        if reading is None or reading.hung:  # no tool installed, or one stuck in the driver: do not ask again
            self.given_up = True
            return ()
        return reading.gpus


@dataclass
class _Reading:
    """One reading under way: the first snapshot, the GPUs, the dumps so far."""

    wall: float
    first: pressure.Snapshot
    gpus: Tuple[GpuClocks, ...]
    main_pid: Optional[int]
    loader: bool
    next_dump: float
    dumps: List[str] = field(default_factory=list)


class ConditionsProbe:
    """Reads one :class:`Conditions` at a time, a step per poll (see the module docstring)."""

    def __init__(
        self,
        gpus: Optional[GpuReader] = None,
        dump: Dump = _dump,
        take: Take = pressure.take,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus or GpuReader()
        self.dump = dump
        self.take = take
        self.clock = clock
        self.reading: Optional[_Reading] = None
        #: Wall seconds spent in the probe's own calls, for bench/slow.py.
        self.spent_s = 0.0

    @property
    def busy(self) -> bool:
        return self.reading is not None

    def begin(self, tree: Sequence[int], root: Optional[int], main_pid: Optional[int], loader: bool, wall: float) -> None:
        """Start a reading (dropping one under way); ``loader``: sample ``main_pid``'s stacks too."""
        started = self.clock()
        first = self.take(tree, root=root)
        self.reading = _Reading(wall, first, self.gpus.read(), main_pid, loader and main_pid is not None, started)
        self.spent_s += self.clock() - started

    def cancel(self) -> None:
        self.reading = None

    def step(self, tree: Sequence[int], root: Optional[int]) -> Optional[Tuple[float, Conditions]]:
        """One step of the reading under way: (when it began, unix seconds; its Conditions) once done, else None."""
        reading = self.reading
        if reading is None:
            return None
        started = self.clock()
        try:
            if reading.loader and len(reading.dumps) < LOADER_SAMPLES and started >= reading.next_dump:
                text = self.dump(reading.main_pid) if reading.main_pid is not None else None
                reading.dumps.append(text or "")
                reading.next_dump = started + LOADER_SPACING_S
                return None
            if started - reading.first.ts < PRESSURE_INTERVAL_S:
                return None
            second = self.take(tree, root=root)
            self.reading = None
            return reading.wall, Conditions(
                pressure=pressure.compare(reading.first, second),
                gpus=reading.gpus,
                workers=loader_workers(second),
                loader_wait=self._share(reading),
            )
        finally:
            self.spent_s += self.clock() - started

    @staticmethod
    def _share(reading: _Reading) -> Optional[float]:
        if not reading.loader or reading.main_pid is None:
            return None
        return loader_wait_share([text for text in reading.dumps if text], reading.main_pid)
