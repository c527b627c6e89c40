"""A supervisor as a Slurm job step: bad input is one line and exit 2, before anything starts (no rendezvous to hang);
the job's status survives srun's ending of the other nodes; the documented sbatch file is the example."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from tests.rundir import hostile
from tests.slurm.test_env import STEP
from tests.supervised import train_cli
from trainbox.errors import ExitCode
from trainbox.slurm import step

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


def test_a_node_stopped_by_srun_takes_the_status_of_the_node_that_ended_first() -> None:
    others = [
        (1, {"exit_code": 143, "updated_ts": 20.0}),
        (2, {"exit_code": 6, "updated_ts": 15.0}),
        (3, {"exit_code": 1, "updated_ts": 18.0}),
    ]
    assert step.job_status(143, 0, others, since=10.0) == ExitCode.HUNG


def test_a_status_of_its_own_or_an_ending_from_before_a_requeue_is_kept() -> None:
    assert step.job_status(0, 0, [(1, {"exit_code": 6, "updated_ts": 15.0})], since=10.0) == 0
    assert step.job_status(75, 0, [(1, {"exit_code": 6, "updated_ts": 15.0})], since=10.0) == 75
    assert step.job_status(143, 0, [(1, {"exit_code": 6, "updated_ts": 5.0})], since=10.0) == 143, "the run before"
    assert step.job_status(143, 0, [(1, {"exit_code": 0, "updated_ts": 15.0})], since=10.0) == 143


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), hostile.json_values())))
def test_whatever_the_other_nodes_state_json_holds_the_status_is_a_status(others: list) -> None:
    code = step.job_status(143, 0, others, since=0.0)
    assert code == 143 or code in step.CONTRACT


def test_the_documented_sbatch_file_is_the_example_and_is_bash() -> None:
    example = (REPO / "examples" / "slurm" / "train.sbatch").read_text()
    assert f"```bash\n{example}```" in (REPO / "docs" / "slurm.md").read_text()
    assert subprocess.run(["bash", "-n", str(REPO / "examples" / "slurm" / "train.sbatch")]).returncode == 0
