"""Where a run is inside an epoch, and a sample order that can continue from there.

Exact mid-epoch resume needs three things PyTorch's samplers do not give:

* an order that depends only on ``(seed, epoch)`` — not on the history of a
  generator, nor on the number of DataLoader workers (PyTorch's
  StatefulDataLoader refuses a resume with another worker count; here the
  order is computed in the training process and workers only load);
* a start inside the epoch that never touches the skipped samples: the
  sampler simply begins at batch ``k``;
* augmentation that is a function of ``(seed, epoch, index)``, so the same
  sample gets the same random transform whichever worker loads it and
  whether or not the run was interrupted. ``SeededSamples`` reseeds
  ``random``, ``numpy`` and ``torch`` before each sample (in the training
  process it restores their state afterwards, so nothing else sees the
  reseeding). Ultralytics' mosaic also draws partners from a per-process
  buffer of recently loaded images, which differs per worker and restarts
  empty: mosaic partners are reproducible only with ``mosaic=0``.

The sampler yields ``TaggedIndex`` values: ints that also carry the epoch
and batch they are fetched for, which a worker could not know otherwise.

Fault site ``worker`` (inside ``SeededSamples.__getitem__``, in a worker
process or, with ``workers=0``, in the training process), context keys:
``epoch`` and ``batch`` (1-based) the sample is fetched for (workers
prefetch, so a worker may fetch for the next epoch while the trainer still
runs this one), ``index``, ``train`` (1), ``worker`` (id, -1 in the training
process) and ``sample`` (samples this process has loaded, 1-based).

``TRAIN_SAMPLE_LOG=FILE`` appends ``load EPOCH INDEX ATTEMPT FILE`` for every
sample loaded and ``train EPOCH BATCH ATTEMPT FILES...`` for every batch
trained (0-based epoch and batch): what the resume tests compare.
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from trainbox import faults

SAMPLE_LOG_ENV = "TRAIN_SAMPLE_LOG"


@dataclass(frozen=True)
class Position:
    """The next batch to train: ``batch`` (0-based) of ``epoch`` (0-based, as Ultralytics counts)."""

    epoch: int
    batch: int

    def to_dict(self) -> Dict[str, int]:
        return asdict(self)


class TaggedIndex(int):
    """A dataset index that also carries the epoch and batch (both 1-based) it is fetched for."""

    epoch: int
    batch: int

    def __new__(cls, value: int, epoch: int, batch: int) -> TaggedIndex:
        index = super().__new__(cls, value)
        index.epoch, index.batch = epoch, batch
        return index

    def __reduce__(self) -> Tuple[Any, Tuple[int, int, int]]:
        return TaggedIndex, (int(self), self.epoch, self.batch)


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> List[int]:
    """The sample order of one epoch: a pure function of its arguments."""
    if not shuffle:
        return list(range(size))
    generator = torch.Generator().manual_seed(_mix(seed, epoch))
    return torch.randperm(size, generator=generator).tolist()


def _mix(*parts: int) -> int:
    digest = hashlib.blake2b(" ".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class PositionedBatchSampler(Sampler):
    """Endless batches of tagged indices, epoch after epoch, from a position that can be set.

    ``len()`` is the number of batches in a full epoch. ``seek()`` decides
    where the next ``iter()`` starts; an iteration already running carries
    on into the following epochs in order (a persistent loader's prefetch).

    ``shard=(rank, ranks)``: a DDP rank's share of each epoch's order, as
    PyTorch's DistributedSampler takes it (the order padded from its start to
    a multiple of ``ranks``, then every ``ranks``-th sample from ``rank``), so
    every rank trains the same number of batches and a position means the
    same on all of them.
    """

    def __init__(
        self, size: int, batch_size: int, seed: int, shuffle: bool, drop_last: bool = False, shard: Tuple[int, int] = (0, 1)
    ) -> None:
        if size <= 0 or batch_size <= 0:
            raise ValueError(f"need samples and a batch size, got size={size}, batch_size={batch_size}")
        self.rank, self.ranks = shard
        self.total = size
        size = -(-size // self.ranks)  # this rank's samples per epoch
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.position = Position(0, 0)

    def __len__(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return full if self.drop_last or not rest else full + 1

    def share(self, order: List[int]) -> List[int]:
        """This rank's part of an epoch's order (all of it without DDP)."""
        if self.ranks == 1:
            return order
        padded = order + order[: self.size * self.ranks - len(order)]
        return padded[self.rank :: self.ranks]

    def seek(self, position: Position) -> None:
        if not 0 <= position.batch < len(self):
            raise ValueError(f"batch {position.batch} is outside an epoch of {len(self)} batches")
        self.position = position

    def __iter__(self) -> Iterator[List[TaggedIndex]]:
        epoch, start = self.position.epoch, self.position.batch
        while True:
            order = self.share(epoch_order(self.total, self.seed, epoch, self.shuffle))
            for batch in range(start, len(self)):
                chunk = order[batch * self.batch_size : (batch + 1) * self.batch_size]
                yield [TaggedIndex(index, epoch + 1, batch + 1) for index in chunk]
            epoch, start = epoch + 1, 0


def record(kind: str, epoch: int, number: int, files: Sequence[str]) -> None:
    """Append one line to ``$TRAIN_SAMPLE_LOG`` (a single write: lines from workers do not interleave)."""
    path = os.environ.get(SAMPLE_LOG_ENV)
    if not path:
        return
    attempt = os.environ.get("TRAIN_ATTEMPT", "0")
    line = f"{kind} {epoch} {number} {attempt} {' '.join(Path(f).name for f in files)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _seed_all(seed: int) -> None:
    """Seed the generators a sample's augmentation draws from: ``random``, numpy's and torch's CPU generator.

    Torch's CPU generator directly, not ``torch.manual_seed``: that also seeds every accelerator backend (CUDA, MPS,
    XPU, ...) at about 0.14 ms a call, a fifth of a 160 px sample's loading on a 2-core CPU (bench/results/loader.md),
    and in the training process (``workers=0``) it would reseed the GPU's generator at every sample, which
    ``SeededSamples`` does not restore. The CPU generator's state after either call is the same.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


class SeededSamples(Dataset):
    """The training dataset, loaded with per-sample seeds and the ``worker`` fault site."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.samples = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        self.samples += 1
        epoch, batch = getattr(index, "epoch", 0), getattr(index, "batch", 0)
        info = get_worker_info()
        if os.environ.get(faults.FAULT_ENV):
            worker = info.id if info is not None else -1
            faults.point("worker", epoch=epoch, batch=batch, index=int(index), train=1, worker=worker, sample=self.samples)
        files = getattr(self.dataset, "im_files", None)
        record("load", epoch - 1, int(index), [files[index]] if files else [])
        if info is not None:
            _seed_all(_mix(self.seed, epoch, int(index)))
            return self.dataset[int(index)]
        saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            _seed_all(_mix(self.seed, epoch, int(index)))
            return self.dataset[int(index)]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
