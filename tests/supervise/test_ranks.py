"""torchrun jobs under the supervisor: every rank beats, a silent rank is a stall, a failed rank is named.

Real torchrun (``python -m torch.distributed.run``) with 2 ranks on the CPU and
gloo, faults from train/faults.py armed for one rank (``rank=1``): the beating child of
train/faults.py, and examples/plain_pytorch.py training with DDP (marked ``training``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.supervised import MEASUREMENTS, REPO, Finished, faulty_child, read_events, start_cli, survivors, train_cli
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.supervise import ranks
from trainbox.supervise.stalls.budgets import BudgetPolicy

#: torchrun, as the console script runs it (the console script of this venv's torch).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
EXAMPLE = str(REPO / "examples" / "plain_pytorch.py")
#: 4 batches per rank and epoch, no DataLoader workers: a DDP epoch takes about a second.
TINY = ["--samples", "64", "--batch", "8", "--workers", "0"]


#: Stall budget of the tests whose fault is a crash, not a hang: only a loaded machine's pauses between steps
#: (two ranks importing torch and joining their process group on CI's shared cores) could reach it.
CRASH_ONLY_STALL_S = 30


def supervise(run_dir: Path, command: List[str], fault: str, stall_timeout: float = 5) -> Finished:
    options = ["--startup-timeout", "90", "--stall-timeout", str(stall_timeout), "--grace", "5", "--backoff", "0.5"]
    args = ["supervise", "--run-dir", str(run_dir), *options, "--quiet", "--", *command]
    result = train_cli(args, run_dir, {"TRAIN_FAULT": fault})
    assert not survivors(run_dir), f"processes of the job outlived it: {survivors(run_dir)}"
    return result


def rank_pids(stall: Dict[str, object]) -> Dict[int, int]:
    """Each rank's pid, from the incident's per-rank last beats."""
    summary = json.loads((Path(str(stall["incident"])) / "summary.json").read_text())
    return {int(rank): entry["last_beat"]["pid"] for rank, entry in summary["ranks"].items() if entry["last_beat"]}


def write_beat(run: RunDir, rank: int, pid: int, step: int) -> None:
    """What ``beat()`` writes for ``rank`` of a node of 2 ranks."""
    path = run.rank_heartbeat(rank)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "local_rank": rank % 2, "local_world_size": 2, "pid": pid, "step": step, "ts": 0}))


def ended_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_the_slowest_rank_decides_and_ended_ranks_are_left_out(tmp_path: Path) -> None:
    run, alive = RunDir(tmp_path), os.getpid()
    beats = ranks.JobBeats(run, BudgetPolicy(startup_s=100, stall_s=10, factor=0, floor_s=1, min_samples=20), started=0.0)
    assert [(s.rank, s.budget.name) for s in beats.standings(1.0)] == [(None, "startup")], "no rank yet: the one process"

    write_beat(run, 0, alive, step=1)
    assert [(p.record["step"], p.previous, p.silent_s) for p in beats.poll(1.0)] == [(1, None, 1.0)]
    assert [(s.rank, s.budget.name, s.silent_s) for s in beats.standings(5.0)] == [(0, "stall", 4.0), (1, "startup", 5.0)]
    write_beat(run, 1, alive, step=1)
    beats.poll(6.0)
    write_beat(run, 0, alive, step=2)
    assert [(p.record["step"], p.previous["step"], p.silent_s) for p in beats.poll(15.0)] == [(2, 1, 14.0)]
    assert beats.poll(16.0) == [], "nothing new"
    slowest = beats.lagging(17.0)
    assert (slowest.rank, slowest.silent_s, slowest.budget.name) == (1, 11.0, "stall")
    assert beats.report(17.0)["silent_ranks"] == [1]

    write_beat(run, 1, ended_pid(), step=3)  # rank 1 finished; rank 0 goes on (validating alone, say)
    beats.poll(18.0)
    assert [s.rank for s in beats.standings(18.0)] == [0]
    write_beat(run, 0, ended_pid(), step=3)  # now both: torchrun is restarting the node's ranks
    beats.poll(20.0)
    assert [(s.rank, s.budget.name, s.silent_s) for s in beats.standings(30.0)] == [(0, "startup", 10.0), (1, "startup", 10.0)]

    write_beat(run, 2, alive, step=3)  # the next rendezvous round numbered this node's ranks 2 and 3
    beats.poll(31.0)
    assert [(s.rank, s.budget.name) for s in beats.standings(32.0)] == [(2, "stall"), (3, "startup")]

    run.rank_heartbeat(7).write_text(json.dumps({"rank": "7", "pid": alive}))  # garbage: no rank's beat
    run.rank_heartbeat(8).write_text(json.dumps({"rank": 8, "local_rank": "x", "local_world_size": None, "pid": alive}))
    beats.poll(33.0)
    assert [s.rank for s in beats.standings(33.0)] == [2, 3, 8], "a beat without a node's shape is still that rank's"


def test_one_silent_rank_is_a_stall_while_the_other_beats(tmp_path: Path) -> None:
    beating = faulty_child("--steps", "100", "--interval", "0.1")[1:]  # rank 0 beats for 10 s, well past the budget
    result = supervise(tmp_path, [*TORCHRUN, "--nproc-per-node", "2", *beating], "sleep@step,rank=1,step=5,attempt=0", 3)

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["silent_ranks"] == [1], "rank 0 kept beating: only rank 1 is silent"
    assert stall["silent_s"] < stall["budget_s"] + 2, "found within its budget (and one poll)"
    assert stall["last_beat"]["rank"] == 1 and stall["last_beat"]["step"] == 5
    summary = json.loads((result.incident() / "summary.json").read_text())
    assert summary["silent_ranks"] == [1] and set(summary["ranks"]) == {"0", "1"}
    assert summary["ranks"]["0"]["last_beat"]["step"] > 5, "each rank's last beat"
    pids = rank_pids(stall)
    stacks = {pid: (result.incident() / "stacks" / f"{pid}.txt").read_text() for pid in pids.values()}
    assert "hang_sleep" in stacks[pids[1]] and "hang_sleep" not in stacks[pids[0]]


def test_a_ranks_setsid_child_ends_with_the_job(tmp_path: Path) -> None:
    """torchrun ends a rank with killpg; the rank's child in its own session is ended by the supervisor."""
    beating = faulty_child("--steps", "100", "--interval", "0.1")[1:]
    result = supervise(tmp_path, [*TORCHRUN, "--nproc-per-node", "2", *beating], "setsid@step,rank=1,step=5,attempt=0", 3)

    assert result.code == 0, result.stderr
    stall = result.of("stall")[0]
    assert stall["silent_ranks"] == [1]
    processes = json.loads((result.incident() / "processes.json").read_text())
    rank = rank_pids(stall)[1]
    escaped = [p for p in processes if p["ppid"] == rank and p["sid"] != next(q["sid"] for q in processes if q["pid"] == rank)]
    assert len(escaped) == 1, "the rank's child left its session"
    assert "hang_with_setsid_grandchild" in (result.incident() / "stacks" / f"{rank}.txt").read_text()


def test_a_multi_node_job_without_local_world_size_follows_its_own_ranks(tmp_path: Path) -> None:
    """Issue 33 item 9: DeepSpeed's multi-node launcher and hand-written SLURM scripts set RANK, LOCAL_RANK and
    WORLD_SIZE but no LOCAL_WORLD_SIZE; taking WORLD_SIZE for it had each node wait for the other node's ranks and
    kill its healthy one at the startup budget. Here a 2-rank job, one rank per node, each node its own supervisor,
    as such a launcher starts it: both run to the end, no stall."""
    nodes = []
    for rank in (0, 1):
        run_dir = tmp_path / f"node{rank}"
        options = ["--startup-timeout", "3", "--stall-timeout", "10", "--grace", "1", "--quiet"]
        child = faulty_child("--steps", "60", "--interval", "0.1")
        env = {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
        nodes.append((run_dir, start_cli(["supervise", "--run-dir", str(run_dir), *options, "--", *child], env)))
    try:
        codes = [proc.wait(timeout=120) for _, proc in nodes]
    finally:
        for _, proc in nodes:
            proc.kill()
    for (run_dir, _), code in zip(nodes, codes):
        kinds = [e["event"] for e in read_events(run_dir)]
        assert code == 0 and kinds == ["start", "exit"], (run_dir.name, code, kinds)
    beat = json.loads(RunDir(tmp_path / "node1").rank_heartbeat(1).read_text())
    assert (beat["rank"], beat["world_size"]) == (1, 2) and "local_world_size" not in beat, "the node's size is unknown"


def test_one_idle_rank_is_found_by_idleness_while_the_other_beats(tmp_path: Path) -> None:
    """Issue 33 item 13: the silence window was cleared whenever any rank progressed, while the silence judged is
    the slowest rank's: with rank 0 beating every 0.3 s, rank 1's idleness was never seen and the budget (30 s)
    decided. Now the window is that rank's silence: --idle-timeout 4 finds it."""
    beating = faulty_child("--steps", "200", "--interval", "0.3")[1:]
    options = ["--startup-timeout", "90", "--stall-timeout", "30", "--idle-timeout", "4", "--grace", "2", "--max-restarts", "0"]
    args = ["supervise", "--run-dir", str(tmp_path), *options, "--quiet", "--"]
    result = train_cli(
        [*args, *TORCHRUN, "--nproc-per-node", "2", *beating], tmp_path, {"TRAIN_FAULT": "sleep@step,rank=1,step=5"}
    )
    assert not survivors(tmp_path)
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["cause"]) == ("idle", "idle"), (stall["rule"], stall["silent_s"], stall["evidence"])
    assert stall["silent_s"] < 20, "found by idleness, long before the 30 s budget"
    assert (stall["last_beat"]["rank"], stall["last_beat"]["step"]) == (1, 5), "rank 1's silence was judged"
    beaten = json.loads((result.incident() / "summary.json").read_text())["ranks"]["0"]["last_beat"]
    assert beaten["step"] > 5, "while rank 0 went on beating"


@pytest.mark.training  # the example trains with torch (DDP, gloo)
def test_a_ddp_rank_that_hangs_ends_the_whole_job_which_resumes_on_every_rank(tmp_path: Path) -> None:
    """Run as node 0 of a job (its run directory ``<job>/node-0/`` beside ``job.json``), so the job's incident is made
    from this real report too: it names rank 1, the one rank 0 waits for."""
    job = JobDir(tmp_path)
    job.job.write_text(json.dumps({"job_id": "test", "nodes": ["localhost"]}))
    run_dir = job.node(0)
    command = [*TORCHRUN, "--nproc-per-node", "2", EXAMPLE, *TINY, "--epochs", "2"]
    result = supervise(run_dir, command, "sleep@step,rank=1,epoch=1,attempt=0")

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    # Rank 0 waits for rank 1 in DDP's gradient all-reduce, so it goes silent too: both may be past their budget.
    assert 1 in stall["silent_ranks"], stall
    assert stall["silent_s"] < stall["budget_s"] + 2
    pids = rank_pids(stall)
    assert set(pids) == {0, 1}
    stacks = {rank: (result.incident() / "stacks" / f"{pid}.txt").read_text() for rank, pid in pids.items()}
    assert "hang_sleep" in stacks[1], "the hung rank, in user code"
    assert "hang_sleep" not in stacks[0] and "backward" in stacks[0], "the other rank, waiting for it in backward's all-reduce"
    processes = json.loads((result.incident() / "processes.json").read_text())
    assert len(processes) == 3, "the torchrun agent and both ranks"
    assert {row.get("rank") for row in processes} == {None, 0, 1}, "each rank's process says which rank it is"
    verdict = json.loads(job.incident.read_text())
    assert (verdict["first_silent"]["node"], verdict["first_silent"]["rank"]) == (0, 1), verdict
    assert verdict["first_silent"]["doing"].endswith("hang_sleep") and verdict["first_silent"]["waiting"] is False
    assert [r["waiting"] for r in verdict["ranks"]] == [True, False], "rank 0 waits for rank 1"
    assert "rank 1 on node 0 stopped" in result.stderr + result.stdout
    resumed = RunDir(run_dir).attempt_log(1).read_text()
    assert resumed.count(f"resumed from {run_dir / 'plain.pt'} at epoch 1") == 2, "every rank resumed from the checkpoint"
    assert resumed.count("epoch 1 loss") == 2


@pytest.mark.training  # the example trains with torch (DDP, gloo)
def test_a_rank_that_raises_is_named_in_the_crash_event(tmp_path: Path) -> None:
    command = [*TORCHRUN, "--nproc-per-node", "2", EXAMPLE, *TINY, "--epochs", "1"]
    result = supervise(tmp_path, command, "raise@step,rank=1,step=2,attempt=0", CRASH_ONLY_STALL_S)

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "crash", "restart", "start", "exit"]
    crash = result.of("crash")[0]
    assert crash["code"] == 1, "torchrun's own status when a rank failed"
    failure = crash["rank_failure"]
    assert failure["rank"] == 1 and failure["error"] == "RuntimeError: trainbox fault: injected exception", failure
    if "exitcode" in failure:  # torchrun's summary; without it torchrun failed itself (see ranks.failure)
        assert failure["local_rank"] == 1 and failure["exitcode"] == 1, failure
    assert RunDir(tmp_path).rank_error(0).exists()


def test_a_torchrun_that_failed_itself_still_names_the_rank_from_its_traceback() -> None:
    """Recorded here under load (the test above, one run in many): rank 1 raised, torchrun ended rank 0 and then read
    rank 0's error file while it was still empty, raised JSONDecodeError and printed no summary; its error file holds
    that JSONDecodeError. The rank and its exception are the ones its traceback in the output names."""
    recorded = REPO / "tests" / "fixtures" / "torchrun" / "failed_itself"
    output = (recorded / "output.log").read_text()
    assert "Root Cause" not in output and "JSONDecodeError" in (recorded / "torchrun-error.json").read_text()
    found = ranks.failure(recorded / "torchrun-error.json", output)
    assert found == {"rank": 1, "error": "RuntimeError: trainbox fault: injected exception"}


@pytest.mark.parametrize("kind, exitcode", [("crash", 3), ("sigkill", -9)])
def test_a_rank_that_exits_without_record_is_named_by_its_exit_code(tmp_path: Path, kind: str, exitcode: int) -> None:
    beating = faulty_child("--steps", "30", "--interval", "0.05")[1:]
    result = supervise(
        tmp_path, [*TORCHRUN, "--nproc-per-node", "2", *beating], f"{kind}@step,rank=0,step=3,attempt=0", CRASH_ONLY_STALL_S
    )

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "crash", "restart", "start", "exit"]
    failure = result.of("crash")[0]["rank_failure"]
    assert failure == {"rank": 0, "local_rank": 0, "exitcode": exitcode, "error": None}, failure


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.training  # the example trains with torch (DDP, gloo)
def test_two_nodes_one_stalls_and_restarts_and_the_other_rejoins(tmp_path: Path) -> None:
    """Two "nodes" on this machine: a supervisor each, one rank each, rendezvous on 127.0.0.1, gloo.

    Node b hosts the rendezvous store (``is_host=1``); node a's rank hangs in
    epoch 1. Node a's supervisor ends its torchrun and restarts it; node b's
    rank loses its peer, and node b's agent (``--max-restarts``) restarts it into
    the new rendezvous round. Both resume from the one checkpoint and finish.
    """
    shared = tmp_path / "shared" / "plain.pt"
    shared.parent.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"

    def node(name: str, host: int, stall_timeout: int, fault: str) -> Tuple[Path, subprocess.Popen]:
        run_dir = tmp_path / name
        torchrun = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
        torchrun += ["--rdzv-id", "two-nodes", "--rdzv-conf", f"is_host={host}", "--max-restarts", "3"]
        options = ["--startup-timeout", "120", "--stall-timeout", str(stall_timeout), "--grace", "5", "--backoff", "0.5"]
        args = ["supervise", "--run-dir", str(run_dir), *options, "--quiet", "--", *torchrun]
        example = [EXAMPLE, *TINY, "--epochs", "2", "--checkpoint", str(shared)]
        return run_dir, start_cli([*args, *example], {"TRAIN_FAULT": fault} if fault else None, stderr=subprocess.PIPE)

    b_dir, b = node("b", 1, 60, "")  # a budget node a's restart fits in: node b must not restart itself
    a_dir, a = node("a", 0, 5, "sleep@step,epoch=1,attempt=0")
    try:
        for proc in (a, b):
            assert proc.wait(timeout=300) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        for proc in (a, b):
            proc.kill()
    a_kinds, b_kinds = ([e["event"] for e in read_events(d) if e["event"] not in MEASUREMENTS] for d in (a_dir, b_dir))
    assert a_kinds == ["start", "stall", "restart", "start", "exit"]
    assert b_kinds == ["start", "exit"], "node b's supervisor restarted nothing"
    b_log = RunDir(b_dir).attempt_log(0).read_text()
    assert f"resumed from {shared} at epoch 1" in b_log, "node b's rank was restarted by its agent, from the checkpoint"
    assert f"resumed from {shared} at epoch 1" in RunDir(a_dir).attempt_log(1).read_text()
    assert torch_load_epoch(shared) == 1, "the job finished its 2 epochs"
    assert not survivors(a_dir) and not survivors(b_dir)


def torch_load_epoch(checkpoint: Path) -> int:
    import torch

    return int(torch.load(checkpoint, weights_only=True)["epoch"])
