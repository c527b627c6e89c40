"""The classifier (train/causes.py) on real hangs here, and on recorded evidence for what cannot happen here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

import pytest

from tests.sampling import Tree, tree, wait_for_children, watch  # noqa: F401 - tree is a fixture
from trainbox import incident
from trainbox.causes import Cause, classify
from trainbox.evidence import Window


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


FIXTURES = Path(__file__).parent / "fixtures" / "causes"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists()))
def test_recorded_evidence_is_classified(name: str) -> None:
    """gpu_wait and io_wait from recorded evidence (tests/fixtures/causes/README.md says where each came from)."""
    fixture = FIXTURES / name
    expected = json.loads((fixture / "expected.json").read_text())
    window = Window.from_json(json.loads((fixture / "evidence.json").read_text()))
    stacks = {int(path.stem): path.read_text() for path in (fixture / "stacks").glob("*.txt")}
    diagnosis = classify(window, stacks, expected["main_pid"], (fixture / "kernel.txt").read_text())
    assert diagnosis.cause.value == expected["cause"], diagnosis
    assert expected["first_evidence_has"] in diagnosis.evidence[0], diagnosis
    for absent in expected["no_evidence_has"]:
        assert not any(absent in line for line in diagnosis.evidence), diagnosis
