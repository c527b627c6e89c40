"""The supervisor against real children that hang, crash, spin and escape (train/faults.py)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import psutil
import pytest

from tests.supervised import Finished, faulty_child, start_cli, survivors, train_cli

FAST = ["--startup-timeout", "10", "--stall-timeout", "2", "--grace", "1", "--backoff", "0.1", "--quiet"]


def supervise(
    run_dir: Path,
    fault: Optional[str],
    *child_args: str,
    options: Optional[list] = None,
    extra_env: Optional[Dict[str, str]] = None,
) -> Finished:
    env = dict(extra_env or {})
    if fault:
        env["TRAIN_FAULT"] = fault
    args = ["supervise", "--run-dir", str(run_dir), *(options if options is not None else FAST), "--"]
    result = train_cli([*args, *faulty_child("--steps", "8", "--interval", "0.05", *child_args)], run_dir, env)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


@pytest.mark.parametrize(
    "kind, function",
    [
        ("sleep", "hang_sleep"),
        ("lock", "hang_lock_deadlock"),
        ("spin", "hang_spin"),
        ("fork", "hang_forked_worker"),
        ("ignore-sigterm", "hang_ignoring_sigterm"),
        ("setsid", "hang_with_setsid_grandchild"),
    ],
)
def test_hang_is_detected_diagnosed_killed_and_restarted(tmp_path: Path, kind: str, function: str) -> None:
    result = supervise(tmp_path, f"{kind}@step,step=3,attempt=0")

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["budget"] == "stall" and stall["budget_s"] == 2.0
    assert 2.0 < stall["silent_s"] < 10.0
    assert stall["last_beat"]["step"] == 3
    assert stall["survivors"] == []
    assert function in result.stacks(0)
    summary = json.loads((tmp_path / "incidents/0/summary.json").read_text())
    assert summary["budget"] == "stall" and summary["processes"] >= 1
    for name in ("processes.txt", "heartbeat.json", "output-tail.txt", "kernel.txt", "gpu.txt"):
        assert (tmp_path / "incidents/0" / name).stat().st_size > 0
    assert b"step 3" in (tmp_path / "incidents/0/output-tail.txt").read_bytes()
    assert result.of("exit")[0]["code"] == 0


def test_forked_worker_and_its_parent_both_show_in_the_report(tmp_path: Path) -> None:
    result = supervise(tmp_path, "fork@step,step=2,attempt=0")

    rows = json.loads((tmp_path / "incidents/0/processes.json").read_text())
    assert len(rows) == 2
    assert "hang_waiting_on_forked_worker" in result.stacks(0)
    assert "hang_forked_worker" in result.stacks(0)


def test_sigterm_ignoring_child_is_sigkilled_after_grace(tmp_path: Path) -> None:
    result = supervise(tmp_path, "ignore-sigterm@step,step=2,attempt=0")

    stall = result.of("stall")[0]
    assert stall["sigkilled"], "the child ignored SIGTERM, so it must have needed SIGKILL"
    assert stall["kill_s"] >= 1.0  # waited out --grace 1 before SIGKILL


def test_setsid_grandchild_is_tracked_and_killed(tmp_path: Path) -> None:
    result = supervise(tmp_path, "setsid@step,step=2,attempt=0")

    rows = json.loads((tmp_path / "incidents/0/processes.json").read_text())
    sessions = {row["sid"] for row in rows}
    assert len(rows) == 2 and len(sessions) == 2, "the grandchild left the child's session"
    assert all(not psutil.pid_exists(row["pid"]) or psutil.Process(row["pid"]).status() == "zombie" for row in rows)
    assert result.code == 0


def test_crash_once_is_restarted(tmp_path: Path) -> None:
    result = supervise(tmp_path, "crash@step,step=3,attempt=0")

    assert result.code == 0
    assert result.kinds() == ["start", "crash", "restart", "start", "exit"]
    crash = result.of("crash")[0]
    assert crash["code"] == 3 and crash["beats"] >= 1
    assert "injected crash" in " ".join(crash["last_output"])


def test_failing_at_once_twice_is_a_configuration_error(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; sys.exit('cannot open dataset: /data/missing.yaml')"]
    result = train_cli(["supervise", "--run-dir", str(tmp_path), *FAST, "--", *command], tmp_path)

    assert result.code == 3
    assert result.kinds() == ["start", "crash", "restart", "start", "crash", "give_up", "exit"]
    assert result.of("give_up")[0]["reason"] == "misconfigured"
    assert "configuration error" in result.stderr
    assert "cannot open dataset: /data/missing.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_restart_budget_spent_gives_up_with_a_summary(tmp_path: Path) -> None:
    options = [*FAST, "--max-restarts", "1"]
    result = supervise(tmp_path, "sleep@step,step=2", options=options)

    assert result.code == 1
    assert result.kinds() == ["start", "stall", "restart", "start", "stall", "give_up", "exit"]
    assert "giving up after 2 attempts" in result.stderr
    assert "incidents" in result.stderr


def test_slow_but_steady_is_not_a_stall(tmp_path: Path) -> None:
    result = supervise(
        tmp_path, None, "--steps", "8", "--interval", "1.0", options=[*FAST[:2], "--stall-timeout", "3", *FAST[4:]]
    )

    assert result.code == 0
    assert result.kinds() == ["start", "exit"]


def test_declared_slow_phase_gets_its_own_budget(tmp_path: Path) -> None:
    result = supervise(tmp_path, None, "--slow-step", "3", "--slow-seconds", "4", "--phase-timeout", "10")

    assert result.code == 0
    assert result.kinds() == ["start", "exit"]


def test_declared_phase_budget_runs_out(tmp_path: Path) -> None:
    result = supervise(
        tmp_path, None, "--slow-step", "3", "--slow-seconds", "60", "--phase-timeout", "1", options=[*FAST, "--max-restarts", "0"]
    )

    stall = result.of("stall")[0]
    assert stall["budget"] == "phase:slow" and stall["budget_s"] == 1
    assert stall["phase"] == "slow"
    assert result.code == 1


def test_silent_start_runs_out_the_startup_budget(tmp_path: Path) -> None:
    options = ["--startup-timeout", "1", "--stall-timeout", "30", "--grace", "1", "--backoff", "0.1", "--quiet"]
    result = supervise(tmp_path, None, "--silent-start", "60", options=options)

    stalls = result.of("stall")
    assert [s["budget"] for s in stalls] == ["startup", "startup"]
    assert result.code == 3, "two attempts without a single beat is a configuration error"


def test_learned_budget_tightens_detection(tmp_path: Path) -> None:
    options = [
        *FAST[:2],
        "--stall-timeout",
        "60",
        *FAST[4:],
        "--learned-min-samples",
        "5",
        "--learned-floor",
        "1",
        "--max-restarts",
        "0",
    ]
    result = supervise(tmp_path, "sleep@step,step=40", "--steps", "60", "--interval", "0.1", options=options)

    stall = result.of("stall")[0]
    assert stall["budget"] == "learned:train"
    assert 1.0 <= stall["budget_s"] < 60
    assert stall["learned"]["train"] == stall["budget_s"]
    assert stall["silent_s"] < 10


def test_sigterm_to_the_supervisor_stops_the_whole_tree(tmp_path: Path) -> None:
    options = [*FAST[:2], "--stall-timeout", "60", "--grace", "1", "--quiet"]
    args = ["supervise", "--run-dir", str(tmp_path), *options, "--", *faulty_child()]
    proc = start_cli(args, {"TRAIN_FAULT": "setsid@step,step=2"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(survivors(tmp_path)) < 2:
        time.sleep(0.1)
    assert len(survivors(tmp_path)) == 2, "child and setsid grandchild should be running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not survivors(tmp_path)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "exit"]
    assert events[-1]["reason"] == "stopped by signal"


def test_health_follows_the_run(tmp_path: Path) -> None:
    child = faulty_child("--steps", "100", "--interval", "0.05")
    proc = start_cli(["supervise", "--run-dir", str(tmp_path), *FAST, "--", *child])
    try:
        deadline = time.monotonic() + 30
        health = train_cli(["health", "--run-dir", str(tmp_path)], tmp_path)
        while time.monotonic() < deadline and not health.stdout.startswith("healthy: running"):
            time.sleep(0.1)
            health = train_cli(["health", "--run-dir", str(tmp_path)], tmp_path)
        assert health.code == 0, health.stdout
        assert health.stdout.startswith("healthy: running, attempt 0, phase train"), health.stdout
    finally:
        proc.wait(timeout=60)
    assert train_cli(["health", "--run-dir", str(tmp_path)], tmp_path).stdout == "healthy: training completed\n"
    assert train_cli(["health", "--run-dir", str(tmp_path / "nothing")]).code == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["supervise", "--"], "no command to supervise"),
        (["supervise", "--stall-timeout", "soon", "--", "true"], "expected a number"),
        (["supervise", "--grace", "-1", "--", "true"], "--grace: must be a finite number >= 0"),
        (["bogus"], "invalid choice"),
        (["demo-data", "/proc/no-such-dir/demo"], "cannot write the demo dataset"),
        (["supervise", "--", "/nonexistent/trainer"], None),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list, message: Optional[str]) -> None:
    if args[-1] == "/nonexistent/trainer":
        args = ["supervise", "--run-dir", str(tmp_path), *FAST, "--", "/nonexistent/trainer"]
    result = train_cli(args, tmp_path)
    assert result.code != 0
    assert "Traceback" not in result.stderr
    if message is not None:
        assert result.code == 2
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message in result.stderr
