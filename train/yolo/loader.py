"""The profile's DataLoader: worker count, start method, persistence and prefetch that really apply.

Ultralytics' ``build_dataloader`` forces its own choices (``workers=0`` on CPU,
``prefetch_factor`` 4/2, never a start method or persistent workers, and its
``InfiniteDataLoader`` keeps one worker pool for the whole run). The trainer
lets Ultralytics build its loader (dataset, sampler, collate function, seeded
generator, pin memory) and re-creates it here as a ``ProfileDataLoader`` with
the profile's options; its workers start lazily on first iteration, as
Ultralytics' do, so the discarded loader never started any.

* ``persistent_workers=False`` means what it says: the worker processes end
  with each pass over the data and fresh ones start for the next epoch or
  validation pass (Ultralytics would keep them for the whole run).
* torch < 2.0: Ultralytics drops ``prefetch_factor`` there; it is set on the
  loader after construction instead, which torch 1.13 honours.
* Every worker runs ``WorkerInit``: Ultralytics' seeding, the stack-dump
  handler (spawn-started workers inherit no signal handler), the network
  guard, and the ``worker`` fault site inside ``__getitem__``.

Fault site ``worker``: in training loaders it is ``SeededSamples``' (see
``trainbox.yolo.position``); in validation loaders' worker processes, inside
the dataset's ``__getitem__`` (the worker's copy of the dataset gets a
subclass that adds the site), with context keys ``epoch``, ``batch`` (1-based,
the pass it is fetched for), ``train`` (0), ``worker`` (id) and ``sample``
(samples this worker has fetched, 1-based).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler, get_worker_info
from ultralytics.data.build import InfiniteDataLoader
from ultralytics.utils import LOGGER

from trainbox import faults, heartbeat
from trainbox.yolo import offline
from trainbox.yolo.position import Position, PositionedBatchSampler, SeededSamples, TaggedIndex


class EpochTaggedRepeatSampler:
    """Repeats a batch sampler forever (as Ultralytics' ``_RepeatSampler``), tagging each index.

    Each pass over ``sampler`` is one epoch, counted from ``first_epoch`` as
    it is when the loader starts its workers (the trainer keeps it current).
    """

    def __init__(self, sampler: Sampler, first_epoch: int = 1) -> None:
        self.sampler = sampler
        self.first_epoch = first_epoch

    def __iter__(self) -> Iterator[List[TaggedIndex]]:
        epoch = self.first_epoch
        while True:
            for batch, indices in enumerate(self.sampler, 1):
                yield [TaggedIndex(index, epoch, batch) for index in indices]
            epoch += 1


def _fault_point(dataset: Any, index: Any) -> None:
    dataset.trainbox_samples += 1
    if os.environ.get(faults.FAULT_ENV):
        faults.point(
            "worker",
            epoch=getattr(index, "epoch", None),
            batch=getattr(index, "batch", None),
            train=int(dataset.trainbox_train),
            worker=dataset.trainbox_worker,
            sample=dataset.trainbox_samples,
        )


_fault_classes: Dict[type, type] = {}


def with_fault_point(cls: Any) -> type:
    """A direct subclass of ``cls`` whose ``__getitem__`` passes the ``worker`` fault site first.

    A worker switches its own copy of the dataset to it (a direct subclass
    keeps the instance layout, which ``__class__`` assignment requires).
    """
    if cls not in _fault_classes:
        getitem = cls.__getitem__

        def __getitem__(self: Any, index: Any) -> Any:
            _fault_point(self, index)
            return getitem(self, index)

        namespace = {"__getitem__": __getitem__, "__module__": cls.__module__, "trainbox_samples": 0}
        _fault_classes[cls] = type(cls.__name__, (cls,), namespace)
    return _fault_classes[cls]


class WorkerInit:
    """``worker_init_fn`` for profile loaders; picklable, so spawn-started workers get it too."""

    def __init__(self, seed_worker: Optional[Callable[[int], None]], network_log: Optional[Path], train: bool = True) -> None:
        self.seed_worker = seed_worker
        self.network_log = network_log
        self.train = train

    def __call__(self, worker_id: int) -> None:
        if self.seed_worker is not None:
            self.seed_worker(worker_id)
        heartbeat.install_stack_dump()
        if self.network_log is not None:
            offline.install_network_guard(self.network_log)
        info = get_worker_info()
        if info is not None and not isinstance(info.dataset, SeededSamples) and type(info.dataset) not in _fault_classes.values():
            dataset: Any = info.dataset
            dataset.__class__ = with_fault_point(type(dataset))  # this worker's copy only
            dataset.trainbox_worker, dataset.trainbox_train = worker_id, self.train


class ProfileDataLoader(InfiniteDataLoader):
    """Ultralytics' infinite loader, with the start method, persistence and prefetch of a profile."""

    iterator: Any

    def __init__(
        self,
        *args: Any,
        prefetch_factor: Optional[int] = None,
        positioned: Optional[PositionedBatchSampler] = None,
        **kwargs: Any,
    ) -> None:
        workers = kwargs.get("num_workers", 0)
        if workers == 0:
            kwargs.pop("multiprocessing_context", None)
            kwargs["persistent_workers"] = False
        super().__init__(*args, prefetch_factor=prefetch_factor if workers else None, **kwargs)
        if workers and prefetch_factor:
            self.prefetch_factor = prefetch_factor
        repeat: Any = self.batch_sampler  # Ultralytics' _RepeatSampler around the epoch's batch sampler
        self.positioned = positioned
        self.tagger = EpochTaggedRepeatSampler(repeat.sampler)
        object.__setattr__(self, "batch_sampler", positioned or self.tagger)
        self.next_position = Position(0, 0)

    def __len__(self) -> int:
        """Batches in a full epoch."""
        return len(self.positioned) if self.positioned is not None else super().__len__()

    def set_epoch(self, epoch: int) -> None:
        """The epoch (1-based) that the next pass over the data belongs to."""
        if self.iterator is None:
            self.tagger.first_epoch = epoch

    def start_at(self, position: Position) -> None:
        """Where the next pass begins: a fresh iteration starts there; a running one is already in order."""
        self.next_position = position

    def __iter__(self) -> Any:
        if self.positioned is None:
            yield from super().__iter__()
        else:
            if self.iterator is None:
                self.positioned.seek(self.next_position)
                self.iterator = self._get_iterator()
            for _ in range(len(self) - self.next_position.batch):
                yield next(self.iterator)
        if not self.persistent_workers:
            self.close()
            self.iterator = None

    def close(self) -> None:
        """Shut the workers down; a worker that dies while exiting, after its last batch, is not an error.

        Spawn-started workers end through interpreter finalization, where some
        torch builds' C++ static destructors abort ("terminate called without
        an active exception", seen with torch 2.x CPU wheels, about one exit in
        twenty). PyTorch's SIGCHLD handler then raises "worker ... killed by
        signal: Aborted" from inside the shutdown, although every batch was
        delivered. Any other error is raised.
        """
        try:
            super().close()
        except RuntimeError as exc:
            if "killed by signal" not in str(exc):
                raise
            LOGGER.warning(f"trainbox: a DataLoader worker died while shutting down, after its last batch ({exc})")

    @property
    def workers_running(self) -> bool:
        """Whether worker processes are up (False before the first pass and between non-persistent passes)."""
        return self.iterator is not None and self.num_workers > 0


def rebuild(
    base: DataLoader,
    workers: int,
    multiprocessing_context: Optional[str],
    persistent_workers: bool,
    prefetch_factor: Optional[int],
    network_log: Optional[Path],
    train: bool,
    seed: int = 0,
    pin_memory: Optional[bool] = None,
) -> ProfileDataLoader:
    """A ProfileDataLoader over the same dataset, sampler and collate function as ``base``.

    ``workers`` is capped at the number of batches (more processes than batches never help).
    ``pin_memory`` None keeps ``base``'s (Ultralytics pins whenever it trains on a GPU).
    A training loader gets the positioned sampler and per-sample seeds of
    ``trainbox.yolo.position`` (mid-epoch resume; same order for any worker count;
    a DDP rank's loader, whose sampler Ultralytics made a DistributedSampler, its share).
    """
    batches = len(base)  # Ultralytics' loaders count batches
    options: Dict[str, Any] = {}
    if getattr(base, "pin_memory_device", ""):
        options["pin_memory_device"] = base.pin_memory_device
    if train:
        shuffle = isinstance(base.sampler, RandomSampler)
        shard = (0, 1)
        if isinstance(base.sampler, DistributedSampler):  # a DDP rank: its share of the epoch
            shuffle, shard = base.sampler.shuffle, (base.sampler.rank, base.sampler.num_replicas)
        size = len(base.dataset)  # type: ignore[arg-type]  # Ultralytics' datasets are sized
        positioned = PositionedBatchSampler(size, base.batch_size or 1, seed, shuffle, base.drop_last, shard)
        options.update(dataset=SeededSamples(base.dataset, seed), positioned=positioned)
    else:
        options.update(dataset=base.dataset)
    return ProfileDataLoader(
        batch_size=base.batch_size,
        sampler=base.sampler,
        drop_last=base.drop_last,
        num_workers=min(workers, batches),
        collate_fn=base.collate_fn,
        pin_memory=base.pin_memory if pin_memory is None else pin_memory,
        generator=base.generator,
        worker_init_fn=WorkerInit(base.worker_init_fn, network_log, train),
        multiprocessing_context=multiprocessing_context,
        persistent_workers=persistent_workers,
        prefetch_factor=prefetch_factor,
        **options,
    )
