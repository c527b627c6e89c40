"""End to end on the real Slurm cluster: sbatch, srun, trainbox supervise on each of two nodes, torchrun, DDP.

(a) a two-node job finishes; its run is where Slurm users look for it, one folder per node.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.slurm import jobs
from tests.slurm.cluster import Cluster

#: A two-node job of two small epochs takes about 30 s here (six Python processes importing torch on two cores).
FINISHES_S = 240


def test_a_two_node_torchrun_job_under_trainbox_supervise_finishes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch(jobs.supervised(tmp_path))
    fields = slurm_cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), FINISHES_S)
    out = jobs.output(tmp_path, job)
    assert fields.get("JobState") == "COMPLETED" and "srun: 0" in out, (fields, out[-3000:])
    root = jobs.job_dir(tmp_path, job)
    record = json.loads((root / "job.json").read_text())
    assert record["job_id"] == job and record["nnodes"] == 2 and record["restart_count"] == 0
    for node in (0, 1):
        assert jobs.kinds(root / f"node-{node}") == ["start", "exit"], out[-3000:]
        assert jobs.events(root / f"node-{node}")[-1]["code"] == 0
    assert (root / "plain.pt").exists(), "the one checkpoint, in the job's directory"
    assert out.count("epoch 1 loss") == 2, "both ranks trained the last epoch"
