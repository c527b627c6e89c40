"""``trainbox supervise -- CMD`` on programs that never heard of trainbox: progress read from what they print.

Real processes, short budgets. The programs are tests/fixtures/output/programs/ (a plain tqdm loop, pytorch/examples'
mnist lines, a Lightning ``Trainer.fit``): no ``beat()``, nothing of trainbox. The one fault injector,
trainbox.faults, reaches them through its ``output`` site (tests/fixtures/uninstrumented/sitecustomize.py): the main
thread hangs just before it writes its Nth line end, while its other threads go on. Ultralytics' own ``yolo train``
is tests/yolo/test_uninstrumented.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from tests.supervised import Finished, survivors, train_cli
from trainbox import faults
from trainbox.errors import ExitCode
from trainbox.supervise.output.counters import PERCENT_NOTICE
from trainbox.supervise.output.progress import HOW_TO_GIVE_PROGRESS
from trainbox.supervise.settings import STALL_TIMEOUT

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROGRAMS = FIXTURES / "output" / "programs"
#: Budgets every program here outlasts: it runs for longer than each of them (sleeping, mostly: an idle tree), so
#: only its progress keeps it alive.
SHORT = ["--startup-timeout", "5", "--stall-timeout", "2", "--idle-timeout", "3", "--grace", "1", "--backoff", "0.1"]


def program(name: str, *args: str, python: Optional[List[str]] = None) -> List[str]:
    return [*(python or [sys.executable]), str(PROGRAMS / name), *args]


def supervise(run_dir: Path, command: List[str], options: List[str] = SHORT, fault: str = "", text: str = "") -> Finished:
    """``trainbox supervise`` of ``command`` as it is; ``fault`` reaches it through the ``output`` site (``text``: what
    its ``seen`` counts)."""
    paths = [str(FIXTURES / "uninstrumented"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(path for path in paths if path), "TRAIN_FAULT": fault, faults.TEXT_ENV: text}
    result = train_cli(["supervise", "--run-dir", str(run_dir), *options, "--quiet", "--", *command], run_dir, env)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


def progress_samples(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]


def test_a_plain_tqdm_loop_longer_than_every_budget_runs_to_the_end_untouched(tmp_path: Path) -> None:
    result = supervise(tmp_path, program("tqdm_loop.py", "--epochs", "2", "--steps", "30", "--delay", "0.1"))
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"] and result.of("exit")[0]["beats"] > 30
    samples = progress_samples(tmp_path)
    assert {(s.get("phase"), s.get("epoch")) for s in samples} >= {("train", 0), ("train", 1), ("val", None)}
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["progress_source"] == "output" and state["heartbeat"]["pattern"] == "tqdm"
    assert "done" in (tmp_path / "logs" / "attempt-0.log").read_text(), "the log keeps the output"


def test_the_same_loop_hung_at_step_20_is_found_restarted_and_finishes(tmp_path: Path) -> None:
    # each tqdm draw starts with \r: once step 20 is drawn 21 line ends are written, and the next draw hangs
    loop = program("tqdm_loop.py", "--epochs", "1", "--steps", "40", "--delay", "0.1")
    result = supervise(tmp_path, loop, fault="sleep@output,attempt=0,lines>=21")
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert (stall["budget"], stall["budget_s"], stall["at"]) == ("stall", 2, "phase train, epoch 0 batch 20")
    assert stall["last_beat"]["pattern"] == "tqdm"
    tail = (result.incident() / "output-tail.txt").read_text().splitlines()
    assert "20/40" in tail[-1], f"the bar's last state, not '(no output)': {tail[-1:]}"
    redone = result.of("redone")[0]
    assert (redone["redone"], redone["unit"], redone["from"]) == (20, "batch", None), "from nothing: all 20 again"


def test_pytorch_examples_lines_block_buffered_off_a_terminal_are_not_killed_while_they_count(tmp_path: Path) -> None:
    isolated = [sys.executable, "-I"]  # -I: PYTHONUNBUFFERED is ignored, so print() is block-buffered on a pipe
    mnist = program("examples_loop.py", "--epochs", "2", "--batches", "20", "--delay", "0.15", python=isolated)
    on_a_pipe = subprocess.Popen(mnist, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        on_a_pipe.wait(timeout=3)
    except subprocess.TimeoutExpired:
        on_a_pipe.kill()
    assert on_a_pipe.stdout is not None and on_a_pipe.stdout.read() == b"", "nothing in 3 s: held in the buffer"
    result = supervise(tmp_path, mnist)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"], "on the supervisor's terminal each line comes as it is printed"
    assert {s.get("epoch") for s in progress_samples(tmp_path)} == {1, 2}


def test_the_same_lines_stopping_while_a_thread_chatters_are_a_stall(tmp_path: Path) -> None:
    # print() writes the text, then "\n": after the 8th line (Train Epoch: 1 [448/1280]) the main thread hangs
    mnist = program("examples_loop.py", "--epochs", "1", "--batches", "20", "--delay", "0.15", "--chatter", "0.2")
    result = supervise(tmp_path, mnist, fault="sleep@output,attempt=0,lines>=8")
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["at"] == "phase train, epoch 1 batch 448" and stall["last_beat"]["pattern"] == "pytorch-examples"
    tail = (result.incident() / "output-tail.txt").read_text().splitlines()
    assert tail[-3:] == ["GPU memory 5.1 GB"] * 3, "the thread kept printing, and that was not progress"
    redone = result.of("redone")[0]
    assert (redone["redone"], redone["unit"]) == (8, "batch"), "8 lines of 64 samples, each after its batch: 8 batches"


def test_a_loop_hung_at_step_30_while_a_thread_prints_its_timing_is_found_by_its_budget(tmp_path: Path) -> None:
    # "[timing] ms/step: 530, avg step: 0.53s" every 0.5 s, numbers moving: neither is a step, so the silence goes on
    loop = program("timing_loop.py", "--steps", "40", "--delay", "0.05", "--every", "0.5")
    options = ["--startup-timeout", "10", "--stall-timeout", "5", "--grace", "1", "--backoff", "0.1"]
    result = supervise(tmp_path, loop, options=options, fault="sleep@output,attempt=0,lines>=31")
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert (stall["budget"], stall["at"], stall["last_beat"]["pattern"]) == ("stall", "step 30", "words"), stall
    tail = (result.incident() / "output-tail.txt").read_text()
    assert tail.count("[timing] ms/step") >= 5, "the thread went on printing through the silence"
    redone = result.of("redone")[0]
    assert (redone["redone"], redone["unit"]) == (31, "step"), "steps 0 to 30, each printed after it was done"


def test_a_hang_after_a_checkpoint_save_is_placed_at_the_training_step_not_at_the_save_bars(tmp_path: Path) -> None:
    # a Trainer-style bar with no label; at step 50 a save draws "Writing model shards: 1/1" inside it, then it hangs
    loop = program("nested_bars.py", "--steps", "80", "--every", "50", "--inner-desc", "Writing model shards")
    result = supervise(tmp_path, loop, fault="sleep@output,attempt=0,seen>=1", text="| 1/1 [")
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["at"] == "phase save, step 50", "the training step, with the save as its phase; not 'step 1'"
    assert (stall["last_beat"]["side_step"], stall["last_beat"]["side_total"]) == (1, 1)
    redone = result.of("redone")[0]
    assert (redone["redone"], redone["unit"]) == (50, "step"), "counted on the training bar, not the save's"


#: Lines of the loggers below, one a second. Under the defaults a counter that stepped steadily a few times has a learned
#: budget of --learned-floor (60 s) between its steps: each logger goes on for longer than that after its first epoch
#: or its first jump, so a reader that took the rest of its lines for no progress would stall it.
LOGGED_LINES = 75


@pytest.mark.slow
def test_loggers_counting_within_each_epoch_or_jumping_ahead_are_never_stalled_under_the_defaults(tmp_path: Path) -> None:
    forms = {
        "epochs": program("step_logger.py", "--form", "epochs", "--lines", str(LOGGED_LINES)),  # step 10/100 .. 100/100
        # its first 8 steps, then every 1000th (8, not 5: enough steady steps to learn the 60 s budget from)
        "jumps": program("step_logger.py", "--form", "jumps", "--lines", str(LOGGED_LINES), "--first", "8"),
    }
    with concurrent.futures.ThreadPoolExecutor(len(forms)) as pool:  # at once: each only sleeps and prints
        runs = dict(zip(forms, pool.map(lambda form: supervise(tmp_path / form, forms[form], options=[]), forms)))
    for form, result in runs.items():
        assert result.code == ExitCode.OK, (form, result.stderr)
        assert result.kinds() == ["start", "exit"], (form, result.of("stall"))
        # a beat per look at a new line (a loaded machine may take two lines in one look): far past the first epoch
        assert result.of("exit")[0]["beats"] > LOGGED_LINES // 2, f"{form}: its lines after the first epoch or jump count"


def test_a_bar_showing_only_a_percentage_is_judged_by_the_time_a_percent_takes(tmp_path: Path) -> None:
    # rich.progress.track, one percent every 2.5 s, under the defaults: each silence is judged by the stall budget
    # until a percent has passed, then by the budget its percents declare (3x the longest, never under the stall
    # budget), never by the learned floor or for a day. A --stall-timeout the user gives bounds that budget
    # (tests/supervise/stalls/test_budgets.py), so this test gives none.
    bar = program("percent_bar.py", "--delay", "2.5", "--percents", "3")
    result = supervise(tmp_path, bar, options=[])
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"]
    assert result.stderr.count(PERCENT_NOTICE) == 1, "said once, at start"
    judged = [silence for sample in progress_samples(tmp_path) for silence in sample["silences"].values()]
    stall_s = STALL_TIMEOUT.number
    assert {(s["budget"], s["budget_s"]) for s in judged[1:]} <= {("stall", stall_s), ("phase:", stall_s)}, judged


def test_a_command_with_no_counter_is_told_how_to_give_progress_and_not_called_misconfigured(tmp_path: Path) -> None:
    chatty = [sys.executable, "-c", "import time\nwhile True:\n    print('still working', flush=True)\n    time.sleep(0.2)"]
    result = supervise(tmp_path, chatty, options=["--startup-timeout", "3", *SHORT[2:]])
    assert result.code == ExitCode.GAVE_UP
    assert result.of("give_up")[0]["reason"] == "no progress to read"
    assert "no beat and no progress counter in its output" in result.stderr, "said at start-up"
    assert result.stderr.count(HOW_TO_GIVE_PROGRESS) == 2, "at start-up and in the give-up message"
    assert "configuration error" not in result.stderr and "still working" in result.stderr


def test_a_progress_pattern_of_your_own(tmp_path: Path) -> None:
    counting = [
        sys.executable,
        "-c",
        "import time\nfor i in range(25):\n    print(f'{i} images done', flush=True)\n    time.sleep(0.2)",
    ]
    result = supervise(tmp_path, counting, options=[*SHORT, "--progress-pattern", r"^(?P<step>\d+) images done"])
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"]
    assert json.loads((tmp_path / "state.json").read_text())["heartbeat"]["pattern"] == "user"


def test_a_ladder_steps_the_command_from_fast_to_careful_after_a_stall(tmp_path: Path) -> None:
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(
        "rungs:\n  - name: fast\n    args: [--delay, 0.05]\n"
        "  - name: careful\n    args: [--delay, 0.1, --ascii]\n    env: {OMP_NUM_THREADS: 1}\n"
    )
    loop = program("tqdm_loop.py", "--epochs", "1", "--steps", "30")
    result = supervise(
        tmp_path / "run", loop, options=[*SHORT, "--ladder", str(ladder)], fault="sleep@output,attempt=0,lines>=11"
    )
    assert result.code == ExitCode.OK, result.stderr
    starts = result.of("start")
    assert [(s["profile"], s["argv"][-3:]) for s in starts] == [
        ("fast", ["30", "--delay", "0.05"]),
        ("careful", ["--delay", "0.1", "--ascii"]),
    ]
    restart = result.of("restart")[0]
    assert (restart["previous_profile"], restart["profile"]) == ("fast", "careful")
    assert result.of("stall")[0]["at"] == "phase train, epoch 0 batch 10, profile fast"


#: The Lightning fit's stall budget, and its epochs (20 steps of 0.1 s and a validation each, about 2.5 s): its bar
#: moves for about 30 s, longer than the budget. The budget is not shorter: after its last bar the program only exits,
#: and on 2 cores shared with three trainings its interpreter took more than 8 s to do so (at 25 % CPU, no Python stack).
LIGHTNING_STALL_S, LIGHTNING_EPOCHS = 20, 12


@pytest.mark.training
def test_a_lightning_fit_is_not_killed_while_its_bar_moves(tmp_path: Path) -> None:
    pytest.importorskip("lightning")  # .ci/run installs it (docs/development.md: Tests); in CI a skip fails
    fit = program("lightning_fit.py", "--tqdm", "--epochs", str(LIGHTNING_EPOCHS), "--delay", "0.1")
    # Lightning takes 15-30 s to import on 2 busy cores: the startup budget covers that, the bar must do the rest.
    options = ["--startup-timeout", "120", "--stall-timeout", str(LIGHTNING_STALL_S), *SHORT[6:]]
    result = supervise(tmp_path, fit, options=options)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"]
    samples = progress_samples(tmp_path)
    assert samples[-1]["ts"] - samples[0]["ts"] > LIGHTNING_STALL_S, (
        f"the bar moved for less than the {LIGHTNING_STALL_S} s budget: it proves nothing"
    )
    phases = {(s.get("phase"), s.get("epoch")) for s in samples}
    # Sampled every few seconds and at phase changes: on a loaded machine a short epoch's train phase can fall between
    # two samples (once in CI, epoch 2's), so the test asks for the first epoch, a later one, and validation.
    trained = {epoch for phase, epoch in phases if phase == "train"}
    assert 0 in trained and max(trained) >= 1 and ("val", None) in phases, phases
