"""Built-in rungs for programs trainbox knows (no ``--ladder``), in milliseconds: the worker count halved, then 0."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from trainbox.rundir.events import Retry
from trainbox.supervise.ladder.command import CommandLadder
from trainbox.supervise.ladder.defaults import CAUSES, rungs_for
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome, OutcomeKind


def rungs(argv: List[str]) -> List[tuple]:
    return [(rung.name, rung.args) for rung in rungs_for(argv)]


def test_yolo_train_steps_its_workers_down_by_half_then_to_none() -> None:
    assert rungs(["yolo", "train", "data=x.yaml"]) == [
        ("workers-8", []),
        ("workers-4", ["workers=4"]),
        ("workers-0", ["workers=0"]),
    ]
    assert rungs(["yolo", "train", "workers=3"]) == [
        ("workers-3", []),
        ("workers-1", ["workers=1"]),
        ("workers-0", ["workers=0"]),
    ]
    assert rungs(["yolo", "train", "workers=1"]) == [("workers-1", []), ("workers-0", ["workers=0"])]


def test_a_trainer_script_steps_its_dataloader_workers_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("args = TrainingArguments(output_dir='o')\n")  # what makes it a Trainer script
    argv = ["python", "t.py", "--output_dir", "o", "--dataloader_num_workers", "4"]
    assert rungs(argv) == [
        ("workers-4", []),
        ("workers-2", ["--dataloader_num_workers", "2"]),
        ("workers-0", ["--dataloader_num_workers", "0"]),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "t.py", "--output_dir", "o"],  # the Trainer's default is no workers: nothing to lower
        ["yolo", "train", "workers=0"],
        ["yolo", "train", "workers=many"],
        ["python", "train.py", "--num_workers", "4"],  # a program trainbox does not know: as today
        ["python", "train.py", "--out_dir=o"],  # nanoGPT has no worker option
    ],
)
def test_other_commands_get_no_rungs(argv: List[str]) -> None:
    assert rungs_for(argv) == []


def test_only_a_loader_hang_moves_down_the_built_in_rungs_and_the_restart_says_which() -> None:
    argv = ["yolo", "train", "workers=4"]
    ladder = CommandLadder(Launch(argv=argv, startup_timeout=60, stall_timeout=30), rungs_for(argv), causes=CAUSES)
    assert ladder.first().profile == "workers-4" and list(ladder.first().argv) == argv
    idle = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "idle"}))
    assert (idle.launch.profile, idle.retry, idle.reason) == ("workers-4", Retry.SAME, "idle: workers-4 once more")
    loader = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "loader_deadlock"}))
    assert loader.launch.profile == "workers-2" and list(loader.launch.argv) == [*argv, "workers=2"]
    assert loader.retry is Retry.LADDER and loader.reason.startswith("loader_deadlock: down the ladder to workers-2")
