"""A crash named by its exception line and its place (trainbox.supervise.crashes), and a real one that repeats."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.supervised import train_cli
from trainbox.errors import ExitCode
from trainbox.supervise import crashes
from trainbox.supervise.policy import Outcome, OutcomeKind

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "    model(x)",
    "RuntimeError: operator torchvision::nms does not exist",
]


def test_the_exception_line_is_the_last_line_that_ends_a_traceback() -> None:
    assert crashes.exception_line(TRACEBACK) == "RuntimeError: operator torchvision::nms does not exist"
    assert crashes.exception_line([*TRACEBACK, "wandb: syncing run", ""]) == TRACEBACK[-1], "later chatter is passed over"
    assert (
        crashes.exception_line(["torch.OutOfMemoryError: CUDA out of memory."]) == "torch.OutOfMemoryError: CUDA out of memory."
    )
    assert crashes.exception_line(["KeyboardInterrupt"]) == "KeyboardInterrupt"
    assert crashes.exception_line(["  KeyError: 'lr'  "]) == "KeyError: 'lr'"
    assert crashes.exception_line(["epoch 3 loss 0.2", "Segmentation fault (core dumped)", ""]) is None
    assert crashes.exception_line(["Error rate: 0.5", "MyErrorCount 3"]) is None, "a word with Error in it is not one"
    assert len(crashes.exception_line(["ValueError: " + "x" * 10_000]) or "") == crashes.MAX_LINE


def test_the_place_is_the_last_position_or_before_any_progress() -> None:
    started = Outcome(OutcomeKind.EXITED, code=1, beats=1, last_beat={"phase": "setup"})
    assert crashes.place(started, None) == "before any progress"
    assert crashes.place(started, "safe") == "before any progress, profile safe"
    stepped = Outcome(OutcomeKind.EXITED, code=1, beats=3, first_step_ts=1.0, last_beat={"phase": "val", "epoch": 0, "batch": 2})
    assert crashes.place(stepped, "safe") == "at phase val, epoch 0 batch 2, profile safe"


CRASHING = """\
import sys, time
for step in range(1, 4):
    print(f"step {step}/10", flush=True)
    time.sleep(0.05)
raise RuntimeError(sys.argv[1] if len(sys.argv) > 1 else "operator torchvision::nms does not exist")
"""


def test_a_crash_that_repeats_word_for_word_ends_the_run_on_the_second_quoting_it(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    run_dir = tmp_path / "run"
    done = train_cli(
        ["supervise", "--run-dir", str(run_dir), "--backoff", "0.1", "--quiet", "--", sys.executable, str(script)], run_dir
    )
    assert done.code == ExitCode.GAVE_UP, done.stderr
    assert done.kinds().count("start") == 2, done.kinds()
    last = done.stderr.strip().splitlines()[-1]
    log = run_dir / "logs" / "attempt-1.log"
    assert last.endswith(f"Both ended with: RuntimeError: operator torchvision::nms does not exist (in {log})"), last
    assert "the same crash twice in a row, at step 3" in last and log.is_file()
    assert "incidents" not in last, "a run without a stall has no incident reports to point to"
    assert done.of("give_up")[0]["reason"] == "the same crash twice in a row, at step 3"
