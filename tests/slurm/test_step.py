"""Bad input to a supervisor of a Slurm job step: one line and exit 2, before anything starts (no rendezvous to hang)."""

from __future__ import annotations

from pathlib import Path

from tests.slurm.test_env import STEP
from tests.supervised import train_cli

NOT_A_STEP = {name: "" for name in STEP}


def test_slurm_asked_for_outside_a_job_names_the_missing_variables(tmp_path: Path) -> None:
    done = train_cli(["supervise", "--slurm", "--", "true"], env=NOT_A_STEP, cwd=tmp_path)
    assert done.code == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "SLURM_JOB_ID" in done.stderr and "srun" in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing is written"


def test_a_node_count_that_is_not_the_allocations_is_one_line(tmp_path: Path) -> None:
    done = train_cli(["supervise", "--", "torchrun", "--nnodes", "3", "t.py"], env=STEP, cwd=tmp_path)
    assert done.code == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the job has 2 node(s) (SLURM_NNODES) but the command asks torchrun for --nnodes 3" in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing is written"


def test_resume_is_not_for_a_slurm_job(tmp_path: Path) -> None:
    done = train_cli(["supervise", "--resume", "--", "true"], env=STEP, cwd=tmp_path)
    assert done.code == 2 and "requeued" in done.stderr and done.stderr.count("\n") == 1, done.stderr
