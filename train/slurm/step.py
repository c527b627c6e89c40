"""A supervisor as one task of a Slurm job step: what the CLI does around the supervisor, before and after.

Before: :func:`prepare` reads the job (:mod:`trainbox.slurm.env`), refuses a ``--nnodes`` the allocation cannot meet,
finds the rendezvous endpoint, makes sure the nodes share the job directory (:mod:`trainbox.slurm.shared`) and returns
a :class:`Step`: the node's run directory and what the child's environment adds. Everything it refuses is one line
and exit 2 before anything starts. The supervisor itself is not told it runs under Slurm: it supervises the node's run
directory as any other.

Around and after (:meth:`Step.supervise`): Slurm's warning is handled (:mod:`trainbox.slurm.warning`), and the status
is the job's. Under ``srun --kill-on-bad-exit=1`` the node that ends first with a status of the contract (gave up on a
hang, a crash, misconfigured...) has srun end every other node with SIGTERM, and srun exits with the highest status of
all, 143: the contract would be lost. So a node stopped by a signal looks at the other nodes' ``state.json`` and, when
one of them ended with a status of the contract, exits with that one (:func:`job_status`), saying so.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from trainbox.errors import ExitCode, say
from trainbox.rundir import state as run_state
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.slurm import env, shared
from trainbox.slurm.warning import Warning

#: The statuses a node ends with that say what became of the job (not a stop by a signal, not success).
CONTRACT = tuple(code for code in ExitCode if code != ExitCode.OK)


@dataclass(frozen=True)
class Step:
    """This node's part of the job: the job, its directory, the node's run directory, the child's added variables."""

    job: env.SlurmJob
    job_dir: JobDir
    run_dir: Path
    child_env: Dict[str, str]
    #: When this node's step started (unix time): a node's state.json older than that is the run's before a requeue.
    started: float

    def supervise(self, run: Callable[[], int]) -> int:
        """``run()`` the supervisor with Slurm's warning handled; the job's status (see the module docstring)."""
        warning = Warning(RunDir(self.run_dir), self.job_dir)
        warning.install()
        ended = run()
        # The run has ended, its tree with it: srun's SIGTERM to the other nodes (--kill-on-bad-exit) as one of them
        # exits must not turn this node's status into 143 while it only says it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return job_status(warning.status(ended), self.job.node_id, _endings(self.job_dir, self.job.node_id), self.started)


def _endings(job_dir: JobDir, own: int) -> Iterable[Tuple[int, Any]]:
    """(node, its state.json as read) of every other node of the job."""
    for node in job_dir.nodes():
        if node != own:
            yield node, run_state.read(RunDir(job_dir.node(node)).state)[0]


def _number(record: Mapping[str, Any], key: str) -> Optional[float]:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def job_status(code: int, own: int, others: Iterable[Tuple[int, Any]], since: float) -> int:
    """``code``, unless it is a stop by a signal (128+N) and another node ended with a status of the contract since
    ``since`` (this run of the job): then that one, the job's (the first such node's, by the time it ended).
    ``others``' records are untrusted."""
    if code < 128:
        return code
    ended = []
    for node, record in others:
        if not isinstance(record, Mapping):
            continue
        status, updated = record.get("exit_code"), _number(record, "updated_ts")
        if status in CONTRACT and not isinstance(status, bool) and updated is not None and updated >= since:
            ended.append((updated, node, int(status)))
    if not ended:
        return code
    _, node, status = min(ended)
    say(f"node {own} was stopped after node {node} ended with status {status}: exiting {status}, the job's status")
    return status


def prepare(argv: Sequence[str], command: str, given: Optional[Path], runs: Path, environ: Mapping[str, str]) -> Step:
    """This node's :class:`Step` for supervising ``argv`` (named ``command``), or a UserError saying what is wrong."""
    job = env.read(environ)
    env.check_nnodes(env.nnodes_asked(argv, environ), job)
    address = env.first_node_address(job.nodelist)
    child_env = env.torchrun_env(job, address, environ)
    directory = JobDir(env.job_dir(command, job, runs, given))
    started = time.time()
    shared.meet(directory, job, child_env.get("PET_RDZV_ENDPOINT") or environ.get("PET_RDZV_ENDPOINT", ""))
    return Step(job, directory, directory.node(job.node_id), child_env, started)
