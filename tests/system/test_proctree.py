"""The process tree leaves out what is the supervisor's own: the notifiers it runs while an attempt trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.supervised import REPO

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
