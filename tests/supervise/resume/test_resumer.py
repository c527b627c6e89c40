"""What a restart adds to each attempt's command, in milliseconds (real files, no child)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest

from tests.supervise.resume.test_checkpoints import torch_file, trainer_checkpoint
from trainbox import cli
from trainbox.errors import ExitCode
from trainbox.supervise.planner import Launch
from trainbox.supervise.resume.resumer import Resumer, redone, resumed_words
from trainbox.supervise.settings import SupervisorSettings

RUN_BEGAN = 1500.0


def resumer(tmp_path: Path, resume_args: str = "", checkpoint: str = "") -> Resumer:
    settings = SupervisorSettings(resume_args=resume_args, checkpoint=checkpoint)
    return Resumer(settings, tmp_path / "run", RUN_BEGAN, cwd=tmp_path, sleep=lambda seconds: None)


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
    restarted = resumer(tmp_path).launch(command("yolo", "train", "model=yolov8n.yaml"), restart=True, reached={"step": 9})
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


def test_resume_args_name_the_checkpoint_found_by_the_user_s_glob_at_any_age(tmp_path: Path) -> None:
    old = torch_file(tmp_path / "ck" / "step-10.pt", 1000.0)  # the user named the folder: its age does not matter
    mine = resumer(tmp_path, "--resume {checkpoint} --fresh-optimizer", "ck/*.pt")
    first = mine.launch(command("python", "loop.py"), restart=False)
    assert list(first.argv) == ["python", "loop.py", "--resume", str(old), "--fresh-optimizer"]
    in_run_dir = resumer(tmp_path, "--from={checkpoint}", "saved/*.pt")
    kept = torch_file(tmp_path / "run" / "saved" / "a.pt", 3000.0)
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


@pytest.mark.parametrize(
    "reached, first, steps",
    [
        ({"step": 26}, {"step": 21}, 6),
        ({"step": 26}, {"step": 1}, 26),
        ({"step": 5}, {"step": 9}, 0),
        ({"epoch": 2, "batch": 40}, {"epoch": 2, "batch": 31}, 10),
        ({"epoch": 2, "batch": 40}, {"epoch": 3, "batch": 1}, None),
        ({"step": "26"}, {"step": 1}, None),
        (None, {"step": 1}, None),
    ],
)
def test_the_work_done_again_is_counted_from_the_counters(reached: Optional[dict], first: dict, steps: Optional[int]) -> None:
    assert redone(reached, first) == steps


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
