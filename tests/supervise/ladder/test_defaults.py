"""Built-in rungs for programs trainbox knows (no ``--ladder``), in milliseconds: the worker count halved, then 0."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.supervised import train_cli
from trainbox.rundir.events import Retry
from trainbox.supervise.ladder.command import CommandLadder
from trainbox.supervise.ladder.defaults import CAUSES, rungs_for, unapplied
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome, OutcomeKind


def on_a_gpu() -> bool:
    return True


def rungs(argv: List[str]) -> List[tuple]:
    return [(rung.name, rung.args) for rung in rungs_for(argv, on_a_gpu)]


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
    assert rungs_for(argv, on_a_gpu) == []


def test_only_a_loader_hang_moves_down_the_built_in_rungs_and_the_restart_says_which() -> None:
    argv = ["yolo", "train", "workers=4"]
    ladder = CommandLadder(Launch(argv=argv, startup_timeout=60, stall_timeout=30), rungs_for(argv, on_a_gpu), causes=CAUSES)
    assert ladder.first().profile == "workers-4" and list(ladder.first().argv) == argv
    idle = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "idle"}))
    assert (idle.launch.profile, idle.retry, idle.reason) == ("workers-4", Retry.SAME, "idle: workers-4 once more")
    loader = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "loader_deadlock"}))
    assert loader.launch.profile == "workers-2" and list(loader.launch.argv) == [*argv, "workers=2"]
    assert loader.retry is Retry.LADDER and loader.reason.startswith("loader_deadlock: down the ladder to workers-2")


def test_yolo_train_on_the_cpu_gets_no_rungs_ultralytics_gives_it_no_workers() -> None:
    assert rungs_for(["yolo", "train", "workers=4", "device=cpu"], on_a_gpu) == []
    assert rungs_for(["yolo", "train", "workers=4", "device=MPS"], on_a_gpu) == []
    assert rungs_for(["yolo", "train", "workers=4"], lambda: False) == [], "no device named, on a machine without a GPU"
    assert [r.name for r in rungs_for(["yolo", "train", "workers=4", "device=0"], lambda: False)] == [
        "workers-4",
        "workers-2",
        "workers-0",
    ], "the device it names"


#: What Ultralytics 8.4 prints as its training starts on the CPU, given workers=2 (recorded from a real run).
ON_THE_CPU = """\
Image sizes 96 train, 96 val
Using 0 dataloader workers
Logging results to runs/detect/train
Starting training for 2 epochs...
"""


def test_a_rung_the_program_will_not_apply_is_skipped_and_the_restart_says_why(tmp_path: Path) -> None:
    """Ultralytics said it used no workers: moving down from workers-2 to workers-1 would change nothing."""
    argv = ["yolo", "train", "workers=2", "device=0"]
    ladder = CommandLadder(
        Launch(argv=argv, startup_timeout=60, stall_timeout=30), rungs_for(argv), causes=CAUSES, unapplied=unapplied
    )
    log = tmp_path / "attempt-0.log"
    log.write_text(ON_THE_CPU + "  1/2  0G  1.2  3.4  5.6  16  96: 40%|####      | 2/5\n")
    stalled = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "loader_deadlock", "log": str(log)}))
    assert (stalled.launch.profile, stalled.retry) == ("workers-2", Retry.SAME)
    assert stalled.reason.startswith("loader_deadlock: workers-1, workers-0 skipped, the program used no loader workers")
    assert '"Using 0 dataloader workers"' in stalled.reason and stalled.reason.endswith("workers-2 once more")
    log.write_text(ON_THE_CPU.replace("Using 0", "Using 2"))
    moved = ladder.after(Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": "loader_deadlock", "log": str(log)}))
    assert moved.launch.profile == "workers-1", "it used its workers: fewer is a change"
    assert unapplied(Outcome(OutcomeKind.STALLED, detail={"log": str(tmp_path / "none.log")})) is None


def test_a_real_yolo_train_on_the_cpu_runs_without_worker_rungs(tmp_path: Path) -> None:
    """``yolo train workers=2`` on a machine without a GPU: the rungs would change nothing, so there are none (the
    command fails at once on its missing data: only how it was started is looked at)."""
    run_dir = tmp_path / "run"
    command = ["yolo", "train", "workers=2", "device=cpu", f"data={tmp_path / 'missing.yaml'}", "model=yolov8n.yaml"]
    args = ["supervise", "--run-dir", str(run_dir), "--max-restarts", "0", "--", *command]
    done = train_cli(args, run_dir, {"YOLO_OFFLINE": "1"}, cwd=tmp_path)
    assert "built-in rungs" not in done.stderr, done.stderr
    assert [start["profile"] for start in done.of("start")] == [None], "the command as given, on no rung"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4096) | st.builds(lambda n: b"Using %d dataloader workers\n" % n, st.integers(0, 10**9)))
def test_any_attempt_log_reads_as_a_reason_or_none(tmp_path: Path, log: bytes) -> None:
    """The log is the child's output, untrusted: any bytes give a reason or None; a FIFO in its place is no log."""
    path = tmp_path / "attempt.log"
    path.unlink(missing_ok=True)
    path.write_bytes(log)
    found = unapplied(Outcome(OutcomeKind.STALLED, detail={"log": str(path)}))
    assert found is None or "Using 0 dataloader workers" in found


def test_a_fifo_in_place_of_the_log_is_no_log(tmp_path: Path) -> None:
    fifo = tmp_path / "attempt.log"
    os.mkfifo(fifo)
    assert unapplied(Outcome(OutcomeKind.STALLED, detail={"log": str(fifo)})) is None
