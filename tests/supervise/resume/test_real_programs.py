"""Real programs nobody here wrote, run as they are, hung and killed from outside: each restart resumes from the
program's own checkpoint, and only from a whole one.

The programs and where their faults go are tests/real_programs.py: Ultralytics' ``yolo train``, pytorch/examples'
mnist, a Hugging Face ``Trainer`` script, a Lightning fit and nanoGPT's ``train.py``, each a few seconds an epoch,
offline. One run each, three attempts:

1. attempt 0 hangs after the program's first checkpoint (trainbox.faults' ``output`` site): the stall is found,
   the tree killed, and the restart resumes from that checkpoint, losing at most one checkpoint interval;
2. the resumed attempt 1 is SIGKILLed while it writes its next checkpoint (the ``checkpoint`` site: the file half
   on disk, or a save in a buffer not yet written): the restart resumes from the newest checkpoint the kill left
   whole, or, where the program rewrites its only checkpoint in place (Ultralytics' last.pt, nanoGPT's ckpt.pt),
   starts afresh, never from the broken file;
3. attempt 2 finishes, and ``status`` and the report show the run.

Beside ``yolo train``'s ``exp``, a sweep's ``exp_lr2`` and another run of the same name (``exp-2``) hold newer
checkpoints: the restart takes neither. A Trainer script with an argparse of its own refuses the
``--resume_from_checkpoint`` its restart is given; the words are withdrawn, and the run goes on as given. An
accelerate loop killed while ``save_state`` writes ``optimizer.bin`` resumes from the folder before that one.

What each attempt resumed from is read twice: from trainbox's ``restart`` event, and from what the program itself
printed (its attempt log). bench/resume.py kills each program during its saves 20 times and times the runs against
bare ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from tests.real_programs import (
    OFFLINE_HUB,
    OPTIONS,
    PROGRAMS,
    PROGRAMS_BY_NAME,
    Program,
    hf_argparse_command,
    injected,
    plant_others,
    supervise_args,
)
from tests.supervised import Finished, survivors, train_cli
from trainbox.errors import ExitCode
from trainbox.yolo import offline


@pytest.fixture(scope="module", autouse=True)
def offline_ultralytics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``yolo train`` reaches no network: Ultralytics' offline environment (fonts, settings) for this module."""
    return offline.prepare_environment(tmp_path_factory.mktemp("ultralytics-config"))


def supervise(program: Program, work: Path, env: Dict[str, str]) -> Finished:
    """``trainbox supervise`` of ``program`` in the folder ``work``, faults from ``env``; no process outlives it."""
    run_dir = work / "run"
    result = train_cli(supervise_args(program, work), run_dir, injected({**program.env, **env}), timeout=900, cwd=work)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


def attempt_log(result: Finished, attempt: int) -> str:
    return (result.run_dir / "logs" / f"attempt-{attempt}.log").read_text(errors="replace")


@pytest.mark.training
@pytest.mark.parametrize("name", sorted(PROGRAMS_BY_NAME))
def test_a_real_program_hung_then_killed_saving_resumes_each_time_from_its_own_whole_checkpoint(
    name: str, tmp_path: Path
) -> None:
    program = PROGRAMS_BY_NAME[name]
    others = plant_others(program, tmp_path)
    result = supervise(program, tmp_path, program.hang_then_kill())
    assert result.code == ExitCode.OK, result.stderr[-3000:]
    assert result.kinds() == ["start", "stall", "restart", "start", "crash", "restart", "start", "exit"], result.kinds()

    stall = result.of("stall")[0]
    assert stall["silent_s"] <= stall["budget_s"], f"found within its budget: {stall}"
    hung, killed = result.of("restart")
    resumed_at = program.resumed(attempt_log(result, 1))
    assert resumed_at is not None, f"{name} started over after the hang: {hung.get('resumed')}"
    assert 0 <= program.hung_by - resumed_at <= program.interval, f"lost {program.hung_by - resumed_at} {program.unit}s"
    chosen = Path(hung["resumed"]["from"])
    assert tmp_path in chosen.parents and chosen.exists(), f"the program's own checkpoint: {hung['resumed']}"
    assert chosen not in others, f"another run's checkpoint: {chosen}"

    after_kill = program.resumed(attempt_log(result, 2))
    assert after_kill == program.after_kill, f"after the kill during a save: {after_kill} ({killed.get('resumed')})"
    assert (killed["resumed"]["from"] is None) == (program.after_kill is None), killed["resumed"]
    shown(result, killed["resumed"]["from"], curves=name == "yolo")


def shown(result: Finished, resumed_from: Optional[str], curves: bool = False) -> None:
    """``status`` and the report show the finished run: its restarts and what the last one resumed from; with
    ``curves`` (``yolo train``: Ultralytics' results.csv in its own save dir) the report draws loss and mAP."""
    env = {key: value for key, value in os.environ.items() if key != "TRAIN_FAULT"}
    trainbox = [sys.executable, "-m", "trainbox"]
    status = subprocess.run([*trainbox, "status", "--run-dir", str(result.run_dir)], capture_output=True, text=True, env=env)
    assert status.returncode == 0, status.stderr
    resumed = f"attempt 2 from {resumed_from}" if resumed_from else "attempt 2 from the start"
    for line in ("succeeded (attempt 2)", "restarts  2, stalls 1, crashes 1", resumed):
        assert line in status.stdout, status.stdout
    report = subprocess.run([*trainbox, "report", str(result.run_dir)], capture_output=True, text=True, env=env)
    assert report.returncode == 0, report.stderr
    page = (result.run_dir / "report.html").read_text()
    assert resumed in page, "the report says what the run resumed from"
    if curves:
        assert "alt='loss and mAP'" in page and "No results." not in page, "the report draws the run's results.csv"


@pytest.mark.training
def test_a_trainer_script_that_refuses_the_resume_goes_on_as_given(tmp_path: Path) -> None:
    command = hf_argparse_command(tmp_path)
    run_dir = tmp_path / "run"
    hang = {"TRAIN_FAULT": "sleep@output,attempt=0,seen>=15", "TRAIN_FAULT_TEXT": "{'loss'"}  # after checkpoint-10
    args = ["supervise", "--run-dir", str(run_dir), *OPTIONS, "--quiet", "--", *command]
    result = train_cli(args, run_dir, injected({**OFFLINE_HUB, **hang}), timeout=900, cwd=tmp_path)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    assert result.code == ExitCode.OK, result.stderr[-3000:]
    assert result.kinds() == ["start", "stall", "restart", "start", "crash", "restart", "start", "exit"], result.kinds()
    given, withdrawn = result.of("restart")
    assert given["resumed"]["from"] == str(tmp_path / "out" / "checkpoint-10"), given["resumed"]
    assert "unrecognized arguments: --resume_from_checkpoint" in attempt_log(result, 1)
    assert withdrawn["resumed"]["from"] is None and withdrawn["resumed"]["refused"] == "--resume_from_checkpoint"
    assert result.of("start")[2]["argv"] == command, "the command as given"
    line = "the program refused --resume_from_checkpoint (its usage error): the command runs as given from now on"
    assert line in result.stderr, result.stderr[-3000:]
    assert (tmp_path / "out" / "checkpoint-20" / "trainer_state.json").exists(), "it trained to the end"


@pytest.mark.training
def test_a_folder_a_kill_left_half_written_is_passed_over_for_the_whole_one_before_it(tmp_path: Path) -> None:
    saved = tmp_path / "out"
    command = [sys.executable, str(PROGRAMS / "accelerate_loop.py"), "--steps", "20", "--every", "10", "--out", str(saved)]
    resume = ["--resume-args", "--resume {checkpoint}", "--checkpoint", "out/step_*"]
    run_dir = tmp_path / "run"
    killed = {"TRAIN_FAULT": "sigkill@checkpoint,attempt=0,saves>=1", "TRAIN_FAULT_CHECKPOINT": "optimizer.bin"}
    args = ["supervise", "--run-dir", str(run_dir), *OPTIONS, *resume, "--quiet", "--", *command]
    result = train_cli(args, run_dir, injected(killed), timeout=900, cwd=tmp_path)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    assert result.code == ExitCode.OK, result.stderr[-3000:]
    assert result.kinds() == ["start", "crash", "restart", "start", "exit"], result.kinds()
    resumed = result.of("restart")[0]["resumed"]
    assert resumed["from"] == str(saved / "step_10"), resumed
    assert resumed["passed_over"][0]["path"] == str(saved / "step_20")
    assert resumed["passed_over"][0]["why"].startswith("optimizer.bin: "), resumed["passed_over"]
    assert f"Resumed from {saved / 'step_10'} (step 10)" in attempt_log(result, 1)
