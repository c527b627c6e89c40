"""Who watches the supervisor, in the container (real Docker, the CPU image, `invoke train` as a user runs it).

A frozen supervisor (SIGSTOP) and one blocked in a wait() that never returns are ended by the container's own
HEALTHCHECK (`health --act`); Docker's restart policy brings the container back, the run resumes from last.pt and
finishes, and `invoke train` follows it all, saying the restart in one line; one that hangs after every restart
ends in a give-up. After a `docker kill`, the same `invoke train --name RUN` resumes RUN. The bound and the
health interval are short here (--hung-after 10, TRAINBOX_HEALTH_INTERVAL=2s); the decision itself and a busy
supervisor are tests/supervise/test_health.py's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

from tests.invoked import Invoked
from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir
from trainbox.supervise import watchdog

from .conftest import FAST_SUPERVISOR, container_of, events

HUNG_AFTER_S = 10
HEALTH_INTERVAL_S = 2
EPOCHS = 5
#: Ended within the bound plus one interval; the rest is room for a machine shared with other builds and tests.
RESTARTED_WITHIN_S = HUNG_AFTER_S + HEALTH_INTERVAL_S + 30


def train(run_name: str, runs_dir: Path, session_env: Dict[str, str], *extra: str) -> Invoked:
    env = {**session_env, "TRAINBOX_RUNS_HOST": str(runs_dir), "TRAINBOX_HEALTH_INTERVAL": f"{HEALTH_INTERVAL_S}s"}
    supervisor = f"--hung-after {HUNG_AFTER_S} {FAST_SUPERVISOR}"
    args = ["train", "--flavor", "cpu", "--name", run_name, "--supervisor", supervisor, "--set", f"epochs={EPOCHS}", *extra]
    return Invoked(args, env)


def checkpointed(run_dir: Path) -> bool:
    """An epoch-end checkpoint exists and a later epoch (0-based 2 of 5) is under way: a resume has work left."""
    try:
        beat = json.loads(RunDir(run_dir).heartbeat.read_text() or "{}")
    except (OSError, ValueError):
        return False
    return RunDir(run_dir).last_checkpoint.exists() and beat.get("epoch", 0) >= 2


def result_epochs(run_dir: Path) -> List[int]:
    """The ``epoch`` column of results.csv (1-based, one row per completed epoch)."""
    return [int(float(line.split(",")[0])) for line in RunDir(run_dir).results.read_text().splitlines()[1:]]


def assert_resumed_and_finished(invoked: Invoked, code: int, run_dir: Path) -> None:
    output = invoked.output
    assert code == 0, output[-4000:]
    assert "Resuming training" in output, "the new supervisor resumed from last.pt"
    assert result_epochs(run_dir) == list(range(1, EPOCHS + 1)), "every epoch once: resumed, not started over"
    assert events(run_dir)[-1]["reason"] == "completed"


def freeze_and_follow(docker_api, invoked: Invoked, run_name: str, run_dir: Path, freeze: bool) -> Dict[str, Any]:
    """Wait for a checkpoint, freeze the supervisor (or let its fault hang it) and see the container restarted."""
    invoked.wait_until(lambda: checkpointed(run_dir), "an epoch-end checkpoint")
    container = container_of(docker_api, run_name)
    if freeze:
        # The trainer is frozen with it: alone, it could finish the run during the hang on a fast machine, leaving
        # nothing to resume (tests/supervise/test_health.py freezes a supervisor alone and sees its running child die with it).
        state = json.loads(RunDir(run_dir).state.read_text())
        run = docker_api.exec_create(container["Id"], ["sh", "-c", f"kill -STOP {state['supervisor_pid']} {state['child_pid']}"])
        assert docker_api.exec_start(run["Id"]) == b""
    hung_at = time.monotonic()
    invoked.wait_until(
        lambda: docker_api.inspect_container(container["Id"])["RestartCount"] >= 1, "a restart", timeout=RESTARTED_WITHIN_S
    )
    print(f"supervisor hung -> container restarted: {time.monotonic() - hung_at:.1f} s")
    return container


def assert_hang_reported(invoked: Invoked, run_dir: Path, frame: str, proc_state: str) -> None:
    hangs = [e for e in events(run_dir) if e["event"] == "supervisor_hung"]
    assert len(hangs) == 1, hangs
    hang = hangs[0]
    assert hang["age_s"] > HUNG_AFTER_S and hang["proc_state"] == proc_state and hang["stacks"] == "faulthandler", hang
    report = (RunDir(run_dir).supervisor_hang.directory / Path(hang["incident"]).name).read_text()
    assert frame in report and "in _watch" in report, report
    lines = [line for line in invoked.output.splitlines() if line.startswith("trainbox: container restarted by Docker")]
    assert len(lines) == 1 and "(restart 1 of 3): its supervisor hung" in lines[0], lines


def test_a_frozen_supervisor_is_ended_and_the_run_resumes(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env
) -> None:
    run_dir = runs_dir / run_name
    invoked = train(run_name, runs_dir, session_env)
    container = freeze_and_follow(docker_api, invoked, run_name, run_dir, freeze=True)
    code = invoked.finish(timeout=600)
    assert_resumed_and_finished(invoked, code, run_dir)
    assert_hang_reported(invoked, run_dir, "supervisor.py", proc_state="T")
    assert docker_api.inspect_container(container["Id"])["RestartCount"] == 1


def test_a_supervisor_blocked_in_a_wait_is_ended_and_the_run_resumes(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env
) -> None:
    run_dir = runs_dir / run_name
    invoked = train(run_name, runs_dir, session_env, "--env", "TRAIN_FAULT=wait@supervisor,hangs=0,epoch>=2")
    freeze_and_follow(docker_api, invoked, run_name, run_dir, freeze=False)
    code = invoked.finish(timeout=600)
    assert_resumed_and_finished(invoked, code, run_dir)
    assert_hang_reported(invoked, run_dir, "in hang_in_wait", proc_state="S")


def test_after_docker_kill_the_same_command_resumes(docker_api, cpu_image, runs_dir: Path, run_name: str, session_env) -> None:
    """The first container trains under the short bound and health interval, busy, and is never touched; then it is
    killed (Docker leaves a killed container stopped), and the same `invoke train --name` replaces it and resumes."""
    run_dir = runs_dir / run_name
    first = train(run_name, runs_dir, session_env)
    first.wait_until(lambda: checkpointed(run_dir), "an epoch-end checkpoint")
    container = container_of(docker_api, run_name)
    assert docker_api.inspect_container(container["Id"])["RestartCount"] == 0
    assert not [e for e in events(run_dir) if e["event"] == "supervisor_hung"], "a busy supervisor is never touched"
    docker_api.kill(container["Id"])
    assert first.finish(timeout=120) == 137, first.output[-3000:]
    again = train(run_name, runs_dir, session_env)
    code = again.finish(timeout=600)
    assert_resumed_and_finished(again, code, run_dir)
    assert "note: replaced the stopped container" in again.output
    saved = RunDir(run_dir).container_log(0).read_text()
    assert "Resuming training" not in saved and "Epoch" in saved, "the killed container's output, kept"
    assert container_of(docker_api, run_name)["Id"] != container["Id"]


def test_a_supervisor_that_hangs_after_every_restart_gives_up(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env
) -> None:
    """Bounded: two hangs, two restarts, then the third supervisor gives up (exit 1, final), and Docker leaves it."""
    run_dir = runs_dir / run_name
    invoked = train(run_name, runs_dir, session_env, "--env", "TRAIN_FAULT=wait@supervisor")
    code = invoked.finish(timeout=600)
    output = invoked.output
    assert code == ExitCode.GAVE_UP, output[-4000:]
    restarts = [line for line in output.splitlines() if line.startswith("trainbox: container restarted by Docker")]
    assert [line.split("(")[1].split(")")[0] for line in restarts] == ["restart 1 of 3", "restart 2 of 3"], restarts
    assert f"giving up: the supervisor of this run hung {watchdog.MAX_HANGS} times in a row" in output
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("supervisor_hung") == watchdog.MAX_HANGS and kinds[-2:] == ["give_up", "exit"], kinds
    inspected = container_of(docker_api, run_name)
    assert (inspected["RestartCount"], inspected["State"]["ExitCode"]) == (watchdog.MAX_HANGS, 0)
