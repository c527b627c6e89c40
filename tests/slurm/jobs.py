"""The sbatch scripts the end-to-end tests submit: trainbox supervise on every node of a two-node torchrun job.

The program is examples/plain_pytorch.py as a user runs it (DDP over gloo on the CPU, a checkpoint each epoch), with
one rank per node, its checkpoint in the job's directory (the one file every node sees) and a few small epochs. The
script says srun's status and, as the documented sbatch file does, requeues the job on the statuses a requeue may
help (examples/slurm/train.sbatch).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from tests.paths import REPO

EXAMPLE = REPO / "examples" / "plain_pytorch.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def supervised(
    folder: Path,
    epochs: int = 2,
    samples: int = 64,
    supervise: Sequence[str] = ("--stall-timeout", "60"),
    program: Sequence[str] = (),
    sbatch: Sequence[str] = ("--nodes=2",),
    env: Mapping[str, str] = {},
) -> Path:
    """Write ``folder/job.sh``: the supervised job, run in ``folder`` (its runs/ is the job's)."""
    command = [sys.executable, "-m", "trainbox", "supervise", *supervise, "--"]
    command += [TORCHRUN, "--nnodes", "$SLURM_NNODES", "--nproc-per-node", "1", "--max-restarts", "3", str(EXAMPLE)]
    command += ["--epochs", str(epochs), "--samples", str(samples), "--batch", "16", "--workers", "0"]
    command += ["--checkpoint", "runs/plain_pytorch-$SLURM_JOB_ID/plain.pt", *program]
    words = " ".join(w if w.startswith(("$", "runs/")) else shlex.quote(w) for w in command)
    script = folder / "job.sh"
    header = "".join(f"#SBATCH {option}\n" for option in (*sbatch, f"--output={folder}/slurm-%j.out", "--open-mode=append"))
    header += "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    script.write_text(
        f"#!/bin/bash\n{header}cd {shlex.quote(str(folder))}\n"
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {words}\n"
        'status=$?\necho "srun: $status (restart ${SLURM_RESTART_COUNT:-0})"\n'
        'case "$status" in 5|6|75) scontrol requeue "$SLURM_JOB_ID" ;; esac\n'
        'exit "$status"\n'
    )
    return script


def job_dir(folder: Path, job_id: str) -> Path:
    return folder / "runs" / f"plain_pytorch-{job_id}"


def events(run_dir: Path) -> List[Dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kinds(run_dir: Path) -> List[str]:
    return [record["event"] for record in events(run_dir)]


def output(folder: Path, job_id: str) -> str:
    path = folder / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""
