"""What a restart adds to each attempt's command, in milliseconds (real files, no child)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest

from tests.supervise.resume.test_checkpoints import torch_file, trainer_checkpoint
from trainbox import cli
from trainbox.errors import ExitCode
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome, OutcomeKind
from trainbox.supervise.resume.resumer import Resumer, resumed_words
from trainbox.supervise.settings import SupervisorSettings

RUN_BEGAN = 1500.0


@pytest.fixture(autouse=True)
def _trainer_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``t.py`` here builds a Trainer's arguments (what the recipe reads a script for)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("from transformers import Trainer, TrainingArguments\n")


def resumer(tmp_path: Path, resume_args: str = "", checkpoint: str = "", new: bool = False) -> Resumer:
    settings = SupervisorSettings(resume_args=resume_args, checkpoint=checkpoint)
    return Resumer(settings, tmp_path / "run", RUN_BEGAN, cwd=tmp_path, sleep=lambda seconds: None, new=new)


def ended(code: int, *output: str, beats: int = 0, last_beat: Optional[dict] = None) -> Outcome:
    """An attempt that exited with ``code`` after ``output`` (its last lines)."""
    return Outcome(OutcomeKind.EXITED, code=code, beats=beats, last_beat=last_beat, detail={"last_output": list(output)})


def command(*argv: str, resume: Optional[List[str]] = None) -> Launch:
    return Launch(argv=list(argv), startup_timeout=60, stall_timeout=30, resume=tuple(resume) if resume is not None else None)


def test_a_first_attempt_without_a_checkpoint_of_this_run_runs_as_it_is(tmp_path: Path) -> None:
    torch_file(tmp_path / "runs" / "detect" / "train" / "weights" / "last.pt", 1000.0)  # another run's
    yolo = command("yolo", "train", "model=yolov8n.yaml")
    first = resumer(tmp_path).launch(yolo, restart=False)
    assert list(first.argv) == list(yolo.argv), "no resume=True on a first run: Ultralytics would search everywhere"
    assert first.resumed is not None and first.resumed["from"] is None
    assert first.resumed["why"] == "no complete checkpoint of this run yet"


def test_a_restart_resumes_from_the_newest_complete_checkpoint_of_this_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "none"))
    last = torch_file(tmp_path / "runs" / "detect" / "train2" / "weights" / "last.pt", 2000.0)
    restarted = resumer(tmp_path).launch(
        command("yolo", "train", "model=yolov8n.yaml"), restart=True, after=ended(1, last_beat={"step": 9})
    )
    assert list(restarted.argv) == ["yolo", "train", "resume=True", f"model={last}"]
    assert restarted.resumed is not None and restarted.resumed["how"] == "the built-in way for yolo"
    assert (restarted.resumed["from"], restarted.resumed["reached"]) == (str(last), {"step": 9})


def test_a_trainer_restart_skips_the_checkpoint_cut_off_by_the_kill(tmp_path: Path) -> None:
    trainer_checkpoint(tmp_path / "out", 50, 2000.0)
    trainer_checkpoint(tmp_path / "out", 100, 3000.0, state=None)
    restarted = resumer(tmp_path).launch(command("python", "t.py", "--output_dir", "out"), restart=True)
    assert list(restarted.argv)[-2:] == ["--resume_from_checkpoint", str(tmp_path / "out" / "checkpoint-50")]
    assert restarted.resumed is not None and restarted.resumed["step"] == 50
    assert restarted.resumed["passed_over"] == [
        {"path": str(tmp_path / "out" / "checkpoint-100"), "why": "no trainer_state.json (the save did not finish)"}
    ]
    assert resumed_words(restarted.resumed) == f", resuming from {tmp_path / 'out' / 'checkpoint-50'} (step 50)"


def test_resume_args_name_the_newest_checkpoint_of_this_run_found_by_the_user_s_glob(tmp_path: Path) -> None:
    torch_file(tmp_path / "ck" / "step-300.pt", 1000.0)  # yesterday's run, in the same folder
    new = resumer(tmp_path, "--resume {checkpoint} --fresh-optimizer", "ck/*.pt", new=True)
    first = new.launch(command("python", "loop.py"), restart=False)
    assert list(first.argv) == ["python", "loop.py"], "a new run's first attempt runs exactly as given"
    assert first.resumed is not None and first.resumed["why"] == "a new run's first attempt runs as given"
    restarted = new.launch(command("python", "loop.py"), restart=True)
    assert list(restarted.argv) == ["python", "loop.py"] and restarted.resumed is not None
    assert restarted.resumed["why"] == "no complete checkpoint of this run yet", "yesterday's step 300 is not its work"
    mine = torch_file(tmp_path / "ck" / "step-20.pt", 2000.0)
    gone_on = resumer(tmp_path, "--resume {checkpoint} --fresh-optimizer", "ck/*.pt")  # --resume: it first started at 1500
    again = gone_on.launch(command("python", "loop.py"), restart=False)
    assert list(again.argv) == ["python", "loop.py", "--resume", str(mine), "--fresh-optimizer"]
    in_run_dir = resumer(tmp_path, "--from={checkpoint}", "saved/*.pt")
    kept = torch_file(tmp_path / "run" / "saved" / "a.pt", 3000.0)  # found in the run directory too
    assert list(in_run_dir.launch(command("x"), restart=True).argv) == ["x", f"--from={kept}"]


def test_a_rung_s_resume_words_come_before_the_run_s_and_none_turns_recipes_off(tmp_path: Path) -> None:
    torch_file(tmp_path / "ck" / "a.pt", 2000.0)
    mine = resumer(tmp_path, "--resume {checkpoint}", "ck/*.pt")
    rung = mine.launch(command("x", resume=["--load", "{checkpoint}"]), restart=True)
    assert list(rung.argv) == ["x", "--load", str(tmp_path / "ck" / "a.pt")] and rung.resumed["how"] == "the rung's resume"  # type: ignore[index]
    trainer_checkpoint(tmp_path / "out", 5, 2000.0)
    off = resumer(tmp_path, "none").launch(command("python", "t.py", "--output_dir", "out"), restart=True)
    assert list(off.argv) == ["python", "t.py", "--output_dir", "out"] and off.resumed is None


def test_words_without_a_checkpoint_are_added_at_every_restart_only(tmp_path: Path) -> None:
    mine = resumer(tmp_path, "--resume")
    assert list(mine.launch(command("x"), restart=False).argv) == ["x"]
    assert list(mine.launch(command("x"), restart=True).argv) == ["x", "--resume"]
    assert mine.problem(command("x")) is None


def test_a_checkpoint_with_nowhere_to_look_is_refused_before_the_start(tmp_path: Path) -> None:
    mine = resumer(tmp_path, "--resume {checkpoint}")
    assert mine.problem(command("./train")) == (
        "the resume arguments name {checkpoint}, but trainbox does not know where train writes its checkpoints: "
        "say it with --checkpoint GLOB"
    )
    assert mine.problem(command("python", "t.py", "--output_dir", "o")) is None, "the recipe knows where"


def test_the_cli_refuses_a_checkpoint_it_cannot_find_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    given = ["supervise", "--run-dir", str(run_dir), "--resume-args", "--resume {checkpoint}", "--", "./train", "--lr", "1"]
    assert cli.main(given) == ExitCode.USAGE
    assert capsys.readouterr().err == (
        "trainbox: error: the resume arguments name {checkpoint}, but trainbox does not know where train writes its "
        "checkpoints: say it with --checkpoint GLOB\n"
    )
    assert not run_dir.exists(), "nothing was started or written"
    assert cli.main(["supervise", "--run-dir", str(run_dir), "--resume-args", "'unclosed", "--", "x"]) == ExitCode.USAGE
    assert "--resume-args" in capsys.readouterr().err


def test_a_yolo_sweep_s_sibling_folders_are_not_this_run_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "none"))
    for name, mtime in (("exp", 2000.0), ("exp_lr2", 3000.0), ("exp-2_b", 3000.0), ("expo", 3000.0)):
        torch_file(tmp_path / "runs" / "detect" / name / "weights" / "last.pt", mtime)
    restarted = resumer(tmp_path).launch(command("yolo", "train", "name=exp"), restart=True)
    assert restarted.resumed is not None and restarted.resumed["from"] == str(tmp_path / "runs/detect/exp/weights/last.pt")
    second = torch_file(tmp_path / "runs" / "detect" / "exp-2" / "weights" / "last.pt", 2500.0)
    again = resumer(tmp_path).launch(command("yolo", "train", "name=exp"), restart=True)
    assert again.resumed is not None and again.resumed["from"] == str(second), "exp-2: Ultralytics' own next name"


def test_the_folder_yolo_printed_is_the_run_s_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "none"))
    mine = torch_file(tmp_path / "runs" / "detect" / "train" / "weights" / "last.pt", 2000.0)
    torch_file(tmp_path / "runs" / "detect" / "train-2" / "weights" / "last.pt", 3000.0)  # another run of one name
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    said = f"\x1b[34m\x1b[1mengine/trainer: \x1b[0mtask=detect, name=train, save_dir={mine.parent.parent}, plots=False\n"
    (logs / "attempt-0.log").write_text("Ultralytics 8.4\n" + said + "Logging results to ...\n")
    (logs / "attempt-x.log").write_text(said.replace("/train,", "/train-2,"))  # no attempt's log
    restarted = resumer(tmp_path).launch(command("yolo", "train"), restart=True)
    assert restarted.resumed is not None and restarted.resumed["from"] == str(mine)


HF = ("python", "t.py", "--output_dir", "out")
REFUSED = ("usage: t.py [-h] [--output_dir OUTPUT_DIR]", "t.py: error: unrecognized arguments: --resume_from_checkpoint out/c")


def test_resume_words_the_program_refuses_are_withdrawn_for_the_rest_of_the_run(tmp_path: Path) -> None:
    trainer_checkpoint(tmp_path / "out", 10, 2000.0)
    mine = resumer(tmp_path)
    given = mine.launch(command(*HF), restart=True, after=ended(-9, beats=3))
    assert list(given.argv)[-2:] == ["--resume_from_checkpoint", str(tmp_path / "out" / "checkpoint-10")]
    withdrawn = mine.launch(command(*HF), restart=True, after=ended(2, *REFUSED))
    assert list(withdrawn.argv) == list(HF) and withdrawn.resumed is not None
    assert withdrawn.resumed["refused"] == "--resume_from_checkpoint"
    assert resumed_words(withdrawn.resumed) == (
        ", from the start: the program refused --resume_from_checkpoint (its usage error): the command runs as given from now on"
    )
    later = mine.launch(command(*HF), restart=True, after=ended(-9, beats=5))
    assert list(later.argv) == list(HF), "withdrawn for the rest of the run"
    crashed = resumer(tmp_path)
    crashed.launch(command(*HF), restart=True)
    kept = crashed.launch(command(*HF), restart=True, after=ended(1, *REFUSED))  # not its usage error: kept
    assert "--resume_from_checkpoint" in kept.argv
