"""The job a step runs in, read from its SLURM_* variables; --nnodes against the allocation; torchrun's defaults."""

from __future__ import annotations

from typing import Dict

import pytest

from trainbox.errors import UserError
from trainbox.slurm import env
from trainbox.slurm.env import SlurmJob

STEP = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURMD_NODENAME": "n2",
}


def job(**fields: object) -> SlurmJob:
    given: Dict[str, object] = dict(job_id="42", node_id=0, proc_id=0, nnodes=2, nodelist="n[1-2]")
    return SlurmJob(**{**given, **fields})  # type: ignore[arg-type]


def test_a_step_is_read_whole_and_a_first_run_has_restarted_zero_times() -> None:
    assert env.in_job_step(STEP)
    assert env.read(STEP) == SlurmJob("42", 1, 1, 2, "n[1-2]", 0, "n2")
    assert env.read({**STEP, "SLURM_RESTART_COUNT": "3"}).restart_count == 3


def test_a_second_task_on_a_node_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="--ntasks-per-node=1"):
        env.read({**STEP, "SLURM_LOCALID": "1"})
    assert env.read({**STEP, "SLURM_LOCALID": "0"}).node_id == 1


def test_the_batch_script_itself_is_not_a_step() -> None:
    assert not env.in_job_step({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"})
    assert not env.in_job_step({})


@pytest.mark.parametrize("gone", ["SLURM_JOB_ID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_NODELIST"])
def test_a_missing_variable_is_named_in_one_line(gone: str) -> None:
    with pytest.raises(UserError) as raised:
        env.read({k: v for k, v in STEP.items() if k != gone})
    assert gone in raised.value.message and "srun" in raised.value.message and "\n" not in raised.value.message


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not a number"),
        ({"SLURM_NODEID": "2"}, "does not fit SLURM_NNODES=2"),
        ({"SLURM_JOB_ID": "../etc"}, "is not a Slurm job id"),
        ({"SLURM_RESTART_COUNT": "-1"}, "must be >= 0"),
    ],
)
def test_a_variable_that_makes_no_sense_is_refused(bad: Dict[str, str], words: str) -> None:
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("(", r"\(")):
        env.read({**STEP, **bad})


@pytest.mark.parametrize(
    "argv, asked",
    [
        (["torchrun", "--nnodes", "2", "t.py"], "2"),
        (["torchrun", "--nnodes=1:4", "t.py"], "1:4"),
        (["python", "t.py", "--epochs", "2"], None),
        (["torchrun", "--nnodes"], ""),
    ],
)
def test_the_nnodes_a_command_asks_for(argv: list, asked: object) -> None:
    assert env.nnodes_asked(argv, {}) == asked


def test_pet_nnodes_counts_when_the_command_line_says_nothing() -> None:
    assert env.nnodes_asked(["torchrun", "t.py"], {"PET_NNODES": "3"}) == "3"
    assert env.nnodes_asked(["torchrun", "--nnodes", "2", "t.py"], {"PET_NNODES": "3"}) == "2"


@pytest.mark.parametrize("asked", [None, "2", "1:2", "2:8"])
def test_nnodes_the_allocation_meets(asked: object) -> None:
    env.check_nnodes(asked, job(nnodes=2))  # type: ignore[arg-type]


@pytest.mark.parametrize("asked", ["3", "1", "3:4", "x", "", "1:2:3"])
def test_nnodes_the_allocation_cannot_meet_is_one_line(asked: str) -> None:
    with pytest.raises(UserError) as raised:
        env.check_nnodes(asked, job(nnodes=2))
    assert "\n" not in raised.value.message


def test_torchrun_gets_the_jobs_rendezvous_unless_told_otherwise() -> None:
    defaults = env.torchrun_env(job(job_id="12345"), "10.0.0.7", {})
    assert defaults == {
        "PET_NNODES": "2",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"10.0.0.7:{env.PORT_BASE + 2345}",
        "PET_RDZV_ID": "slurm-12345",
    }
    assert "PET_RDZV_ENDPOINT" not in env.torchrun_env(job(), "a", {"PET_RDZV_ENDPOINT": "b:1"})


def test_an_array_tasks_id_has_a_port_too() -> None:
    assert job(job_id="7_3").port == env.PORT_BASE + 7
