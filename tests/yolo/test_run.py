"""End to end through ``python -m trainbox run``: hangs and kills on attempt 0, resumed to the last epoch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

from tests.supervised import Finished, survivors, train_cli
from tests.yolo.conftest import TINY, ChildRun, load_checkpoint

BUDGETS = ("--stall-timeout", "10", "--startup-timeout", "120", "--backoff", "0.5")
#: The hangs below are also judged by what the silent tree does (tests/supervise/stalls/test_stalls.py has the rules one by one).
#: A budget far beyond the idle timeout: what ends the silence is idleness (later options win).
IDLE = ("--idle-timeout", "6", "--stall-timeout", "120")


def _run(run_dir: Path, profile: str, fault: str, demo_data: Path, *options: str) -> Finished:
    args: List[str] = ["run", "--profile", profile, "--run-dir", str(run_dir), *BUDGETS, *options]
    args += [f"data={demo_data}", "epochs=3", *TINY]
    return train_cli(args, run_dir=run_dir, env={"TRAIN_FAULT": fault}, timeout=480)


def _assert_completed_every_epoch(done: Finished) -> None:
    output = done.stdout + done.stderr
    assert done.code == 0, output[-4000:]
    assert done.kinds()[-1] == "exit" and done.of("exit")[-1]["attempt"] == 1
    child = ChildRun(done.code, output, done.run_dir)
    assert "Resuming training" in output and "from epoch 2 to 3 total epochs" in output
    assert child.results_epochs() == [1, 2, 3]
    final = load_checkpoint(child.last)
    assert final["epoch"] == -1 and final["optimizer"] is None
    assert not (done.run_dir / "network.log").exists()
    assert survivors(done.run_dir) == []


def test_worker_hang_after_first_checkpoint_falls_back_and_resumes(tmp_path: Path, demo_data: Path) -> None:
    # The old rule, one stall one rung down: what is tested here is the fallback's settings and the resume (the cost
    # policy's choice, on this short run, depends on the machine's speed: tests/supervise/ladder/test_run.py).
    done = _run(tmp_path / "run", "fast", "sleep@worker,attempt=0,train=1,epoch>=2", demo_data, "--ladder-policy", "down")
    _assert_completed_every_epoch(done)
    starts = done.of("start")
    assert [(s["attempt"], s["profile"]) for s in starts] == [(0, "fast"), (1, "balanced")]
    (stall,) = done.of("stall")
    assert stall["attempt"] == 0 and stall["budget"] == "stall"
    assert stall["cause"] == "loader_deadlock", stall["evidence"]
    (restart,) = done.of("restart")
    assert (restart["retry"], restart["reason"]) == ("ladder", "loader_deadlock: down the ladder to balanced")
    assert stall["last_beat"]["phase"] == "train" and stall["last_beat"]["epoch"] == 2
    assert stall["last_beat"]["saved_epoch"] == 1
    output = done.stdout + done.stderr
    resumed_at = output.index("Resuming training")
    assert "Using 4 dataloader workers" in output[:resumed_at]  # fast, on CPU where Ultralytics would use 0
    assert "Using 2 dataloader workers" in output[resumed_at:]  # balanced, applied on the resumed attempt
    said = re.findall(r"trainbox: trained with amp=(\w+), workers=(\d+), .* \(decided by profile (\S+) for CPU", output)
    assert said == [("False", "4", "fast"), ("False", "2", "balanced")], "what each attempt trained with, once"
    stacks = done.stacks(0)
    assert "hang_sleep" in stacks and "__getitem__" in stacks and "_worker_loop" in stacks


def test_hang_right_after_validation_resumes_from_last_checkpoint(tmp_path: Path, demo_data: Path) -> None:
    done = _run(tmp_path / "run", "safe", "sleep@val_end,attempt=0,epoch=2", demo_data, *IDLE)
    _assert_completed_every_epoch(done)
    (stall,) = done.of("stall")
    assert stall["last_beat"]["phase"] == "train"  # validation ended: the stall budget, not val_timeout
    assert (stall["rule"], stall["cause"]) == ("idle", "idle"), "found by idleness, long before the 120 s budget"
    assert stall["silent_s"] < 60 and done.of("restart")[0]["reason"] == "idle: safe again: no rung left below it"
    assert stall["last_beat"]["epoch"] == 2 and stall["last_beat"]["saved_epoch"] == 1
    assert "hang_sleep" in done.stacks(0) and "validate" in done.stacks(0)
    assert [s["profile"] for s in done.of("start")] == ["safe", "safe"]


def test_sigkill_during_checkpoint_save_resumes_from_previous_one(tmp_path: Path, demo_data: Path) -> None:
    done = _run(tmp_path / "run", "safe", "sigkill@save,attempt=0,epoch=2", demo_data)
    _assert_completed_every_epoch(done)
    (crash,) = done.of("crash")
    assert crash["attempt"] == 0 and crash["last_beat"]["phase"] == "save"
    assert done.of("stall") == []


def test_random_worker_hangs_on_fast_alone_are_weighed_by_the_cost_policy_and_the_run_finishes(
    tmp_path: Path, demo_data: Path
) -> None:
    """Issue 30 end to end on Ultralytics: fast's workers 2 and 3 hang at random (``chance``, seeded); balanced has
    two workers and safe none, so they never do. Which rung finishes first depends on this machine's speeds: the test
    checks that every ladder stall was weighed by the cost policy and the run trained every epoch."""
    run_dir = tmp_path / "run"
    args = ["run", "--profile", "fast", "--run-dir", str(run_dir), *BUDGETS, f"data={demo_data}", "epochs=3", *TINY]
    fault = {"TRAIN_FAULT": "sleep@worker,train=1,worker>=2,chance=3", "TRAIN_FAULT_SEED": "1"}
    done = train_cli(args, run_dir=run_dir, env=fault, timeout=480)
    output = done.stdout + done.stderr
    assert done.code == 0, output[-4000:]
    assert ChildRun(done.code, output, run_dir).results_epochs() == [1, 2, 3]
    decisions = done.cost_decisions("fast")
    assert survivors(run_dir) == []
    print(f"random worker hangs: {[(d['kind'], d['reason']) for d in decisions]}")
