"""Workers from the preloaded forkserver: never forked from the training process, and the same batches in the same
order as spawn-started workers or loading in the training process. Functional only: how fast they start is
bench/loader.py's and bench/gpu.py's to measure, never a test's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, List

import psutil
import pytest
import torch

from tests.supervised import REPO, wait_for
from trainbox.yolo import forkserver, loader
from trainbox.yolo.position import Position


def _base(demo_data: Path) -> Any:
    """Ultralytics' training loader of the demo data, mosaic off (its partners come from a per-process buffer)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides={"imgsz": 64, "mosaic": 0.0, "data": str(demo_data)})
    data = check_det_dataset(str(demo_data))
    dataset = build_yolo_dataset(cfg, data["train"], 8, data, mode="train", stride=32)
    return build_dataloader(dataset, 8, 0, shuffle=True, rank=-1, pin_memory=False, device="cpu")


def _epochs(built: Any, epochs: int = 2) -> List[Any]:
    """Every batch of ``epochs`` epochs: (files, images), as the trainer asks for each epoch."""
    batches = []
    try:
        for epoch in range(epochs):
            built.start_at(Position(epoch, 0))
            batches += [(batch["im_file"], batch["img"]) for batch in built]
    finally:
        built.close()
    return batches


def _rebuilt(demo_data: Path, workers: int, context: Any) -> Any:
    return loader.rebuild(
        _base(demo_data), workers=workers, multiprocessing_context=context, persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None, network_log=None, train=True, seed=5, pin_memory=False,
    )  # fmt: skip


@pytest.mark.training
def test_forkserver_workers_load_what_spawned_ones_and_the_training_process_load(demo_data: Path) -> None:
    forkserver.start()
    served = _rebuilt(demo_data, 2, "forkserver")
    first = next(iter(served))
    parents = {psutil.Process(w.pid).ppid() for w in served.iterator._workers}
    assert psutil.Process().pid not in parents, "a worker was forked from the training process"
    (server,) = parents
    assert "forkserver" in " ".join(psutil.Process(server).cmdline())
    assert psutil.Process(server).ppid() == psutil.Process().pid  # the server is this process's own new program
    served.close()

    runs = {name: _epochs(_rebuilt(demo_data, workers, context)) for name, workers, context in
            (("forkserver", 2, "forkserver"), ("spawn", 2, "spawn"), ("in process", 0, None))}  # fmt: skip
    reference = runs.pop("in process")
    assert first["im_file"] == reference[0][0]
    for name, batches in runs.items():
        assert [files for files, _ in batches] == [files for files, _ in reference], name
        assert all(torch.equal(mine, theirs) for (_, mine), (_, theirs) in zip(batches, reference)), name


#: A training process that starts trainbox's forkserver and loads through its workers, run without a supervisor.
SERVED = """\
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from trainbox.yolo import forkserver

class Slow(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.zeros(4)

if __name__ == "__main__":
    forkserver.start()
    for step, batch in enumerate(DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")):
        print(f"step {step}", flush=True)
        time.sleep(0.05)
"""


@pytest.mark.training
def test_the_forkserver_its_workers_and_the_tracker_die_with_a_training_process_killed_by_sigkill(tmp_path: Path) -> None:
    """The server watched nothing and its workers watched only the server, which a worker kept alive: an OOM kill of
    the training process left four processes running for ever. Tied, none is left after 30 s."""
    program = tmp_path / "served.py"
    program.write_text(SERVED)
    training = subprocess.Popen([sys.executable, str(program)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    tree: List[psutil.Process] = []
    try:
        assert training.stdout is not None
        for line in training.stdout:  # Ultralytics' import may say a word first
            if line.startswith("step"):
                break
        tree = psutil.Process(training.pid).children(recursive=True)
        assert len(tree) >= 4, [p.cmdline() for p in tree]  # the resource tracker, the server and its two workers
        training.kill()
        training.wait(timeout=10)
        wait_for(lambda: not [p for p in tree if _alive(p)], 30, "its tree to end")
    finally:
        for process in [psutil.Process(training.pid), *tree] if training.poll() is None else tree:
            if _alive(process):
                process.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
