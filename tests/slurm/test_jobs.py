"""End to end on the real Slurm cluster: sbatch, srun, trainbox supervise on each of two nodes, torchrun, DDP.

(a) a two-node job finishes; its run is where Slurm users look for it, one folder per node;
(c) Slurm's warning before the time limit stops the job at its next checkpoint with the requeue status, the sbatch
    script requeues it, and the requeued job goes on from that checkpoint to the end;
(d) a lost node (its slurmd and its step's processes killed) ends the job as Slurm documents it, the supervisor left
    stopped by Slurm's SIGTERM (143); Slurm requeues it (--requeue) and, the node back, the job resumes and finishes.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.slurm import jobs
from tests.slurm.cluster import Cluster

#: They train for real (torch DDP over gloo), so the inner loop (`-m "not docker and not training"`) leaves them out.
pytestmark = pytest.mark.training

#: A two-node job of two small epochs takes about 30 s here (six Python processes importing torch on two cores), and
#: up to a minute while other tests load the machine.
FINISHES_S = 300
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")


def wait_for(ready, what: str, timeout: float = FINISHES_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.5)


def test_a_two_node_torchrun_job_under_trainbox_supervise_finishes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch(jobs.supervised(tmp_path))
    fields = slurm_cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), FINISHES_S)
    out = jobs.output(tmp_path, job)
    assert fields.get("JobState") == "COMPLETED" and "srun: 0 (restart 0)" in out, (fields, out[-3000:])
    root = jobs.job_dir(tmp_path, job)
    record = json.loads((root / "job.json").read_text())
    assert record["job_id"] == job and record["nnodes"] == 2 and record["restart_count"] == 0
    for node in (0, 1):
        assert jobs.kinds(root / f"node-{node}") == ["start", "exit"], out[-3000:]
        assert jobs.events(root / f"node-{node}")[-1]["code"] == 0
    assert (root / "plain.pt").exists(), "the one checkpoint, in the job's directory"
    assert out.count("epoch 1 loss") == 2, "both ranks trained the last epoch"


def test_slurms_warning_stops_the_job_at_a_checkpoint_and_the_requeued_job_goes_on_from_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    job = slurm_cluster.sbatch(jobs.supervised(tmp_path, epochs=8, samples=256))
    root = jobs.job_dir(tmp_path, job)
    wait_for((root / "plain.pt").exists, "first checkpoint")
    # What `sbatch --signal=USR2@T` has Slurm send every process of the job's steps T seconds before the time limit.
    assert slurm_cluster.scancel("--signal=USR2", job).returncode == 0
    fields = slurm_cluster.wait_state(job, ENDED, 2 * FINISHES_S)
    out = jobs.output(tmp_path, job)
    assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1", (fields, out[-4000:])
    assert "srun: 75 (restart 0)" in out and "srun: 0 (restart 1)" in out, out[-4000:]
    for node in (0, 1):
        exits = [e["code"] for e in jobs.events(root / f"node-{node}") if e["event"] == "exit"]
        assert exits == [143, 0], "stopped (the CLI exits 75 for it), then the requeued run to its end, in one history"
    resumed = [int(n) for n in re.findall(r"resumed from \S+ at epoch (\d+)", out)]
    assert len(resumed) == 2 and resumed[0] == resumed[1] >= 1, out[-4000:]
    last = max(int(n) for n in re.findall(r"^epoch (\d+) loss", out, re.M))
    assert last == 7, "the requeued job trained to the end"


def test_a_lost_node_ends_the_job_as_documented_and_the_requeued_job_resumes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch(jobs.supervised(tmp_path, epochs=6, samples=256, sbatch=("--nodes=2", "--requeue")))
    root = jobs.job_dir(tmp_path, job)
    wait_for((root / "plain.pt").exists, "first checkpoint")
    try:
        assert slurm_cluster.lose_node("n2") >= 3, "slurmstepd, the supervisor, torchrun and its rank"
        wait_for(lambda: slurm_cluster.job(job).get("Restarts") == "1", "the requeue after the node failure")
        assert slurm_cluster.states().get("n2", "").startswith("down"), slurm_cluster.states()
    finally:
        slurm_cluster.start_node("n2")  # the machine back (ReturnToService=2: it comes back idle)
    fields = slurm_cluster.wait_state(job, ENDED, 2 * FINISHES_S)
    out = jobs.output(tmp_path, job)
    assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "1", (fields, out[-4000:])
    exits = [e["code"] for e in jobs.events(root / "node-0") if e["event"] == "exit"]
    assert exits == [143, 0], "node 0 stopped by Slurm's SIGTERM as the job ended, then the requeued run to the end"
    resumed = [int(n) for n in re.findall(r"resumed from \S+ at epoch (\d+)", out)]
    assert len(resumed) == 2 and resumed[0] == resumed[1] >= 1, out[-4000:]
