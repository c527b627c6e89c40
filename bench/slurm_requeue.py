"""A two-node Slurm job stopped mid-epoch and requeued: with Slurm's warning, and with a plain ``scontrol requeue``.

    python bench/slurm_requeue.py [--rounds 2]

On the real Slurm cluster the tests use (tests/slurm/cluster.py; ``bash .ci/slurm-setup.sh`` installs Slurm),
``sbatch`` runs ``trainbox supervise`` on each node over ``torchrun`` (examples/plain_pytorch.py, one gloo rank per
node, a checkpoint at each epoch's end, in the job's directory; the batch script of tests/slurm/jobs.py, which
requeues on status 75). Each round stops the job in the middle of its second epoch twice, in two jobs:

* **warned**: SIGUSR2 to the job's steps, what ``sbatch --signal=USR2@T`` sends T seconds before the time limit:
  the supervisors stop at the next checkpoint, exit 75, and the script requeues the job;
* **requeued**: ``scontrol requeue``, what a requeue by hand (or a preemption) does: SIGTERM at once.

For each: the seconds from the stop's start until both nodes' supervisors ended, and until the requeued job's first
attempt started; the work lost (the steps between where rank 0 was stopped and where the program says it went on
from) against the checkpoint interval (an epoch's steps). Written to bench/results/slurm_requeue.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from common import REPO, machine, summary, write_results

sys.path.insert(0, str(REPO))
from tests.slurm import jobs  # noqa: E402
from tests.slurm.cluster import Cluster, missing, running  # noqa: E402
from trainbox.rundir.layout import JobDir, RunDir  # noqa: E402

#: 256 samples, batches of 16, two ranks: 8 steps per rank and epoch, the checkpoint interval.
SAMPLES, STEPS_PER_EPOCH, EPOCHS = 256, 8, 5
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")
#: Where the stop comes: this many steps into the second epoch (of STEPS_PER_EPOCH).
INTO_EPOCH = 3


def wait_for(ready: Any, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not get there")
        time.sleep(0.2)


def beat_of(root: Path) -> Dict[str, Any]:
    try:
        state = json.loads(RunDir(JobDir(root).node(0)).state.read_text())
    except (OSError, ValueError):
        return {}
    return state.get("heartbeat") or {}


def ends(root: Path, after: float) -> List[float]:
    """When each node's supervisor wrote its ``exit`` event after ``after``."""
    found = []
    for node in (0, 1):
        times = [e["ts"] for e in jobs.events(JobDir(root).node(node)) if e["event"] == "exit" and e["ts"] > after]
        found += times[:1]
    return found


def one(cluster: Cluster, folder: Path, how: str) -> Dict[str, Any]:
    job = cluster.sbatch(jobs.supervised(folder, epochs=EPOCHS, samples=SAMPLES, supervise=("--stall-timeout", "120")))
    root = jobs.job_dir(folder, job)
    wait_for(lambda: beat_of(root).get("epoch") == 1 and (beat_of(root).get("batch") or 0) >= INTO_EPOCH)
    stopped_at = time.time()
    if how == "warned":
        cluster.scancel("--signal=USR2", job)
    else:
        cluster.scontrol("requeue", job)
    wait_for(lambda: len(ends(root, stopped_at)) == 2)
    ended = max(ends(root, stopped_at))
    fields = cluster.wait_state(job, ENDED, 900)
    starts = [e["ts"] for e in jobs.events(JobDir(root).node(0)) if e["event"] == "start" and e["ts"] > stopped_at]
    return {
        "how": how,
        "state": fields.get("JobState"),
        "restarts": fields.get("Restarts"),
        "stopped_s": round(ended - stopped_at, 1),
        "back_s": round(starts[0] - stopped_at, 1) if starts else None,
        "work_lost_steps": work_lost(jobs.output(folder, job)),
    }


def work_lost(out: str) -> Optional[int]:
    """Steps trained again: where node 0's rank was stopped (the supervisor's stop line) minus where the requeued
    program went on from (its last ``resumed from ... at epoch N``)."""
    place = re.search(r"node-0 is at phase train, epoch (\d+) batch (\d+)", out)
    resumed = re.findall(r"resumed from \S+ at epoch (\d+)", out)
    if place is None or not resumed:
        return None
    return int(place[1]) * STEPS_PER_EPOCH + int(place[2]) - int(resumed[-1]) * STEPS_PER_EPOCH


def markdown(data: Dict[str, Any]) -> str:
    lines = [
        "# A two-node Slurm job stopped mid-epoch and requeued",
        "",
        f"{data['date']}, {data['machine']['cpu']} ({data['machine']['cores']} cores, load {data['load']}); "
        f"`{data['command']}`. Two `slurmd -N` nodes on this machine, one gloo rank each, examples/plain_pytorch.py "
        f"checkpointing every epoch ({STEPS_PER_EPOCH} steps); the stop comes {INTO_EPOCH} steps into epoch 1. "
        "warned: SIGUSR2 as `sbatch --signal=USR2@T` sends it; requeued: `scontrol requeue`.",
        "",
        "| round | how | job | stop to both supervisors ended | stop to the requeued job's start | work lost / interval |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for number, row in enumerate(data["rounds"]):
        lines.append(
            f"| {number // 2} | {row['how']} | {row['state']}, {row['restarts']} requeue | {row['stopped_s']} s "
            f"| {row['back_s']} s | {row['work_lost_steps']} / {STEPS_PER_EPOCH} steps |"
        )
    for how in ("warned", "requeued"):
        lost = [r["work_lost_steps"] for r in data["rounds"] if r["how"] == how and r["work_lost_steps"] is not None]
        if lost:
            lines.append(f"\n{how}: work lost median {summary(lost)['median']:g} steps of {STEPS_PER_EPOCH}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    lacking = missing()
    if lacking:
        print(f"bench/slurm_requeue.py needs Slurm ({', '.join(lacking)} missing): bash .ci/slurm-setup.sh", file=sys.stderr)
        return 2
    rounds: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="slurm-", dir="/tmp") as where, running(Path(where) / "cluster") as cluster:
        for number in range(args.rounds):
            for how in ("warned", "requeued"):
                row = one(cluster, Path(tempfile.mkdtemp(dir=where)), how)
                print(f"round {number}: {row}", flush=True)
                rounds.append(row)
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "load": round(os.getloadavg()[0], 1),
        "command": "python bench/slurm_requeue.py " + " ".join(sys.argv[1:]),
        "rounds": rounds,
    }
    print(write_results("slurm_requeue", data, markdown(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
