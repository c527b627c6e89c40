"""The process tree leaves out what is the supervisor's own (the notifiers it runs while an attempt trains), and a
stopped process is woken to act on its SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tests.supervised import REPO
from trainbox.system import proctree

#: Run as its own process: a child subreaper, like the supervisor, whose later children a tree adopts.
PROGRAM = textwrap.dedent(
    """\
    import json, os, subprocess, time
    import psutil
    from trainbox.system import proctree
    from trainbox.supervise.notify.notifier import Notifier

    assert proctree.become_subreaper()
    root = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the attempt's child
    time.sleep(0.1)  # the notification comes during the attempt: a later child of ours, as an orphan of its tree is
    notifier = Notifier(["sh", "-c", "sleep 60 & exec sleep 61"], frozenset({"stall"}))
    notifier.send({"event": "stall", "attempt": 0})
    while not notifier.groups():
        time.sleep(0.01)
    (group,) = notifier.groups()

    def in_group():
        return sorted(p.pid for p in psutil.Process().children(recursive=True) if os.getpgid(p.pid) == group)

    while len(in_group()) < 2:
        time.sleep(0.01)
    blind = sorted(p.pid for p in proctree.ProcessTree(root.pid).scan())
    seeing = sorted(p.pid for p in proctree.ProcessTree(root.pid, notifier.groups).scan())
    print(json.dumps({"root": root.pid, "notifier": in_group(), "blind": blind, "seeing": seeing}))
    root.kill()
    root.wait()
    notifier.close(0)
    """
)


def test_a_notifier_in_flight_is_not_part_of_the_training_tree() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / ".mypy"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["seeing"] == [found["root"]]
    assert set(found["notifier"]) <= set(found["blind"]), "without the notifier's groups the tree would adopt it"


def test_a_stopped_process_is_continued_after_sigterm_and_ends_well_within_the_grace() -> None:
    """A SIGSTOPped child keeps SIGTERM pending: it is sent SIGCONT right after, and ends on the SIGTERM in a moment,
    not at the SIGKILL after the whole grace."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        tree = proctree.ProcessTree(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.01)
        result = tree.terminate(grace=20)
    finally:
        child.kill()
        child.wait()
    # Ended by the SIGTERM, not killed: without the SIGCONT it would still be stopped when the 20 s grace ran out.
    assert result["continued"] == [child.pid] and result["terminated"] == [child.pid] and result["killed"] == []
    assert child.returncode == -signal.SIGTERM


def test_a_torchrun_rank_is_described_with_its_rank_and_a_plain_process_without() -> None:
    """The incident's processes.json says whose stack is whose: torchrun's variables, read from each process."""
    env = dict(os.environ, RANK="3", LOCAL_RANK="1", GROUP_RANK="1")
    ranked = subprocess.Popen(["sleep", "30"], env=env)
    plain = subprocess.Popen(["sleep", "30"], env={k: v for k, v in os.environ.items() if k not in proctree.RANK_VARIABLES})
    try:
        rows = {row["pid"]: row for row in proctree.describe([psutil.Process(ranked.pid), psutil.Process(plain.pid)])}
        assert (rows[ranked.pid]["rank"], rows[ranked.pid]["local_rank"], rows[ranked.pid]["group_rank"]) == (3, 1, 1)
        assert "rank" not in rows[plain.pid]
    finally:
        for proc in (ranked, plain):
            proc.kill()
            proc.wait()
