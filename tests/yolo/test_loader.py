"""The profile really reaches the trainer's DataLoader (on CPU, where Ultralytics forces workers=0)."""

from __future__ import annotations

import itertools
import math
import pickle
import signal
import time
from pathlib import Path
from typing import Any, Iterator, List

import psutil
import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from trainbox.yolo import profiles
from trainbox.yolo.settings import from_profile

SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


@pytest.fixture()
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _trainer(profile_name: str, demo_data: Path, run_dir: Path) -> Any:
    from trainbox.yolo.trainer import ProfiledDetectionTrainer

    profile = profiles.load(profile_name)
    overrides = {
        "model": "yolov8n.yaml",
        "data": str(demo_data),
        "imgsz": 64,
        "batch": 8,
        "device": "cpu",
        "plots": False,
        "project": str(run_dir),
        "name": "train",
        "exist_ok": True,
    }
    trainer = ProfiledDetectionTrainer(overrides=overrides, settings=from_profile(profile, {}, 60.0))
    trainer.setup_model()
    return trainer


def _workers(loader: Any) -> List[psutil.Process]:
    return [psutil.Process(w.pid) for w in getattr(loader.iterator, "_workers", [])]


def _handles_sigusr1(proc: psutil.Process, wait: float = 60.0) -> bool:
    """Whether ``proc`` catches SIGUSR1 (a worker installs it in its init, which may still be running)."""
    deadline = time.monotonic() + wait
    while True:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & SIGUSR1_BIT or time.monotonic() > deadline:
            return bool(int(caught.split()[1], 16) & SIGUSR1_BIT)
        time.sleep(0.1)


def test_balanced_spawns_two_fresh_workers_per_epoch(
    demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_threads: None
) -> None:
    monkeypatch.setenv("TRAIN_RUN_DIR", str(tmp_path))
    trainer = _trainer("balanced", demo_data, tmp_path)
    assert trainer.args.workers == 2  # Ultralytics' BaseTrainer set 0 on CPU
    assert torch.get_num_threads() == 2  # and cpu_count - 1 threads
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
    assert loader.num_workers == 2
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert loader.persistent_workers is False and loader.prefetch_factor == 2

    batches = iter(loader)
    assert next(batches)["img"].shape[0] == 8
    workers = _workers(loader)
    assert len(workers) == 2
    for proc in workers:
        assert proc.ppid() == psutil.Process().pid
        assert any("spawn_main" in part for part in proc.cmdline()), proc.cmdline()
        assert _handles_sigusr1(proc)  # the stack-dump handler, installed by the worker init
    assert len(list(batches)) == len(loader) - 1
    psutil.wait_procs(workers, timeout=30)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
    assert loader.iterator is None  # not persistent: the next epoch starts new workers
    assert sorted((tmp_path / "stacks").glob("*.txt"))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # 4 workers on a 2-core box
def test_fast_keeps_four_persistent_workers(
    demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_threads: None
) -> None:
    monkeypatch.setenv("TRAIN_RUN_DIR", str(tmp_path))
    trainer = _trainer("fast", demo_data, tmp_path)
    assert trainer.args.workers == 4
    loader = trainer.get_dataloader(trainer.data["train"], batch_size=8, rank=-1, mode="train")
    assert loader.num_workers == 4 and loader.persistent_workers is True
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    try:
        assert len(list(loader)) == len(loader)
        first = {p.pid for p in _workers(loader)}
        assert len(first) == 4 and all(psutil.pid_exists(pid) for pid in first)
        assert psutil.Process().pid not in {p.ppid() for p in _workers(loader)}, "forked from the training process"
        assert len(list(loader)) == len(loader)
        assert {p.pid for p in _workers(loader)} == first
    finally:
        loader.close()


def test_safe_loads_in_the_training_process(demo_data: Path, tmp_path: Path, restore_threads: None) -> None:
    trainer = _trainer("safe", demo_data, tmp_path)
    loader = trainer.get_dataloader(trainer.data["val"], batch_size=8, rank=-1, mode="val")
    assert loader.num_workers == 0 and trainer.args.val is True
    before = {p.pid for p in psutil.Process().children()}
    batches = iter(loader)
    assert next(batches)["img"].shape[0] == 8
    assert {p.pid for p in psutil.Process().children()} == before


def test_indices_carry_the_epoch_and_batch_they_are_fetched_for() -> None:
    from trainbox.yolo.loader import EpochTaggedRepeatSampler

    sampler = EpochTaggedRepeatSampler(BatchSampler(SequentialSampler(range(5)), 2, False), first_epoch=3)
    got = list(itertools.islice(iter(sampler), 6))
    assert [[int(i) for i in batch] for batch in got] == [[0, 1], [2, 3], [4], [0, 1], [2, 3], [4]]
    assert [(batch[0].epoch, batch[0].batch) for batch in got] == [(3, 1), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3)]
    copy = pickle.loads(pickle.dumps(got[4][1]))  # as it travels to a worker
    assert (int(copy), copy.epoch, copy.batch) == (3, 4, 2)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_ddp_ranks_share_is_the_distributed_samplers(ranks: int) -> None:
    """Each rank trains its DistributedSampler share of the epoch's order: the same number of batches on every rank."""
    from torch.utils.data import DistributedSampler

    from trainbox.yolo.position import PositionedBatchSampler, epoch_order

    size, batch = 10, 2
    order = epoch_order(size, 0, 0, True)
    shares = []
    for rank in range(ranks):
        sampler = PositionedBatchSampler(size, batch, 0, True, shard=(rank, ranks))
        share = [int(i) for chunk in itertools.islice(iter(sampler), len(sampler)) for i in chunk]
        expected = [order[i] for i in DistributedSampler(range(size), num_replicas=ranks, rank=rank, shuffle=False)]
        assert share == expected
        assert len(sampler) == math.ceil(math.ceil(size / ranks) / batch)
        shares.append(share)
    assert len({len(share) for share in shares}) == 1 and set().union(*shares) == set(range(size))
