"""A hang on one node of a two-node Slurm job: how soon it is found, named and the whole job resumed, and what it cost.

    python bench/slurm.py [--rounds 2]

On the real Slurm cluster the tests use (tests/slurm/cluster.py: slurmctld and two ``slurmd -N`` nodes on this
machine, Debian's Slurm; ``bash .ci/slurm-setup.sh`` installs it), ``sbatch`` runs ``trainbox supervise`` on each
node over ``torchrun`` with one rank per node: examples/plain_pytorch.py, DDP over gloo, a checkpoint at each epoch's
end (``--checkpoint`` in the job's directory). Per round:

* **bare**: the same job with no fault: its wall time (sbatch to COMPLETED);
* **hung**: rank 1's node hangs it in epoch 1 at step ``--hang-step`` (the fault injector's ``node`` condition), with
  ``--stall-timeout``: each node's detection (the silence when its supervisor called the stall), whether the job's
  incident named the hung rank, the seconds from its last progress to both nodes' next attempt (the whole job
  restarted), the work lost (the steps between the hung rank's place and where the program says it resumed, against
  the checkpoint interval: an epoch's steps), and the wall time against the bare one.

Without trainbox the hung job waits in gloo's all-reduce until its 30-minute timeout, then fails, and a requeue
starts it over. Written to bench/results/slurm.{json,md}, with the machine and the date.
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
PROGRAM = ["--samples", "256"]
STEPS_PER_EPOCH = 8
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT")


def run_job(cluster: Cluster, folder: Path, stall_timeout: float, fault: str) -> Dict[str, Any]:
    """Submit one job and wait for it; its wall time, state and job directory."""
    supervise = ("--stall-timeout", str(stall_timeout), "--startup-timeout", "120", "--grace", "5", "--backoff", "0.5")
    script = jobs.supervised(folder, epochs=3, supervise=supervise, env={"TRAIN_FAULT": fault} if fault else {})
    text = script.read_text().replace("--samples 64", " ".join(PROGRAM))
    script.write_text(text)
    started = time.time()
    job = cluster.sbatch(script)
    fields = cluster.wait_state(job, ENDED, 900)
    return {
        "job": job,
        "state": fields.get("JobState"),
        "wall_s": round(time.time() - started, 1),
        "root": jobs.job_dir(folder, job),
    }


def work_lost(root: Path, at: Any) -> Optional[int]:
    """Steps trained again: where the hung rank was (its stall's place, ``epoch E batch B``) minus where the program
    itself says it went on from (its resume line, ``resumed from ... at epoch N``, in node 0's next attempt)."""
    place = re.search(r"epoch (\d+) batch (\d+)", str(at))
    log = RunDir(JobDir(root).node(0)).attempt_log(1).read_text(errors="replace")
    resumed = re.search(r"resumed from \S+ at epoch (\d+)", log)
    if place is None or resumed is None:
        return None
    return int(place[1]) * STEPS_PER_EPOCH + int(place[2]) - int(resumed[1]) * STEPS_PER_EPOCH


def measured(hung: Dict[str, Any]) -> Dict[str, Any]:
    """What a hung round's directories say: detection per node, the verdict, the restart, the work lost."""
    root: Path = hung["root"]
    verdict = json.loads(JobDir(root).incident.read_text())
    first = verdict.get("first_silent") or {}
    hang_ts = first.get("last_progress_ts")
    stalls, restarts = {}, []
    for node in (0, 1):
        events = jobs.events(JobDir(root).node(node))
        stall = next(e for e in events if e["event"] == "stall")
        stalls[node] = stall["silent_s"]
        restarts.append(next(e["ts"] for e in events if e["event"] == "start" and e.get("attempt") == 1))
    return {
        "detected_s": stalls,
        "named": first.get("node") == 1 and str(first.get("doing", "")).endswith("hang_sleep"),
        "why": verdict.get("why"),
        "ranks": [(r.get("node"), r.get("rank"), r.get("waiting"), r.get("doing")) for r in verdict.get("ranks", [])],
        "job_restarted_s": round(max(restarts) - hang_ts, 1) if hang_ts else None,
        "work_lost_steps": work_lost(root, first.get("at")),
        "interval_steps": STEPS_PER_EPOCH,
    }


def markdown(data: Dict[str, Any]) -> str:
    rows = data["rounds"]
    lines = [
        "# A hang on one node of a two-node Slurm job",
        "",
        f"{data['date']}, {data['machine']['cpu']} ({data['machine']['cores']} cores, load {data['load']}); "
        f"`{data['command']}`. Two `slurmd -N` nodes on this machine, one gloo rank each, examples/plain_pytorch.py "
        f"checkpointing every epoch ({STEPS_PER_EPOCH} steps), `--stall-timeout {data['stall_timeout_s']:g}`.",
        "",
        "| round | detected (node 0 / node 1) | hung rank named | last progress to whole job restarted | work lost / interval "
        "| wall: hung / bare |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for number, row in enumerate(rows):
        d = row["detected_s"]
        lines.append(
            f"| {number} | {d[0]:.1f} s / {d[1]:.1f} s | {'yes' if row['named'] else 'no'} | {row['job_restarted_s']} s "
            f"| {row['work_lost_steps']} / {row['interval_steps']} steps | {row['hung_wall_s']} / {row['bare_wall_s']} s |"
        )
    times = [r["job_restarted_s"] for r in rows if r["job_restarted_s"] is not None]
    if times:
        median = summary(times)["median"]
        lines += ["", f"Last progress to whole job restarted: median {median:.1f} s over {len(times)} round(s)."]
    lines += ["Without trainbox the job waits in gloo's all-reduce until its 30-minute timeout.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--hang-step", type=int, default=13, help="the global step of epoch 1 the hang comes at (8-15)")
    args = parser.parse_args()
    lacking = missing()
    if lacking:
        print(f"bench/slurm.py needs Slurm ({', '.join(lacking)} missing): bash .ci/slurm-setup.sh", file=sys.stderr)
        return 2
    rounds: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="slurm-", dir="/tmp") as where, running(Path(where) / "cluster") as cluster:
        for number in range(args.rounds):
            bare = run_job(cluster, Path(tempfile.mkdtemp(dir=where)), args.stall_timeout, "")
            fault = f"sleep@step,node=1,step={args.hang_step},attempt=0"
            hung = run_job(cluster, Path(tempfile.mkdtemp(dir=where)), args.stall_timeout, fault)
            row = dict(measured(hung), hung_wall_s=hung["wall_s"], bare_wall_s=bare["wall_s"])
            row.update(hung_state=hung["state"], bare_state=bare["state"])
            print(f"round {number}: {row}", flush=True)
            rounds.append(row)
    data = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "load": round(os.getloadavg()[0], 1),
        "command": "python bench/slurm.py " + " ".join(sys.argv[1:]),
        "stall_timeout_s": args.stall_timeout,
        "rounds": rounds,
    }
    print(write_results("slurm", data, markdown(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
