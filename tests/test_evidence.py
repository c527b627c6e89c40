"""The sampler (train/evidence.py) on real process trees: compilers, cache growth, sleep, spin."""

from __future__ import annotations

import os
import time
from typing import List

from tests.sampling import Tree, tree, wait_for_children, watch  # noqa: F401 - tree is a fixture
from trainbox import evidence, proctree

SLEEPING_TREE = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        time.sleep(600)
time.sleep(600)
"""


def test_sleeping_tree_is_idle_and_idleness_grows(tree: Tree) -> None:  # noqa: F811
    child = tree.python(SLEEPING_TREE)
    wait_for_children(child.pid, 3)
    time.sleep(1)  # let the interpreter's start-up CPU fall out of the first interval
    sampler = evidence.Sampler(proctree.ProcessTree(child.pid), os.environ)
    window = evidence.Window()
    idle: List[float] = []
    for _ in range(5):
        window.add(sampler.sample())
        idle.append(window.idle_for_s())
        time.sleep(0.5)
    assert len(window.last.procs) == 4  # type: ignore[union-attr]
    assert all(p.state == "S" for p in window.last.procs)  # type: ignore[union-attr]
    assert idle[0] == 0.0 and idle[-1] > idle[1] > 0, idle
    assert window.compile_progress() == ()
    window.clear()
    assert window.idle_for_s() == 0.0 and window.samples == []


def test_python_spin_is_busy_not_idle(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; f.hang_spin()")
    window = watch(child.pid, 3)
    assert window.idle_for_s() == 0.0
    demand = window.demand_cores()
    assert demand[child.pid] > 0.8, demand


def test_to_json_holds_every_sample(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import time; time.sleep(600)")
    window = watch(child.pid, 1)
    rows = window.to_json()
    assert len(rows) == len(window.samples) >= 2
    assert rows[0]["procs"][0]["pid"] == child.pid and "cpu_s" in rows[0]["procs"][0]
