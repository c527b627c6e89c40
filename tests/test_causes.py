"""The classifier (train/causes.py) on real hangs here, and on recorded evidence for what cannot happen here."""

from __future__ import annotations

from typing import Dict

from tests.sampling import Tree, tree, watch  # noqa: F401 - tree is a fixture
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
