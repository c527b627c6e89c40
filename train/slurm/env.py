"""The Slurm job a supervisor runs in, as Slurm describes it: its variables, validated; where its run is; its rendezvous.

``srun --ntasks-per-node=1 python -m trainbox supervise -- torchrun --nnodes $SLURM_NNODES ...`` starts one
supervisor per node as a job step. :func:`in_job_step` says whether this process is one (``SLURM_JOB_ID`` and
``SLURM_STEP_ID`` are set: a step, not the batch script itself); :func:`read` turns the variables into a
:class:`SlurmJob`, or one line naming what is missing or wrong (exit 2), before anything starts.

Where the run is (:func:`job_dir`): the job's directory is ``runs/<command>-<jobid>/`` (or the ``--run-dir`` given),
on the filesystem every node sees, laid out as :class:`trainbox.rundir.layout.JobDir`: each node's supervisor runs in
``node-<SLURM_NODEID>/``, an ordinary run directory. The name carries the job id and nothing of the time, so a
requeued job (``SLURM_RESTART_COUNT`` > 0: the same id) goes on with the same run and every node with its own folder:
each program resumes from its own newest checkpoint, as after any restart.

The rendezvous (:func:`torchrun_env`): torchrun reads each of its options from a ``PET_`` variable when the command
line leaves it out, so the child's environment gives it the job's: the c10d backend, the endpoint on the first node
of the allocation (``scontrol show hostnames``, then that node's ``NodeAddr``: a node's name need not resolve), a port
derived from the job id, the job id as the rendezvous id, and ``--nnodes`` from the allocation. A command that says
``--nnodes`` itself must agree with the allocation: otherwise the rendezvous would wait for nodes that never come
(:func:`check_nnodes`, one line and exit 2 instead).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from trainbox.errors import UserError

#: The variables a supervisor of a Slurm job step reads; each must be there (srun sets them all).
REQUIRED = ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURM_NNODES", "SLURM_JOB_NODELIST")
#: c10d's port: a job's own, derived from its id, so that two jobs sharing a first node rarely meet; in the range
#: above the registered ports that Linux's ephemeral range (32768 and up) leaves alone.
PORT_BASE, PORT_SPAN = 20000, 10000
#: How long ``scontrol`` may take to answer (it asks the controller).
SCONTROL_S = 30.0
#: torchrun's options, as a command line may spell them: ``--nnodes 2``, ``--nnodes=2``, ``--nnodes=1:2``.
_NNODES = re.compile(r"--nnodes(?:=(.*))?$")


@dataclass(frozen=True)
class SlurmJob:
    """One node's view of its job: ``SLURM_JOB_ID``, ``SLURM_NODEID``, ``SLURM_PROCID``, ``SLURM_NNODES``,
    ``SLURM_JOB_NODELIST`` and ``SLURM_RESTART_COUNT`` (0 before the first requeue), checked on creation."""

    job_id: str
    node_id: int
    proc_id: int
    nnodes: int
    nodelist: str
    restart_count: int = 0
    node_name: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9]+(_[0-9]+)?", self.job_id):
            raise UserError(f"SLURM_JOB_ID={self.job_id!r} is not a Slurm job id")
        if self.nnodes < 1 or not 0 <= self.node_id < self.nnodes:
            raise UserError(f"SLURM_NODEID={self.node_id} does not fit SLURM_NNODES={self.nnodes}")
        if self.proc_id < 0 or self.restart_count < 0:
            raise UserError(f"SLURM_PROCID={self.proc_id} and SLURM_RESTART_COUNT={self.restart_count} must be >= 0")

    @property
    def port(self) -> int:
        """The rendezvous port of this job (:data:`PORT_BASE` + the job id modulo :data:`PORT_SPAN`)."""
        return PORT_BASE + int(self.job_id.split("_")[0]) % PORT_SPAN


def in_job_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of a Slurm job step (started by ``srun``), not the batch script itself."""
    return bool(environ.get("SLURM_JOB_ID")) and bool(environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID"))


def _number(environ: Mapping[str, str], name: str) -> int:
    text = environ.get(name, "0")
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} is not a number: is this a Slurm job step (srun)?") from None


def read(environ: Mapping[str, str]) -> SlurmJob:
    """The job of this step, from its ``SLURM_*`` variables; one UserError naming every one that is missing."""
    lacking = [name for name in REQUIRED if not environ.get(name)]
    if lacking:
        raise UserError(
            f"not inside a Slurm job step: {', '.join(lacking)} not set "
            "(run it as `srun --ntasks-per-node=1 python -m trainbox supervise -- ...` in an sbatch script)"
        )
    if environ.get("SLURM_LOCALID", "0") != "0":  # a second task on this node: torchrun starts the node's ranks
        raise UserError("one trainbox supervise per node: srun --ntasks-per-node=1 (torchrun starts each node's ranks)")
    return SlurmJob(
        job_id=environ["SLURM_JOB_ID"],
        node_id=_number(environ, "SLURM_NODEID"),
        proc_id=_number(environ, "SLURM_PROCID"),
        nnodes=_number(environ, "SLURM_NNODES"),
        nodelist=environ["SLURM_JOB_NODELIST"],
        restart_count=_number(environ, "SLURM_RESTART_COUNT"),
        node_name=environ.get("SLURMD_NODENAME", ""),
    )


def job_dir(command: str, job: SlurmJob, runs: Path, given: Optional[Path]) -> Path:
    """The job's directory: ``given`` (``--run-dir``), else ``runs/<command>-<jobid>`` (a requeue finds it again)."""
    return given if given is not None else runs / f"{command}-{job.job_id}"


def _scontrol(*words: str) -> str:
    try:
        done = subprocess.run(["scontrol", *words], capture_output=True, text=True, timeout=SCONTROL_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot ask Slurm (scontrol {' '.join(words)}): {exc}") from None
    if done.returncode != 0:
        raise UserError(f"scontrol {' '.join(words)} failed: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def first_node_address(nodelist: str) -> str:
    """The address of the allocation's first node: its ``NodeAddr`` (its name where Slurm gives none)."""
    names = _scontrol("show", "hostnames", nodelist).split()
    if not names:
        raise UserError(f"SLURM_JOB_NODELIST={nodelist!r} names no node")
    fields = dict(word.split("=", 1) for word in _scontrol("show", "node", "-o", names[0]).split() if "=" in word)
    return fields.get("NodeAddr") or names[0]


def nnodes_asked(argv: Sequence[str], environ: Mapping[str, str]) -> Optional[str]:
    """What ``--nnodes`` the command gives torchrun (``2``, ``1:2``): on its command line, else ``PET_NNODES``."""
    for at, word in enumerate(argv):
        found = _NNODES.match(word)
        if found:
            return found.group(1) if found.group(1) is not None else (argv[at + 1] if at + 1 < len(argv) else "")
    return environ.get("PET_NNODES")


def check_nnodes(asked: Optional[str], job: SlurmJob) -> None:
    """Refuse a ``--nnodes`` (``N`` or ``MIN:MAX``) the allocation cannot meet: the rendezvous would wait forever."""
    if asked is None:
        return
    try:
        bounds = [int(part) for part in asked.split(":")]
    except ValueError:
        raise UserError(f"--nnodes {asked!r} is not a number of nodes (N or MIN:MAX)") from None
    low, high = bounds[0], bounds[-1]
    if len(bounds) > 2 or not low <= job.nnodes <= high:
        raise UserError(
            f"the job has {job.nnodes} node(s) (SLURM_NNODES) but the command asks torchrun for --nnodes {asked}: "
            f"give --nnodes $SLURM_NNODES (or sbatch --nodes={asked.split(':')[-1]})"
        )


def torchrun_env(job: SlurmJob, address: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """The child's ``PET_*`` defaults for torchrun's rendezvous (the user's own ``PET_*`` and options win)."""
    defaults = {
        "PET_NNODES": str(job.nnodes),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{address}:{job.port}",
        "PET_RDZV_ID": f"slurm-{job.job_id}",
    }
    return {name: value for name, value in defaults.items() if name not in environ}
