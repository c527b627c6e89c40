"""Who watches the supervisor: ``health``'s decision (a pure function, milliseconds) and ``health --act`` on real
supervisors (SIGSTOPped, blocked in a wait(), merely busy), and the give-up after hangs in a row.

The same in a container, with Docker's restart and ``invoke train`` following it: tests/container/test_watchdog.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import psutil
import pytest
import yaml

from tests.supervised import REPO, Finished, faulty_child, read_events, start_cli, survivors, train_cli, wait_for
from trainbox.container import compose
from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir
from trainbox.supervise import watchdog
from trainbox.supervise.health import hung
from trainbox.supervise.settings import HUNG_AFTER
from trainbox.system import proctree

NOW = 1_800_000_000.0
#: A short promise, so a hang is noticed in seconds (the default is HUNG_AFTER.default).
HUNG_AFTER_S = 5


def state(**fields: Any) -> Dict[str, Any]:
    base = {
        "state": "running",
        "attempt": 1,
        "session": 20261123180000,
        "supervisor_pid": 4242,
        "supervisor_start_ticks": 123456,
        "boot_id": "b0b0b0b0-0000-4000-8000-000000000000",
        "hung_after_s": 60.0,
        "updated_ts": NOW - 10,
    }
    return {**base, **fields}


# -- the decision: pure, over a state and a clock -------------------------------------------------------------------


def test_a_supervisor_that_keeps_its_promise_is_not_hung() -> None:
    assert hung(state(), NOW, True) is None
    assert hung(state(updated_ts=NOW - 60), NOW, True) is None, "exactly at the bound is still on time"


def test_a_supervisor_past_its_promise_is_hung_with_the_evidence() -> None:
    found = hung(state(updated_ts=NOW - 75), NOW, True)
    assert found is not None
    assert (found.pid, found.session, found.attempt, found.state) == (4242, 20261123180000, 1, "running")
    assert (found.age_s, found.hung_after_s) == (75.0, 60.0)


def test_the_age_of_a_hang_just_past_its_bound_is_past_it() -> None:
    """Found 0.04 s past the bound (a health check right after it): the evidence reads 60.1 s, not 60.0 > 60."""
    found = hung(state(updated_ts=NOW - 60.04), NOW, True)
    assert found is not None and found.age_s > found.hung_after_s == 60.0, found


def test_declared_quiet_work_extends_the_promise() -> None:
    """Ending a tree with a long grace: state.json is not written, but the supervisor said so beforehand."""
    quiet = state(updated_ts=NOW - 200, quiet_until_ts=NOW - 30)
    assert hung(quiet, NOW, True) is None
    assert hung(quiet, NOW + 31, True) is not None


def test_a_gone_or_recycled_pid_is_never_acted_on() -> None:
    assert hung(state(updated_ts=NOW - 500), NOW, False) is None, "no process with that pid, or another one now"


def test_the_supervisor_is_named_by_its_start_ticks_and_boot() -> None:
    """Issue 33 item 12: start ticks and boot id, which no clock step moves, tell the supervisor from a new process."""
    me = os.getpid()
    own = {"supervisor_start_ticks": proctree.start_ticks(me), "boot_id": proctree.boot_id()}
    assert own["supervisor_start_ticks"] is not None and own["boot_id"]
    assert watchdog.same_process(own, me)
    assert not watchdog.same_process(dict(own, supervisor_start_ticks=own["supervisor_start_ticks"] + 1), me), "a new one"
    assert not watchdog.same_process(dict(own, boot_id="another boot"), me), "the same ticks in another boot"
    assert not watchdog.same_process({"boot_id": own["boot_id"]}, me), "a state without ticks names nobody"
    assert not watchdog.same_process(own, ended_pid())


def ended_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("final", ["succeeded", "gave_up", "misconfigured", "stopped", "disk_full", "refused", "stuck"])
def test_a_run_that_is_over_is_never_acted_on(final: str) -> None:
    assert hung(state(state=final, updated_ts=NOW - 500), NOW, True) is None


@pytest.mark.parametrize("busy", ["starting", "backoff", "stalled", "crashed", "stopping"])
def test_every_other_state_is_watched(busy: str) -> None:
    assert hung(state(state=busy, updated_ts=NOW - 500), NOW, True) is not None


def test_an_old_state_file_is_held_to_the_default_promise() -> None:
    legacy = state(hung_after_s=None, updated_ts=NOW - HUNG_AFTER.default - 1)
    found = hung(legacy, NOW, True)
    assert found is not None and found.hung_after_s == HUNG_AFTER.default


def test_hangs_in_a_row_count_from_the_last_exit() -> None:
    kinds = ["start", "supervisor_hung", "start", "supervisor_hung", "exit", "start", "supervisor_hung"]
    assert watchdog.hangs_in_a_row({"event": kind} for kind in kinds) == 1
    assert watchdog.hangs_in_a_row({"event": kind} for kind in kinds[:4]) == 2


def test_the_give_up_comes_before_dockers_restart_budget_is_spent() -> None:
    """compose.yaml's `restart: on-failure:N` must leave the supervisor room to give up itself (exit 1, final)."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    policy, _, count = compose["x-train"]["restart"].partition(":")
    assert policy == "on-failure" and int(count) > watchdog.MAX_HANGS


# -- health --act on real supervisors -----------------------------------------------------------------------------


@contextlib.contextmanager
def supervised(
    run_dir: Path, *options: str, child: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None
) -> Iterator[subprocess.Popen]:
    """A supervisor with a short promise (``--hung-after``), SIGKILLed when the test ends without ending it."""
    args = ["supervise", "--run-dir", str(run_dir), "--hung-after", str(HUNG_AFTER_S), "--backoff", "0.2", "--quiet", *options]
    proc = start_cli([*args, "--", *(child or faulty_child("--steps", "100000", "--interval", "0.05"))], env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()  # its child dies with it
            proc.wait()


def running_state(run_dir: Path) -> Dict[str, Any]:
    path = RunDir(run_dir).state
    wait_for(lambda: path.exists() and json.loads(path.read_text() or "{}").get("state") == "running", 60, "a running child")
    return json.loads(path.read_text())


def act_until_it_acts(run_dir: Path, timeout: float, env: Optional[Dict[str, str]] = None) -> Finished:
    """Run `health --act` every half second, as a (fast) HEALTHCHECK would, until it ends the supervisor."""
    deadline = time.monotonic() + timeout
    while True:
        health = train_cli(["health", "--act", "--run-dir", str(run_dir)], run_dir, env=env, timeout=60)
        if health.stdout.startswith("unhealthy: supervisor pid") or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def assert_ended(proc: subprocess.Popen, run_dir: Path, child_pid: int, health: Finished, frame: str) -> str:
    """The supervisor was ended (SIGKILL), its child died with it, and the event and report say what it was doing."""
    assert health.code == 1 and health.stdout.startswith("unhealthy: supervisor pid"), health.stdout + health.stderr
    # SIGKILL, or SIGSEGV from inside the dump: faulthandler walks every thread's frames without the GIL (CPython
    # says of _Py_DumpTracebackThreads that it may crash while another thread changes them), and a supervisor just
    # continued from SIGSTOP has its output thread running again. Seen once in CI (exit -11). Health reads the dump
    # when its file stops growing and SIGKILLs the supervisor either way; what the dump must hold is asserted below.
    assert proc.wait(timeout=30) in (-signal.SIGKILL, -signal.SIGSEGV)
    wait_for(
        lambda: not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE, 10, "the child"
    )
    assert not survivors(run_dir)
    event = read_events(run_dir)[-1]
    assert event["event"] == "supervisor_hung" and event["pid"] == proc.pid
    assert event["age_s"] >= HUNG_AFTER_S and event["hung_after_s"] == HUNG_AFTER_S  # age_s is rounded to 0.1 s
    assert event["proc_state"] != "?" and event["wchan"] != "?" and event["stacks"] == "faulthandler"
    report = Path(event["incident"]).read_text()
    assert Path(event["incident"]).parent == RunDir(run_dir).supervisor_hang.directory
    assert "Current thread" in report and frame in report and "in _watch" in report, report
    return str(event["proc_state"])


def test_a_frozen_supervisor_is_ended_with_its_stacks_and_its_child(tmp_path: Path) -> None:
    with supervised(tmp_path) as proc:
        child_pid = running_state(tmp_path)["child_pid"]
        proc.send_signal(signal.SIGSTOP)
        health = act_until_it_acts(tmp_path, timeout=HUNG_AFTER_S + 30)
        assert assert_ended(proc, tmp_path, child_pid, health, "supervisor.py") == "T"  # stopped


def stepped_clock(run_dir: Path, seconds: float) -> None:
    """state.json as a supervisor wrote it before the wall clock was stepped by ``seconds`` (an NTP step): every
    time in it read from the wall clock is ``seconds`` behind what the clock now says of the same moment."""
    path = RunDir(run_dir).state
    written = json.loads(path.read_text())
    path.write_text(json.dumps({k: v - seconds if k.endswith("_ts") and v else v for k, v in written.items()}))


def test_a_clock_step_does_not_hide_a_hung_supervisor(tmp_path: Path) -> None:
    """Issue 33 item 12: the supervisor was named by its start time on the wall clock, 0.5 s of tolerance; after a
    1 s step a hung supervisor was never recognised and never ended. Start ticks and the boot id do not move."""
    with supervised(tmp_path) as proc:
        child_pid = running_state(tmp_path)["child_pid"]
        proc.send_signal(signal.SIGSTOP)
        stepped_clock(tmp_path, 1.0)
        health = act_until_it_acts(tmp_path, timeout=HUNG_AFTER_S + 30)
        assert assert_ended(proc, tmp_path, child_pid, health, "supervisor.py") == "T"


def test_act_tells_of_the_hang_itself_with_the_notifier_from_its_environment(tmp_path: Path) -> None:
    """As compose gives the health check TRAINBOX_NOTIFY: the event as written, told before the kill."""
    told = tmp_path / "told.txt"
    notifier = tmp_path / "tell.sh"
    notifier.write_text(f'#!/bin/sh\n{{ printf "%s " "$TRAINBOX_EVENT"; cat; }} >> {told}\n')
    notifier.chmod(0o755)
    run_dir = tmp_path / "run"
    with supervised(run_dir, "--notify", str(notifier)) as proc:  # the hung supervisor's own notifier cannot tell
        child_pid = running_state(run_dir)["child_pid"]
        proc.send_signal(signal.SIGSTOP)
        env = {"TRAINBOX_NOTIFY": str(notifier), "TRAINBOX_NOTIFY_ON": "supervisor_hung"}
        health = act_until_it_acts(run_dir, timeout=HUNG_AFTER_S + 30, env=env)
        assert_ended(proc, run_dir, child_pid, health, "supervisor.py")
    name, body = told.read_text().split(" ", 1)
    assert name == "supervisor_hung" and json.loads(body) == read_events(run_dir)[-1]


def test_a_supervisor_blocked_in_a_wait_is_ended(tmp_path: Path) -> None:
    with supervised(tmp_path, env={"TRAIN_FAULT": "wait@supervisor,hangs=0,step>=50"}) as proc:
        child_pid = running_state(tmp_path)["child_pid"]
        health = act_until_it_acts(tmp_path, timeout=HUNG_AFTER_S + 30)
        assert assert_ended(proc, tmp_path, child_pid, health, "in hang_in_wait") == "S"  # asleep in wait4


def test_a_busy_supervisor_is_never_touched(tmp_path: Path) -> None:
    """A stall whose child ignores SIGTERM keeps the supervisor away from state.json for the whole grace (8 s > 5 s):
    declared, so `health --act`, run all along, never acts; the run completes."""
    child = faulty_child("--steps", "40", "--interval", "0.05")
    env = {"TRAIN_FAULT": "ignore-sigterm@step,attempt=0,step=10"}
    answers: List[str] = []
    with supervised(tmp_path, "--stall-timeout", "2", "--grace", "8", child=child, env=env) as proc:
        while proc.poll() is None:
            answers.append(train_cli(["health", "--act", "--run-dir", str(tmp_path)], tmp_path, timeout=60).stdout)
            time.sleep(0.5)
    assert proc.returncode == 0, answers[-5:]
    kinds = [e["event"] for e in read_events(tmp_path)]
    assert "supervisor_hung" not in kinds and kinds.count("stall") == 1, kinds
    stall = next(e for e in read_events(tmp_path) if e["event"] == "stall")
    assert stall["kill_s"] > HUNG_AFTER_S, "the grace did outlast the promise"
    assert not [a for a in answers if "hung" in a], answers  # neither ended nor called hung


def test_a_supervisor_that_hung_again_and_again_gives_up(tmp_path: Path) -> None:
    hangs = [{"ts": NOW, "event": "supervisor_hung", "attempt": 0, "pid": 7}] * watchdog.MAX_HANGS
    RunDir(tmp_path).events.write_text("".join(json.dumps(e) + "\n" for e in hangs))
    done = train_cli(["supervise", "--run-dir", str(tmp_path), "--", *faulty_child("--steps", "3")], tmp_path, timeout=60)
    assert done.code == ExitCode.GAVE_UP, done.stderr
    assert f"giving up: the supervisor of this run hung {watchdog.MAX_HANGS} times in a row" in done.stderr
    assert done.kinds()[-2:] == ["give_up", "exit"] and done.of("give_up")[0]["reason"] == "supervisor hung"
    assert "start" not in done.kinds(), "nothing was trained"
    again = train_cli(["supervise", "--run-dir", str(tmp_path), "--", *faulty_child("--steps", "3")], tmp_path, timeout=60)
    assert again.code == ExitCode.OK, "after a give-up the count starts over: running it again trains"


def unit(name: str) -> Dict[str, str]:
    """KEY=VALUE settings of a unit file of examples/systemd."""
    lines = (REPO / "examples" / "systemd" / name).read_text().splitlines()
    pairs = (line.partition("=") for line in lines if "=" in line and not line.startswith("#"))
    return {key: value for key, _, value in pairs}


def test_the_systemd_example_restarts_what_docker_would_and_checks_as_often() -> None:
    """examples/systemd: the run's unit leaves the final statuses alone; the timer runs `health --act` every interval."""
    run, check, timer = unit("trainbox-run@.service"), unit("trainbox-health@.service"), unit("trainbox-health@.timer")
    final = sorted(code for code in range(256) if code and ExitCode.is_final(code))
    assert sorted(map(int, run["RestartPreventExitStatus"].split())) == final
    assert run["Restart"] == "on-failure" and " -m trainbox run " in run["ExecStart"]
    assert " -m trainbox health --act " in check["ExecStart"]
    interval = yaml.safe_load((REPO / "compose.yaml").read_text())["x-train"]["healthcheck"]["interval"]
    assert compose.parse_duration(timer["OnUnitActiveSec"]) == compose.parse_duration(compose.interpolate(interval, {}))


def test_the_docs_state_the_bound_and_the_interval() -> None:
    """How fast a hung supervisor is ended, as docs/hangs.md says it: the setting's default plus compose's interval."""
    interval = yaml.safe_load((REPO / "compose.yaml").read_text())["x-train"]["healthcheck"]["interval"]
    seconds = compose.parse_duration(compose.interpolate(interval, {}))
    text = " ".join((REPO / "docs" / "hangs.md").read_text().split())
    assert f"**{HUNG_AFTER.default:g} + {seconds:g} s**" in text
    assert f"`--hung-after` seconds (default {HUNG_AFTER.default:g})" in text
    assert f"HEALTHCHECK is `trainbox health --act` every {seconds:g} s" in text
