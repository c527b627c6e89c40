"""A restart that resumes, end to end: a plain loop that never heard of trainbox, hung from outside.

The program (tests/fixtures/resumable/loop.py) saves a torch.save-like checkpoint every 10 steps and resumes when
given ``--resume PATH``; trainbox.faults hangs its main thread through the ``output`` site. The real programs
(``yolo train``, a Trainer, Lightning, nanoGPT) and a kill during a save are tested with them, on the same mechanism.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.paths import FIXTURES
from tests.supervise.output.test_uninstrumented import SHORT, supervise
from tests.supervise.resume.test_checkpoints import torch_file
from tests.supervised import train_cli
from trainbox.errors import ExitCode

LOOP = FIXTURES / "resumable" / "loop.py"


def test_a_loop_hung_from_outside_resumes_from_its_own_checkpoint_and_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    saved = run_dir / "ck"  # the checkpoints are found relative to the run directory
    yesterday = torch_file(saved / "step-300.pt", time.time() - 86400)  # another run's, in the same folder
    loop = [sys.executable, str(LOOP), "--steps", "60", "--every", "10", "--out", str(saved)]
    options = [*SHORT, "--resume-args", "--resume {checkpoint}", "--checkpoint", "ck/*.pt"]
    done = supervise(run_dir, loop, options, fault="sleep@output,attempt=0,lines>=37")  # hangs after step 36
    assert done.code == ExitCode.OK, done.stderr
    assert done.kinds() == ["start", "stall", "restart", "start", "exit"], done.kinds()
    first, restart, second = done.of("start")[0], done.of("restart")[0], done.of("start")[1]
    assert first["argv"] == loop and first["resumed"]["from"] is None, "a new run's first attempt runs as given"
    assert (restart["resumed"]["from"], restart["resumed"]["step"]) == (str(saved / "step-30.pt"), 30)
    assert second["argv"] == [*loop, "--resume", str(saved / "step-30.pt")]
    finished = json.loads((saved / "done.json").read_text())
    assert (finished["started_after"], finished["ran"]) == (30, 30), "the second attempt went on from step 30"
    state = json.loads((run_dir / "state.json").read_text())
    last = (run_dir / "logs" / "attempt-0.log").read_text().split()[-3]  # "37/60": the last step shown before the hang
    assert state["resumed"]["redone_steps"] == int(last.split("/")[0]) - 30, "steps 31 on, up to the last shown, again"
    assert state["redone_steps"] == state["resumed"]["redone_steps"] == done.of("exit")[0]["redone_steps"]
    status = train_cli(["status", "--run-dir", str(run_dir)], run_dir).stdout
    assert f"checkpoint {saved / 'step-60.pt'}, " in status and ", step 60" in status, status
    assert f"resumed   attempt 1 from {saved / 'step-30.pt'} (step 30): {state['redone_steps']} steps done again" in status

    gone_on = supervise(run_dir, loop, options)  # --run-dir of the run: it goes on from its own newest checkpoint
    assert gone_on.code == ExitCode.OK, gone_on.stderr
    assert gone_on.of("start")[-1]["argv"] == [*loop, "--resume", str(saved / "step-60.pt")], "not yesterday's step 300"
    assert yesterday.exists()
