"""Whether every node of a job sees the same job directory, found out at the start in a bounded time.

The nodes' supervisors share their work through the job directory (the checkpoint the program writes there, the
job-level incident, ``job.json``). A directory on a node's local disk looks the same from each node and is not shared:
each node would train on its own, and the job-level view would see one node. So node 0 writes ``job.json`` (the job
as Slurm started it, with its restart count: a requeued job writes it anew) and every other node looks for that very
record for at most :data:`WAIT_S`. A node that does not see it says so in one line and exits 2, instead of waiting in
the rendezvous for a job that will never agree.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict

from trainbox.errors import UserError
from trainbox.rundir.layout import JobDir
from trainbox.slurm.env import SlurmJob

#: How long a node waits for node 0's ``job.json``: the nodes start together under one ``srun``, and node 0 writes it
#: within a second or two of starting, so this bounds a slow start on a loaded node, not the normal case.
WAIT_S = 60.0
#: How often a waiting node looks.
POLL_S = 0.25
#: job.json is a few hundred bytes; one much larger is not node 0's.
MAX_BYTES = 64 * 1024


def record(job: SlurmJob, rendezvous: str) -> Dict[str, Any]:
    """What node 0 writes into ``job.json``."""
    return {
        "job_id": job.job_id,
        "nnodes": job.nnodes,
        "nodelist": job.nodelist,
        "restart_count": job.restart_count,
        "rendezvous": rendezvous,
        "written_by": job.node_name or f"node {job.node_id}",
        "ts": time.time(),
    }


def is_ours(found: Any, job: SlurmJob) -> bool:
    """Whether ``found`` (job.json as read, untrusted) is the record node 0 wrote for this very run of the job."""
    return (
        isinstance(found, dict)
        and found.get("job_id") == job.job_id
        and found.get("restart_count") == job.restart_count
        and found.get("nnodes") == job.nnodes
    )


def meet(directory: JobDir, job: SlurmJob, rendezvous: str, wait_s: float = WAIT_S) -> None:
    """Node 0 writes ``job.json``; another node waits up to ``wait_s`` to read it. A UserError when it cannot."""
    files = directory.files
    if job.node_id == 0:
        try:
            directory.root.mkdir(parents=True, exist_ok=True)  # not the run directory: the job's folder, made
        except OSError as exc:
            raise UserError(f"cannot make the job directory {directory.root}: {exc.strerror or exc}") from None
        refused = files.replace(directory.job, (json.dumps(record(job, rendezvous), indent=1) + "\n").encode())
        if refused is not None:
            raise UserError(f"cannot write {directory.job} ({refused.value}): the job's nodes meet there")
        return
    deadline = time.monotonic() + wait_s
    while True:
        if is_ours(files.read_object(directory.job, MAX_BYTES).value, job):
            return
        if time.monotonic() >= deadline:
            raise UserError(
                f"the job directory {directory.root} is not shared between the job's nodes: node {job.node_id} "
                f"({job.node_name or 'this node'}) did not see node 0's {directory.job.name} for job {job.job_id} "
                f"within {wait_s:g} s; put it on a filesystem every node mounts (--run-dir)"
            )
        time.sleep(POLL_S)
