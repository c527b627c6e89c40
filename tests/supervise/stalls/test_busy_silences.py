"""A learned budget is a suspicion, against real processes: a busy evaluation or save between two steps goes on, a
hang there is still found (the deciders are tests/supervise/stalls/test_budgets.py, test_silence.py, test_busy.py).

nanoGPT's own ``train.py`` (unmodified) evaluates and saves between two ``iter N`` lines; here that evaluation
outlasts the default 60 s learned floor and the run finishes. The tqdm loop of
tests/fixtures/output/programs/silent_eval.py works silently inside its bar (``--every``), computing or writing a
file, as a Trainer saves every ``save_steps``; it learns a budget of a few seconds (``LEARN_FAST``), so the guards
cost seconds: an idle hang and a stopped process in the middle of the bar are stalls at once, at the learned
budget, and the busy spin that never ends is the stall budget's (tests/supervise/stalls/test_stalls.py).
"""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
from pathlib import Path
from typing import List

import pytest

from tests.real_programs import injected, nanogpt_command
from tests.supervise.stalls.test_stalls import LEARN_FAST, supervise_program
from tests.supervised import survivors, train_cli
from trainbox.errors import ExitCode

#: How long nanoGPT's evaluation is made to take, from a measurement just before on the machine that runs the test:
#: twice the 60 s learned floor (on a shared machine the time of a batch varies from one minute to the next).
EVALUATION_S = 120.0
#: One thread: torch's two threads on two cores that other work also wants wait on each other, and an evaluation
#: measured at 150 s ran past 540 s; one thread's pace follows its share of the machine.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
#: The stall budget of the nanoGPT run, the one budget that is not the default: room for that variation upwards.
STALL_S = 900
#: The evaluation batches of the measuring run (each split): enough to time one batch.
MEASURE_ITERS = 100
#: Iterations between the resumed start and the long evaluation, each made to take ``ITERATION_S`` (gradient
#: accumulation, from the same measurement): the supervisor reads printed progress when it looks (every 0.5 s), so
#: iterations faster than that reach it several to a look, and a fast machine would show it too few to learn from.
ITERATIONS = 30
ITERATION_S = 0.8


def _with(command: List[str], **options: object) -> List[str]:
    """nanoGPT's command with its ``--key=value`` options replaced or added."""
    kept = [word for word in command if not any(word.startswith(f"--{key}=") for key in options)]
    return [*kept, *(f"--{key}={value}" for key, value in options.items())]


def _iteration_ms(log: str, number: int) -> float:
    found = re.search(rf"^iter {number}: .*time ([\d.]+)ms", log, re.M)
    assert found, f"nanoGPT printed no iteration {number}:\n{log[-2000:]}"
    return float(found.group(1))


@pytest.mark.training
def test_a_real_nanogpt_evaluating_past_the_default_learned_floor_finishes(tmp_path: Path) -> None:
    """nanoGPT resumes at iteration 5 and beats ``ITERATIONS`` times (a learned budget of 60 s, the floor), then
    evaluates for minutes and saves, silently and busy, between two ``iter N`` lines: no stall; the console says
    that the learned budget ran out on a busy tree and that it is judged at the stall budget."""
    command = nanogpt_command(tmp_path)
    # A first checkpoint at iteration 5 (so that the supervised run starts past an evaluation), and the time of an
    # evaluation batch here: nanoGPT's iteration 5 holds 2 x MEASURE_ITERS of them.
    first = _with(command, max_iters=5, eval_interval=5, eval_iters=MEASURE_ITERS)
    measured = subprocess.run(first, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **ONE_THREAD})
    assert measured.returncode == 0, measured.stderr[-2000:]
    per_batch_s = _iteration_ms(measured.stdout, 5) / 1000 / (2 * MEASURE_ITERS)
    eval_iters = max(MEASURE_ITERS, math.ceil(EVALUATION_S / (2 * per_batch_s)))
    per_step_s = statistics.median(_iteration_ms(measured.stdout, n) for n in range(1, 5)) / 1000
    accumulated = max(1, math.ceil(ITERATION_S / per_step_s))
    last = 5 + ITERATIONS
    resumed = _with(command, init_from="resume", max_iters=last, lr_decay_iters=last, eval_interval=last, eval_iters=eval_iters)
    resumed = _with(resumed, gradient_accumulation_steps=accumulated)

    run_dir = tmp_path / "run"
    options = ["--run-dir", str(run_dir), "--stall-timeout", str(STALL_S)]
    result = train_cli(["supervise", *options, "--", *resumed], run_dir, injected(ONE_THREAD), timeout=1200, cwd=tmp_path)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    log = (run_dir / "logs" / "attempt-0.log").read_text(errors="replace")
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"], [(s["rule"], s["budget"], s["silent_s"]) for s in result.of("stall")]
    assert _iteration_ms(log, last) > 60_000, "the evaluation did not outlast the learned floor: nothing was tested"
    progress = (run_dir / "progress.jsonl").read_text()
    assert re.search(r"past its learned:\S* budget 60 s but busy \(", result.stderr), result.stderr + progress[-3000:]
    assert f"judged at {STALL_S} s (the stall budget)" in result.stderr


def test_a_busy_save_inside_the_bar_finishes(tmp_path: Path) -> None:
    """A Trainer-style save: 6 s of writing a file inside the bar, after every 20th step, twice an epoch."""
    args = ["--epochs", "1", "--steps", "60", "--delay", "0.25", "--every", "20", "--eval-s", "6", "--work", "save"]
    result = supervise_program(tmp_path, args, LEARN_FAST)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"], [(s["rule"], s["budget"], s["silent_s"]) for s in result.of("stall")]
    assert "but busy (save?: " in result.stderr, result.stderr


def test_a_busy_evaluation_inside_the_bar_finishes_and_its_repeat_is_judged_by_the_earlier_ones(tmp_path: Path) -> None:
    """Evaluations of 4 s inside the bar: the first is allowed up to the stall budget, and from the third on a busy
    silence there is judged at 3 x the longest earlier one."""
    args = ["--epochs", "1", "--steps", "80", "--delay", "0.25", "--every", "20", "--eval-s", "4"]
    result = supervise_program(tmp_path, args, LEARN_FAST)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"], [(s["rule"], s["budget"], s["silent_s"]) for s in result.of("stall")]
    allowed = re.findall(r"but busy \(evaluation\?.*\): judged at \d+ s \((.*)\)", result.stderr)
    assert allowed[0] == "the stall budget" and allowed[-1] == "its earlier silences there", result.stderr


def test_an_idle_hang_in_the_middle_of_the_bar_is_a_stall_at_its_learned_budget(tmp_path: Path) -> None:
    args = ["--epochs", "1", "--steps", "40", "--delay", "0.25", "--eval-s", "0"]
    result = supervise_program(tmp_path, args, LEARN_FAST, fault="sleep@output,attempt=0,lines>=25")
    assert result.code == ExitCode.OK, result.stderr
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["budget"], stall["cause"]) == ("budget", "learned:", "idle"), stall
    assert stall["budget_s"] < 25 and stall["busy"] == {**stall["busy"], "busy": False, "signs": []}, stall
    assert stall["last_beat"]["step"] == 24


def test_a_stopped_process_in_the_middle_of_the_bar_is_a_stall_at_its_learned_budget(tmp_path: Path) -> None:
    args = ["--epochs", "1", "--steps", "40", "--delay", "0.25", "--eval-s", "0"]
    result = supervise_program(tmp_path, args, LEARN_FAST, fault="stopped@output,attempt=0,lines>=25")
    assert result.code == ExitCode.OK, result.stderr
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["budget"], stall["cause"]) == ("budget", "learned:", "stopped"), stall
    assert stall["budget_s"] < 25 and not stall["busy"]["busy"], stall
