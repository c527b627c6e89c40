"""The classifier (train/causes.py) on real hangs here, and on recorded evidence for what cannot happen here."""

from __future__ import annotations

import os
from typing import Dict

from tests.sampling import Tree, tree, wait_for_children, watch  # noqa: F401 - tree is a fixture
from trainbox import incident
from trainbox.causes import Cause, classify


def stacks_of(pids: list) -> Dict[int, str]:
    """Real stacks, as the incident collects them (py-spy here)."""
    found = incident.collect_stacks(pids, None)
    return {pid: text for pid, (text, _) in found.items() if text}


def test_python_spin_is_busy_python(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; f.hang_spin()")
    window = watch(child.pid, 3)
    diagnosis = classify(window, stacks_of([child.pid]), child.pid)
    assert diagnosis.cause is Cause.BUSY_PYTHON, diagnosis
    assert "hang_spin" in diagnosis.evidence[0]


def test_lock_deadlock_is_idle(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import time; time.sleep(1.5); import trainbox.faults as f; f.hang_lock_deadlock()")
    window = watch(child.pid, 5)
    diagnosis = classify(window, stacks_of([child.pid]), child.pid)
    assert diagnosis.cause is Cause.IDLE, diagnosis
    assert diagnosis.evidence[0].startswith("whole tree idle for")
    assert "hang_lock_deadlock" in diagnosis.evidence[1]
    assert diagnosis.to_dict() == {"cause": "idle", "evidence": list(diagnosis.evidence)}


HANGING_LOADER = """
import torch
from torch.utils.data import DataLoader, Dataset
from trainbox import faults

class Hangs(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        faults.point("worker", index=index)
        return torch.zeros(3)

for batch in DataLoader(Hangs(), batch_size=4, num_workers=2, multiprocessing_context="fork"):
    pass
"""


def test_dataloader_with_blocked_forked_workers_is_loader_deadlock(tree: Tree) -> None:  # noqa: F811
    child = tree.python(HANGING_LOADER, env=dict(os.environ, TRAIN_FAULT="sleep@worker"))
    wait_for_children(child.pid, 2, timeout=120)
    window = watch(child.pid, 4)
    workers = [p.pid for p in window.last.procs if p.ppid == child.pid]  # type: ignore[union-attr]
    diagnosis = classify(window, stacks_of([child.pid, *workers]), child.pid)
    assert diagnosis.cause is Cause.LOADER_DEADLOCK, diagnosis
    assert diagnosis.evidence[0] == "main thread in torch/utils/data/dataloader.py:_MultiProcessingDataLoaderIter._try_get_data"
    assert diagnosis.evidence[1].startswith(f"workers {' '.join(map(str, workers))}: ")
    assert "blocked in train/faults.py:hang_sleep (from <string>:Hangs.__getitem__)" in diagnosis.evidence[1]
