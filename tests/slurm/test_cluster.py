"""The cluster fixture itself: two nodes that run one task each of a two-node job step."""

from __future__ import annotations

from pathlib import Path

from tests.slurm.cluster import NODES, Cluster


def test_a_two_node_step_runs_one_task_on_each_node(slurm_cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\nsrun --ntasks-per-node=1 bash -c 'echo $SLURM_NODEID $SLURMD_NODENAME $SLURM_NNODES' > {out}\n"
    )
    job = slurm_cluster.sbatch(script, "--nodes=2", f"--output={tmp_path}/slurm-%j.out")
    fields = slurm_cluster.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=60)
    assert fields.get("JobState") == "COMPLETED", (fields, slurm_cluster.logs())
    assert sorted(out.read_text().split("\n")[:2]) == [f"{i} {node} 2" for i, node in enumerate(NODES)]
