"""A supervisor as one task of a Slurm job step: what the CLI asks before it starts the supervisor.

:func:`prepare` reads the job (:mod:`trainbox.slurm.env`), refuses a ``--nnodes`` the allocation cannot meet, finds
the rendezvous endpoint, makes sure the nodes share the job directory (:mod:`trainbox.slurm.shared`) and returns a
:class:`Step`: the node's run directory and what the child's environment adds. Everything it refuses is one line and
exit 2 before anything starts. The supervisor itself is not told it runs under Slurm: it supervises the node's run
directory as any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from trainbox.rundir.layout import JobDir
from trainbox.slurm import env, shared


@dataclass(frozen=True)
class Step:
    """This node's part of the job: the job, its directory, the node's run directory, the child's added variables."""

    job: env.SlurmJob
    job_dir: JobDir
    run_dir: Path
    child_env: Dict[str, str]


def prepare(argv: Sequence[str], command: str, given: Optional[Path], runs: Path, environ: Mapping[str, str]) -> Step:
    """This node's :class:`Step` for supervising ``argv`` (named ``command``), or a UserError saying what is wrong."""
    job = env.read(environ)
    env.check_nnodes(env.nnodes_asked(argv, environ), job)
    address = env.first_node_address(job.nodelist)
    child_env = env.torchrun_env(job, address, environ)
    directory = JobDir(env.job_dir(command, job, runs, given))
    shared.meet(directory, job, child_env.get("PET_RDZV_ENDPOINT") or environ.get("PET_RDZV_ENDPOINT", ""))
    return Step(job, directory, directory.node(job.node_id), child_env)
