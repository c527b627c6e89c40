"""Atomic checkpoints under SIGKILL, and resuming that continues the epoch count."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.yolo.conftest import TINY, load_checkpoint, run_child
from trainbox.rundir.layout import RunDir
from trainbox.yolo import checkpoint


def test_kill_mid_save_keeps_previous_checkpoint_and_resume_continues(tmp_path: Path, demo_data: Path) -> None:
    run_dir = tmp_path / "run"
    args = [f"data={demo_data}", "epochs=3", *TINY]

    killed = run_child(run_dir, "safe", args, attempt=0, fault="sigkill@save,epoch=2")
    assert killed.code == -9, killed.output[-2000:]
    previous = load_checkpoint(killed.last)
    assert previous["epoch"] == 0 and previous["optimizer"] is not None  # epoch 1's checkpoint, intact
    staged = killed.last.parent / ".staging" / "last.pt"
    assert staged.is_file()  # epoch 2's checkpoint was written, never renamed into place
    assert killed.results_epochs() == [1, 2]

    resumed = run_child(run_dir, "safe", args, attempt=1)
    assert resumed.code == 0, resumed.output[-3000:]
    assert "Resuming training" in resumed.output and "from epoch 2 to 3 total epochs" in resumed.output
    assert resumed.results_epochs() == [1, 2, 3]
    final = load_checkpoint(resumed.last)
    assert final["epoch"] == -1 and final["optimizer"] is None  # stripped: the run is complete
    assert not staged.parent.exists()
    assert not list(resumed.last.parent.glob(".*.tmp"))
    beat = resumed.beat()
    assert beat is not None and beat["epoch"] == 3 and beat["step"] == 3 * 4

    again = run_child(run_dir, "safe", args, attempt=2)
    assert again.code == 0
    assert "run complete" in again.output and "nothing to train" in again.output


def test_checkpoint_of_the_last_epoch_is_finalised_not_retrained(tmp_path: Path, demo_data: Path) -> None:
    import torch

    run_dir = tmp_path / "run"
    args = [f"data={demo_data}", "epochs=2", *TINY]
    killed = run_child(run_dir, "safe", args, fault="sigkill@save,epoch=2")
    assert killed.code == -9
    ckpt = load_checkpoint(killed.last)
    ckpt["train_args"]["epochs"] = 1  # as if epoch 1 had been the last: killed before the final strip
    torch.save(ckpt, killed.last)

    done = run_child(run_dir, "safe", args, attempt=1)
    assert done.code == 0, done.output[-3000:]
    assert "every epoch was trained" in done.output and "Resuming" not in done.output
    final = load_checkpoint(done.last)
    assert final["epoch"] == -1 and final["optimizer"] is None


@pytest.mark.parametrize(
    "content, kept, dropped",
    [
        ("", "", 0),
        ("epoch,loss\n", "epoch,loss\n", 0),
        ("epoch,loss\n1,0.5\n\n2,0.4\n3,0.3\n", "epoch,loss\n1,0.5\n2,0.4\n", 2),
        ("epoch,loss\n1,0.5\n2,0.4\n3,0.", "epoch,loss\n1,0.5\n2,0.4\n", 1),
        ("epoch,loss\n1,0.5\ngarbage\n", "epoch,loss\n1,0.5\n", 1),
    ],
)
def test_trim_results_survives_blank_torn_and_empty_files(tmp_path: Path, content: str, kept: str, dropped: int) -> None:
    run = RunDir(tmp_path)
    run.results.parent.mkdir()
    run.results.write_text(content)
    assert checkpoint.trim_results(run, 2) == dropped
    assert run.results.read_text() == kept
