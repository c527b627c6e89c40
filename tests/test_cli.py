"""``python -m trainbox``'s own edges (train/cli.py): the demo's dataset and arguments assembled for ``run``, a forgotten
``--``, extreme deadlines."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from trainbox import cli
from trainbox.rundir.layout import RunDir
from trainbox.yolo.demo_data import DEMO_TRAIN_ARGS


def test_demo_trains_its_dataset_with_its_arguments_under_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, argparse.Namespace] = {}

    def run(args: argparse.Namespace) -> int:
        seen["args"] = args
        return 0

    monkeypatch.setattr(cli, "_train", run)
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "epochs=2"]) == 0
    data = RunDir(tmp_path / "run").demo_data / "data.yaml"
    assert data.is_file() and seen["args"].profile == "safe"
    kept = [pair for pair in DEMO_TRAIN_ARGS if not pair.startswith("epochs=")]
    assert seen["args"].overrides == [*kept, "epochs=2", f"data={data}"], "the user's epochs= replaces the demo's"


def test_demo_refuses_a_dataset_of_its_own(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "data=parts/data.yaml"]) == 2
    assert capsys.readouterr().err == (
        "trainbox: error: demo trains its own dataset: for yours, `python -m trainbox run --profile NAME data=PATH`\n"
    )
    assert not (tmp_path / "run").exists()


def test_demo_refuses_bad_input_before_writing_its_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "epochs=abc"]) == 2
    assert capsys.readouterr().err == "trainbox: error: epochs=abc: expected int\n"
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "--profile", "saef"]) == 2
    assert "unknown profile 'saef' (did you mean safe?): choose one of " in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_forgotten_double_dash_is_said(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["supervise", "--stall-timeout", "5", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainbox: error: unrecognized arguments: python train.py") and err.count("\n") == 1
    assert err.endswith("; put `--` before the command: python -m trainbox supervise [options] -- CMD ...\n")


@pytest.mark.parametrize("deadline", ["0001-01-01T00:00+01:00", "0001-01-01T00:00", "9999-12-31T23:59-05:00"])
@pytest.mark.parametrize(
    "command",
    [
        ["status", "--run-dir", "{run}"],
        ["report", "{run}"],
        ["metrics", "{run}", "--textfile", "{run}/m.prom"],
        ["supervise", "--run-dir", "{run}"],
        ["supervise", "--ladder", "{ladder}", "--run-dir", "{run}"],
    ],
)
def test_an_extreme_deadline_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: List[str], deadline: str
) -> None:
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text("rungs:\n  - name: only\n    args: []\n")
    (tmp_path / "run").mkdir()
    words = [word.format(run=tmp_path / "run", ladder=ladder) for word in command]
    assert cli.main([*words, "--deadline", deadline, *(["--", "true"] if words[0] == "supervise" else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{deadline}': give a date from 1970 to 9998" in err, err
    assert not (tmp_path / "run" / "events.jsonl").exists()


@pytest.mark.parametrize(
    "own",
    [
        ["supervise", "--name", "x", "--grace", "5"],
        ["supervise", "--na", "x", "--grace", "5"],  # argparse takes a prefix of one option as that option
        ["supervise", "--run-dir=old", "--grace", "5"],
        ["supervise", "--run", "old", "--grace", "5"],
        ["supervise", "--resume", "--grace", "5"],
    ],
)
def test_the_line_that_goes_on_with_a_run_names_its_directory_once_however_it_was_given(own: List[str]) -> None:
    words = shlex.split(cli._resume_line(own, Path("runs/x"), ["python", "train.py"]))
    at = words.index("supervise")
    assert words[at:] == ["supervise", "--run-dir", "runs/x", "--grace", "5", "--", "python", "train.py"], words
    assert cli.build_parser().parse_args(words[at:-3]).run_dir == Path("runs/x")


@pytest.mark.parametrize("command", [["status"], ["status", "--watch"], ["health"]])
def test_a_reader_that_goes_away_ends_a_command_quietly(tmp_path: Path, command: List[str]) -> None:
    """``status | head -3``: the pipe's reader gone before the command writes; no BrokenPipeError traceback."""
    run = RunDir(tmp_path)
    run.events.write_text('{"event": "start", "attempt": 0, "ts": 1}\n{"event": "exit", "attempt": 0, "code": 0, "ts": 2}\n')
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a line is written
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", *command, "--run-dir", str(tmp_path)],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    os.close(write_end)
    assert done.returncode in (0, 128 + signal.SIGPIPE) and done.stderr == "", done.stderr
