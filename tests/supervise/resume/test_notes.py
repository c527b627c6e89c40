"""The monitor's look for the newest checkpoint, in milliseconds: it runs beside the loop, never in its way."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Optional

from tests.supervise.resume.test_checkpoints import torch_file
from trainbox.rundir.layout import RunDir
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.resume.checkpoints import Checkpoint, choose, find
from trainbox.supervise.resume.notes import LOOK_S, ResumeNotes

LAUNCH = Launch(argv=["x"], startup_timeout=60, stall_timeout=30)


def test_a_look_that_takes_long_never_holds_up_the_loop(tmp_path: Path) -> None:
    saved = torch_file(tmp_path / "ck" / "step-10.pt", 1000.0)
    disk = threading.Event()  # a disk that answers only when told: the look waits on it, the loop does not
    looks = []

    def newest(launch: Launch) -> Optional[Checkpoint]:
        looks.append(launch)
        disk.wait(30)
        return choose(find(("ck/*.pt",), [tmp_path]))[0]

    record = Record(RunDir(tmp_path / "run"))
    notes = ResumeNotes(record, newest)
    notes.look(LAUNCH, 100.0)  # the loop goes on at once
    for turn in range(1, 4):
        notes.look(LAUNCH, 100.0 + turn * LOOK_S)
    assert len(looks) == 1, "one look at a time"
    disk.set()
    assert notes._looking is not None
    notes._looking.join(30)
    notes.look(LAUNCH, 200.0, last=True)  # the attempt ends: what was found is published
    state = json.loads(record.run_dir.state.read_text())
    assert state["checkpoint"]["path"] == str(saved) and state["checkpoint"]["step"] == 10
