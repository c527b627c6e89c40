"""The supervisor against real children that hang, crash, spin and escape (train/faults.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import psutil
import pytest

from tests.supervised import (
    REPO,
    Finished,
    cli_env,
    faulty_child,
    fill,
    freeze,
    freezer_cgroup,
    read_events,
    small_disk,
    start_cli,
    survivors,
    train_cli,
    wait_for,
)
from trainbox.errors import ExitCode

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
    assert function in result.stacks()
    summary = json.loads((result.incident() / "summary.json").read_text())
    assert summary["budget"] == "stall" and summary["processes"] >= 1
    for name in ("processes.txt", "heartbeat.json", "output-tail.txt", "kernel.txt", "gpu.txt"):
        assert (result.incident() / name).stat().st_size > 0
    assert b"step 3" in (result.incident() / "output-tail.txt").read_bytes()
    assert result.of("exit")[0]["code"] == 0


def test_forked_worker_and_its_parent_both_show_in_the_report(tmp_path: Path) -> None:
    result = supervise(tmp_path, "fork@step,step=2,attempt=0")

    rows = json.loads((result.incident() / "processes.json").read_text())
    assert len(rows) == 2
    assert "hang_waiting_on_forked_worker" in result.stacks()
    assert "hang_forked_worker" in result.stacks()


def test_sigterm_ignoring_child_is_sigkilled_after_grace(tmp_path: Path) -> None:
    result = supervise(tmp_path, "ignore-sigterm@step,step=2,attempt=0")

    stall = result.of("stall")[0]
    assert stall["sigkilled"], "the child ignored SIGTERM, so it must have needed SIGKILL"
    assert stall["kill_s"] >= 1.0  # waited out --grace 1 before SIGKILL


def test_setsid_grandchild_is_tracked_and_killed(tmp_path: Path) -> None:
    result = supervise(tmp_path, "setsid@step,step=2,attempt=0")

    rows = json.loads((result.incident() / "processes.json").read_text())
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


#: A child that beats the device it found (with a field that would clash with the event's own), then a few steps;
#: its first attempt crashes.
DEVICE_CHILD = """
import os, sys, time
from trainbox.heartbeat import beat
beat("setup", force=True, device={"kind": "cpu", "amp": False, "workers": 4, "event": "not mine"})
for step in range(1, 4):
    beat("train", step=step, force=True)
    time.sleep(0.2)
sys.exit(3 if os.environ["TRAIN_ATTEMPT"] == "0" else 0)
"""


def test_the_device_a_child_beats_is_recorded_once_per_attempt(tmp_path: Path) -> None:
    result = train_cli(["supervise", "--run-dir", str(tmp_path), *FAST, "--", sys.executable, "-c", DEVICE_CHILD], tmp_path)

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "device", "crash", "restart", "start", "device", "exit"]
    for attempt, device in enumerate(result.of("device")):
        assert (device["attempt"], device["kind"], device["amp"], device["workers"]) == (attempt, "cpu", False, 4)
        assert device["event"] == "device"


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

    assert result.code == ExitCode.HUNG, "a hang that came back: another machine may not have it"
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
    assert result.code == ExitCode.HUNG


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


# -- issue 19: what used to lose a healthy run, hang the supervisor or leave a trainer behind ----------------------


def _start_watched(
    run_dir: Path, *child_args: str, options: Optional[list] = None, env: Optional[Dict[str, str]] = None, stderr: Any = None
) -> Tuple[subprocess.Popen, int]:
    """Start a supervisor in the background and wait until its child has beaten; return (supervisor, child pid)."""
    args = ["supervise", "--run-dir", str(run_dir), *(options or FAST), "--", *faulty_child(*child_args)]
    proc = start_cli(args, env, stderr=stderr)
    wait_for(lambda: _state(run_dir).get("state") == "running", 30, "the child's first beat")
    return proc, read_events(run_dir)[0]["pid"]


def _state(run_dir: Path) -> Dict:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def test_closed_stdout_does_not_stall_a_chatty_run(tmp_path: Path) -> None:
    """`trainbox supervise ... | head -1`: the reader goes away, the child keeps printing and must not block."""
    options = [opt for opt in FAST if opt != "--quiet"]
    command = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(tmp_path), *options, "--"]
    command += faulty_child("--steps", "20", "--interval", "0.05", "--chatter", "20000")
    script = " ".join(shlex.quote(part) for part in command) + ' | head -1; exit "${PIPESTATUS[0]}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=cli_env(), cwd=REPO)

    finished = Finished(done.returncode, done.stdout, done.stderr, tmp_path)
    assert done.stdout == "step 0\n"
    assert finished.code == 0, finished.stderr
    assert finished.kinds() == ["start", "exit"], "a closed stdout must not turn a healthy run into a stall"
    assert b"step 19" in (tmp_path / "logs/attempt-0.log").read_bytes(), "the log keeps everything"
    assert "Traceback" not in finished.stderr


def test_child_finishing_during_its_incident_is_a_success(tmp_path: Path) -> None:
    result = supervise(tmp_path, "finish-during-incident@step,step=3,attempt=0")

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "exit"], "an exit 0 before the kill is not run again"
    assert result.of("stall")[0]["code_before_kill"] == 0
    assert result.of("exit")[0]["code"] == 0


def test_process_that_survives_sigkill_ends_the_run_in_one_line(tmp_path: Path) -> None:
    """A child frozen by the kernel (D state, as in a hung amdgpu) cannot be killed: say so and stop, never hang."""
    run_dir = tmp_path / "run"
    with freezer_cgroup(tmp_path) as group:
        stderr = tmp_path / "stderr"
        with stderr.open("w") as sink:
            proc, child = _start_watched(run_dir, "--steps", "100000", "--interval", "0.05", stderr=sink)
        try:
            freeze(group, child)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert code == ExitCode.STUCK
    events = read_events(run_dir)
    assert [e["event"] for e in events] == ["start", "stall", "give_up", "exit"]
    assert events[1]["survivors"] == [child], "the stall is recorded with the process that outlived SIGKILL"
    assert events[2]["reason"] == "process stuck in the kernel"
    [stuck] = events[2]["stuck"]
    assert stuck["pid"] == child and stuck["state"] == "D" and stuck["wchan"] not in ("", "?")
    assert events[3]["code"] == ExitCode.STUCK
    lines = stderr.read_text().strip().splitlines()
    assert lines[-1].startswith("trainbox: report: "), "the run's last line names its report"
    assert lines[-2] == (
        "trainbox: error: a process is stuck in the GPU driver (D state): reboot needed; "
        f"pid {child} ({stuck['name']}, state D, wchan {stuck['wchan']}) survived SIGKILL"
    )
    assert "Traceback" not in stderr.read_text()


def test_hung_diagnostic_tool_stays_out_of_the_next_attempt(tmp_path: Path) -> None:
    """A rocm-smi stuck in the driver (here: frozen, D state) is given up on, and is not the next attempt's process."""
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "rocm-smi"
    smi.write_text('#!/bin/sh\necho $$ > "$FREEZER/cgroup.procs"\necho FROZEN > "$FREEZER/freezer.state"\nsleep 60\n')
    smi.chmod(0o755)
    with freezer_cgroup(tmp_path) as group:
        env = {"PATH": f"{tools}:{os.environ['PATH']}", "FREEZER": str(group)}
        result = supervise(tmp_path / "run", "sleep@step,step=2,attempt=0", extra_env=env)
        frozen = (group / "cgroup.procs").read_text().split()

    assert frozen, "the fake rocm-smi froze itself"
    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    assert result.of("stall")[0]["survivors"] == []
    assert "no answer within" in (result.incident() / "gpu.txt").read_text()


def test_killed_supervisor_takes_its_child_with_it(tmp_path: Path) -> None:
    """SIGKILL (or an OOM kill) of the supervisor: the hung child, which prints nothing more, must not train on."""
    options = [*FAST[:2], "--stall-timeout", "60", *FAST[4:]]
    proc, child = _start_watched(tmp_path, "--steps", "100", options=options, env={"TRAIN_FAULT": "sleep@step,step=1"})
    try:
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: not survivors(tmp_path) and not _in_group(child), 5, "the child's group to die with its supervisor")
    finally:
        for leftover in survivors(tmp_path):
            leftover.kill()


def _in_group(pgid: int) -> List[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_sighup_stops_the_run_like_sigterm(tmp_path: Path) -> None:
    proc, _ = _start_watched(tmp_path, "--steps", "100000", "--interval", "0.05")
    proc.send_signal(signal.SIGHUP)

    assert proc.wait(timeout=30) == 128 + signal.SIGHUP
    assert not survivors(tmp_path)
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "exit"]
    assert read_events(tmp_path)[-1]["reason"] == "stopped by signal"


def test_incidents_of_an_earlier_supervision_are_kept(tmp_path: Path) -> None:
    first = supervise(tmp_path, "sleep@step,step=2,attempt=0")
    second = supervise(tmp_path, "sleep@step,step=2,attempt=0")

    assert first.code == second.code == 0
    reports = [Path(e["incident"]) for e in second.of("stall")]
    assert len(reports) == 2 and reports[0] != reports[1], "the second supervision's attempt 0 has its own report"
    for report in reports:
        assert report.parent == tmp_path / "incidents"
        assert json.loads((report / "summary.json").read_text())["attempt"] == 0


def test_full_disk_stops_the_supervisor_with_one_line(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        fill(disk)
        result = supervise(disk / "run", None)

    assert result.code == ExitCode.DISK_FULL
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("trainbox: error: ")]
    assert len(errors) == 1 and "the disk is full" in errors[0] and "No space left on device" in errors[0], result.stderr


def test_full_disk_during_a_stall_still_kills_and_restarts(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        run_dir = disk / "run"
        options = [*FAST[:6], "--backoff", "3", "--quiet"]
        proc, _ = _start_watched(
            run_dir, "--steps", "8", "--interval", "0.05", options=options, env={"TRAIN_FAULT": "sleep@step,step=0,attempt=0"}
        )
        filler = fill(disk)
        wait_for(lambda: "restart" in [e["event"] for e in read_events(run_dir)], 60, "the restart after the stall")
        filler.unlink()
        code = proc.wait(timeout=60)
        result = Finished(code, "", "", run_dir)

        assert code == 0
        assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
        stall = result.of("stall")[0]
        assert stall["incident"] is None and "No space left on device" in stall["incident_error"]
        assert list((run_dir / "incidents").iterdir()) == [], "no half-written report is left behind"
        assert not survivors(run_dir)


@pytest.mark.parametrize(
    "content", ["[]", '{"state": "dancing"}', '{"state": "running", "supervisor_pid": "abc", "updated_ts": 1}', "{}"]
)
def test_health_of_a_hand_edited_state_is_one_line(tmp_path: Path, content: str) -> None:
    (tmp_path / "state.json").write_text(content)
    health = train_cli(["health", "--run-dir", str(tmp_path)], tmp_path)

    assert health.code == 1
    assert health.stderr == ""
    assert len(health.stdout.splitlines()) == 1 and health.stdout.startswith("unhealthy: "), health.stdout


def test_state_is_refreshed_while_backing_off(tmp_path: Path) -> None:
    options = [*FAST[:6], "--backoff", "6", "--quiet"]
    proc = start_cli(
        ["supervise", "--run-dir", str(tmp_path), *options, "--", *faulty_child("--steps", "3")],
        {"TRAIN_FAULT": "sleep@step,step=1,attempt=0"},
    )
    try:
        wait_for(lambda: _state(tmp_path).get("state") == "backoff", 30, "the backoff")
        before = _state(tmp_path)["updated_ts"]
        time.sleep(2.5)
        during = _state(tmp_path)
        health = train_cli(["health", "--run-dir", str(tmp_path)], tmp_path)
    finally:
        proc.wait(timeout=60)

    assert during["state"] == "backoff" and during["updated_ts"] > before
    assert health.code == 0 and health.stdout.startswith("healthy: backoff"), health.stdout


def test_sigterm_during_an_incident_write_is_not_a_restart(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "rocm-smi"
    smi.write_text("#!/bin/sh\nexec sleep 60\n")  # a hung rocm-smi: the report waits for it (up to 10 s)
    smi.chmod(0o755)
    run_dir = tmp_path / "run"
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "TRAIN_FAULT": "sleep@step,step=2,attempt=0"}
    proc, _ = _start_watched(run_dir, "--steps", "8", "--interval", "0.05", env=env)
    wait_for(lambda: _state(run_dir).get("state") == "stalled", 30, "the stall")
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert [e["event"] for e in read_events(run_dir)] == ["start", "stall", "exit"]
    assert not survivors(run_dir)


#: A tqdm bar: redrawn with "\r", never ended with a newline while it runs.
BAR = """\
import time
from tqdm import tqdm
for step in tqdm(range(100_000)):
    time.sleep(0.02)
"""


def _published_step(run_dir: Path) -> int:
    """The step the supervisor read from the child's output, as state.json says it (0 before it says any)."""
    state = run_dir / "state.json"
    return int((json.loads(state.read_text()).get("heartbeat") or {}).get("step", 0)) if state.exists() else 0


def test_ctrl_c_says_in_one_line_of_its_own_what_it_stopped_where_the_run_is_and_how_to_go_on(tmp_path: Path) -> None:
    script = tmp_path / "bar.py"
    script.write_text(BAR)
    run_dir = tmp_path / "run"
    command = [sys.executable, str(script)]
    args = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(run_dir), "--grace", "5", "--", *command]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), cwd=REPO)
    wait_for(lambda: _published_step(run_dir) >= 5, 60, "the bar's step in state.json")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT
    assert out.endswith(b"\n") and out.count(b"\n") == 1, "the bar is ended by a newline before the stop is said"
    [line] = [line for line in err.decode().splitlines() if "Ctrl-C" in line]
    assert line.startswith(
        f"trainbox: Ctrl-C: stopping the training tree of attempt 0 (up to 5 s to exit); the run in {run_dir} is at step "
    )
    resume = shlex.split(line.split("; to go on with it: ", 1)[1])
    assert resume == ["python", "-m", "trainbox", "supervise", "--run-dir", str(run_dir), "--grace", "5", "--", *command]


#: A real tqdm bar drawn to 13/40, then the supervisor's Ctrl-C, sent at once (before its next look at the output).
CTRL_C_AFTER_BAR = """
import os, signal, time
from tqdm import tqdm
bar = tqdm(total=40, desc="Epoch 2", mininterval=0)
for _ in range(13):
    time.sleep(0.01)
    bar.update(1)
os.kill(os.getppid(), signal.SIGINT)
time.sleep(60)
"""


def test_the_ctrl_c_line_takes_the_newest_position_read_not_the_last_look_s(tmp_path: Path) -> None:
    script = tmp_path / "bar.py"
    script.write_text(CTRL_C_AFTER_BAR)
    run_dir = tmp_path / "run"
    done = train_cli(["supervise", "--run-dir", str(run_dir), "--grace", "1", "--", sys.executable, str(script)], run_dir)
    assert done.code == ExitCode.for_signal(signal.SIGINT), done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("trainbox: Ctrl-C: ")]
    assert "is at phase train, epoch 2 batch 13;" in line, line
    assert not survivors(run_dir)


def test_the_first_line_says_where_the_run_is_the_last_its_report_and_no_file_is_left_empty(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = supervise(run_dir, None)
    assert done.code == ExitCode.OK, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"trainbox: the run is in {run_dir}; to watch it: python -m trainbox status --run-dir {run_dir} --watch"
    assert lines[-1] == f"trainbox: report: {run_dir / 'report.html'} (written again by: python -m trainbox report {run_dir})"
    empty = [str(path.relative_to(run_dir)) for path in run_dir.rglob("*") if path.is_file() and path.stat().st_size == 0]
    assert empty == [] and not (run_dir / "stacks").exists(), empty
