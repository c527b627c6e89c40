"""Node 0 writes job.json; the other nodes find it, or say in one line that the job directory is not shared."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from tests.rundir import hostile
from trainbox.errors import UserError
from trainbox.rundir.layout import JobDir
from trainbox.slurm import shared
from trainbox.slurm.env import SlurmJob


def node(number: int, restart: int = 0) -> SlurmJob:
    return SlurmJob("42", number, number, 2, "n[1-2]", restart, f"n{number + 1}")


def _node0_later(root: str) -> None:
    import time

    time.sleep(1.0)
    shared.meet(JobDir(Path(root)), node(0), "h:1")


def test_node_1_finds_what_node_0_wrote_even_when_node_0_comes_second(tmp_path: Path) -> None:
    later = multiprocessing.get_context("spawn").Process(target=_node0_later, args=(str(tmp_path / "job"),))
    later.start()
    shared.meet(JobDir(tmp_path / "job"), node(1), "h:1", wait_s=60)
    later.join()
    written = json.loads((tmp_path / "job" / "job.json").read_text())
    assert written["job_id"] == "42" and written["rendezvous"] == "h:1" and written["written_by"] == "n1"


def test_a_node_that_never_sees_node_0s_record_says_the_directory_is_not_shared(tmp_path: Path) -> None:
    with pytest.raises(UserError) as raised:
        shared.meet(JobDir(tmp_path / "job"), node(1), "h:1", wait_s=0.5)
    assert "is not shared between the job's nodes" in raised.value.message and "\n" not in raised.value.message


def test_the_record_of_the_run_before_a_requeue_is_not_this_ones(tmp_path: Path) -> None:
    shared.meet(JobDir(tmp_path), node(0, restart=0), "h:1")
    with pytest.raises(UserError, match="not shared"):
        shared.meet(JobDir(tmp_path), node(1, restart=1), "h:1", wait_s=0.5)
    shared.meet(JobDir(tmp_path), node(0, restart=1), "h:1")
    shared.meet(JobDir(tmp_path), node(1, restart=1), "h:1", wait_s=0.5)


@settings(max_examples=30, deadline=None)
@given(hostile.json_values())
def test_whatever_job_json_holds_is_only_ours_when_it_is(found: Any) -> None:
    assert shared.is_ours(found, node(1)) == (
        isinstance(found, dict) and found.get("job_id") == "42" and found.get("restart_count") == 0 and found.get("nnodes") == 2
    )


@pytest.mark.parametrize("kind", hostile.KINDS)
def test_a_hostile_job_json_is_not_ours_and_node_0_replaces_it_without_touching_what_it_points_to(
    tmp_path: Path, kind: Any
) -> None:
    outside = hostile.Outside(tmp_path / "outside").create()
    before = outside.snapshot()
    (tmp_path / "job").mkdir()
    hostile.plant(tmp_path / "job" / "job.json", kind, outside)
    hostile.assert_bounded(lambda: _refused(tmp_path / "job"), seconds=10, mib=64)
    try:
        shared.meet(JobDir(tmp_path / "job"), node(0), "h:1")
    except UserError as refused:  # a folder where job.json belongs: said in one line, nothing written
        assert "cannot write" in refused.message
    else:
        shared.meet(JobDir(tmp_path / "job"), node(1), "h:1", wait_s=0.5)
    outside.assert_intact(before)


def _refused(root: Path) -> None:
    with pytest.raises(UserError, match="not shared"):
        shared.meet(JobDir(root), node(1), "h:1", wait_s=0.3)
