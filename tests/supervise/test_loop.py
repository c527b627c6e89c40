"""The supervisor's loop in-process: whole runs scripted as outcomes, checked in milliseconds.

As torchelastic tests its agent, the part that runs real processes is replaced: a :class:`Script` stands in for the
:class:`~trainbox.supervise.monitor.Monitor` and plays back one step per attempt, writing what the real monitor
writes for it (``start``, and the ``crash`` or ``stall`` of a failed attempt, counted). Everything else is the real
thing: the planner, the policy's rules, the back-off, the record with its state machine, state.json, the lock, the
signal handlers and the one ending path. The end-to-end tests with real processes (``test_supervisor.py``) stay.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from trainbox.errors import DiskFull, ExitCode
from trainbox.rundir.events import EventLog, read_events
from trainbox.rundir.layout import RunDir
from trainbox.rundir.state import InvalidTransition, State
from trainbox.supervise import record as record_module
from trainbox.supervise.ladder.command import CommandLadder, Rung
from trainbox.supervise.output.progress import HOW_TO_GIVE_PROGRESS
from trainbox.supervise.planner import Launch, Next, Planner
from trainbox.supervise.policy import NO_PROGRESS_READ, Outcome, OutcomeKind
from trainbox.supervise.record import Record
from trainbox.supervise.settings import SupervisorSettings
from trainbox.supervise.stalls.budgets import BudgetPolicy
from trainbox.supervise.supervisor import Supervisor, SupervisorSpec
from trainbox.supervise.watchdog import MAX_HANGS

Step = Callable[[Record, int, Launch], Outcome]
#: No waiting between attempts: the back-off rule is the policy's, tested in test_policy.py.
FAST = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0)


class Script:
    """Plays back one step per attempt, as the monitor would have run them."""

    def __init__(self, record: Record, steps: List[Step]) -> None:
        self.record = record
        self.steps = list(steps)
        self.launches: List[Launch] = []

    def run(self, number: int, launch: Launch, policy: BudgetPolicy) -> Outcome:
        self.launches.append(launch)
        self.record.set_state(State.STARTING, attempt=number, profile=launch.profile)
        self.record.emit("start", number, profile=launch.profile, argv=list(launch.argv), pid=None)
        return self.steps.pop(0)(self.record, number, launch)


def exits(code: int, beats: int = 3) -> Step:
    def step(record: Record, number: int, launch: Launch) -> Outcome:
        outcome = Outcome(OutcomeKind.EXITED, code=code)
        for _ in range(beats):
            outcome.saw({"phase": "train", "step": outcome.beats}, time.time())
        if beats:
            record.set_state(State.RUNNING)
        if outcome.crashed:
            record.count(outcome)
            record.set_state(State.CRASHED)
            record.emit("crash", number, code=code, **outcome.timing())
        return outcome

    return step


def stalls(at: str = "phase train, step 4", cause: str = "loader_deadlock") -> Step:
    def step(record: Record, number: int, launch: Launch) -> Outcome:
        outcome = Outcome(OutcomeKind.STALLED, beats=4, first_beat_ts=time.time(), first_step_ts=time.time())
        record.count(outcome)
        record.set_state(State.STALLED)
        record.emit("stall", number, action="restart", cause=cause, at=at)
        outcome.detail.update(budget="stall", budget_s=5.0, silent_s=6.0, phase="train", incident=None)
        outcome.detail.update(cause=cause, evidence=["scripted"], at=at, rule="budget")
        return outcome

    return step


def slowed(record: Record, number: int, launch: Launch) -> Outcome:
    """``--on-slow restart`` ended a slow attempt, as the monitor does (trainbox.supervise.pace.watch decided when)."""
    record.set_state(State.RUNNING)
    record.set_state(State.SLOW)
    detail = {"suspect": "memory", "evidence": ["the run's anonymous memory 0.9 GiB, +0.8 GiB"], "slow_s": 640.0}
    return Outcome(OutcomeKind.SLOW, beats=300, first_beat_ts=time.time(), first_step_ts=time.time(), detail=detail)


def stalls_showing_nothing(output_works: bool) -> Step:
    """A stall before any beat or counter; ``output_works``: its output was still coming (a command that ran)."""

    def step(record: Record, number: int, launch: Launch) -> Outcome:
        outcome = Outcome(OutcomeKind.STALLED, output_works=output_works)
        record.count(outcome)
        record.set_state(State.STALLED)
        record.emit("stall", number, action="restart", cause="idle", at=None)
        outcome.detail.update(budget="startup", budget_s=10.0, silent_s=10.5, phase=None, incident=None)
        outcome.detail.update(cause="idle", evidence=["scripted"], at=None, rule="budget")
        outcome.detail.update(progress_source="none", last_output=["loading shard 3 of 9"] if output_works else [])
        return outcome

    return step


def disk_full(record: Record, number: int, launch: Launch) -> Outcome:
    raise DiskFull.writing(record.run_dir.events, OSError(28, "No space left on device"))


def signalled(record: Record, number: int, launch: Launch) -> Outcome:
    """SIGTERM to the supervisor while the attempt runs: the monitor ends the tree and says so."""
    os.kill(os.getpid(), signal.SIGTERM)
    record.set_state(State.STOPPING)
    return Outcome(OutcomeKind.STOPPED, beats=1)


class Run:
    """One supervised run of a script, in-process, and what it left behind."""

    def __init__(
        self,
        tmp_path: Path,
        steps: List[Step],
        settings: SupervisorSettings = FAST,
        on_publish: Optional[Callable[[RunDir], None]] = None,
        rungs: Sequence[Rung] = (),
    ) -> None:
        self.ended: List[RunDir] = []
        launch = Launch(argv=["train.py"], startup_timeout=10.0, stall_timeout=5.0)
        planner = CommandLadder(launch, rungs) if rungs else Planner(launch)
        spec = SupervisorSpec(tmp_path, planner, settings, echo=False, on_end=self.ended.append, on_publish=on_publish)
        self.script: Script
        self.supervisor = Supervisor(spec, attempts=self._script(steps))
        self.run_dir = self.supervisor.run_dir

    def _script(self, steps: List[Step]) -> Callable[[Record], Script]:
        self.script_steps = steps  # a test may script them after the planner exists (they may need it)

        def make(record: Record) -> Script:
            self.script = Script(record, self.script_steps)
            return self.script

        return make

    def __call__(self) -> int:
        self.code = self.supervisor.run()
        return self.code

    @property
    def events(self) -> List[Dict[str, Any]]:
        return read_events(self.run_dir.events)

    def names(self) -> List[str]:
        return [record["event"] for record in self.events]

    def one(self, name: str) -> Dict[str, Any]:
        (record,) = [record for record in self.events if record["event"] == name]
        return record

    def state(self) -> Dict[str, Any]:
        return json.loads(self.run_dir.state.read_text())


def test_a_run_that_finishes_exits_0_once(tmp_path: Path) -> None:
    run = Run(tmp_path, [exits(0)])
    assert run() == ExitCode.OK
    assert run.names() == ["start", "exit"]
    assert run.one("exit")["reason"] == "completed" and run.one("exit")["beats"] == 3
    assert run.state()["state"] == "succeeded" and run.state()["exit_code"] == 0
    assert run.ended == [run.run_dir], "the presentation hook ran once, as the run ended"


def test_a_stall_is_restarted_and_the_run_completes(tmp_path: Path) -> None:
    run = Run(tmp_path, [stalls(), exits(0)])
    assert run() == ExitCode.OK
    assert run.names() == ["start", "stall", "restart", "start", "exit"]
    restart = run.one("restart")
    assert restart["attempt"] == 1 and restart["after"] == "stalled" and restart["retry"] == "same"
    assert {k: run.one("exit")[k] for k in ("restarts", "stalls", "crashes")} == {"restarts": 1, "stalls": 1, "crashes": 0}


def test_a_slow_attempt_ended_for_its_slowness_is_restarted_from_its_checkpoint(tmp_path: Path) -> None:
    run = Run(tmp_path, [slowed, exits(0)])
    assert run() == ExitCode.OK
    assert run.names() == ["start", "restart", "start", "exit"]
    restart = run.one("restart")
    assert restart["after"] == "slow" and restart.get("retry") is None  # null: read back, a null field is left out
    assert restart["reason"] == "slow (memory): the same command again, from its last checkpoint"
    assert {k: run.one("exit")[k] for k in ("restarts", "stalls", "crashes")} == {"restarts": 1, "stalls": 0, "crashes": 0}


def test_slow_restarts_spend_the_restart_budget_and_the_give_up_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    settings = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0, max_restarts=1)
    run = Run(tmp_path, [slowed, slowed, exits(0)], settings)
    assert run() == ExitCode.HUNG
    assert run.one("give_up")["reason"] == "restart budget spent" and run.state()["state"] == "gave_up"
    assert "slow for 640 s (memory: the run's anonymous memory 0.9 GiB, +0.8 GiB), restarted" in capsys.readouterr().err


def test_the_same_stall_at_the_same_place_gives_up_at_once(tmp_path: Path) -> None:
    run = Run(tmp_path, [stalls(), stalls(), exits(0)])
    assert run() == ExitCode.HUNG
    assert run.names()[-2:] == ["give_up", "exit"]
    assert "stalls again at phase train, step 4" in run.one("give_up")["reason"]
    assert len(run.script.steps) == 1, "the third attempt never ran"


def test_two_attempts_without_a_beat_are_a_configuration_error(tmp_path: Path) -> None:
    run = Run(tmp_path, [exits(1, beats=0), exits(1, beats=0), exits(0)])
    assert run() == ExitCode.MISCONFIGURED
    assert run.one("give_up")["reason"] == "misconfigured" and run.one("exit")["reason"] == "misconfigured"
    assert run.state()["state"] == "misconfigured"


def test_two_attempts_that_ran_without_readable_progress_are_not_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = Run(tmp_path, [stalls_showing_nothing(output_works=True)] * 2 + [exits(0)])
    assert run() == ExitCode.GAVE_UP
    assert run.one("give_up")["reason"] == NO_PROGRESS_READ and run.state()["state"] == "gave_up"
    said = capsys.readouterr().err
    assert "configuration error" not in said and HOW_TO_GIVE_PROGRESS in said and "loading shard 3 of 9" in said
    assert len(run.script.steps) == 1, "not restarted again: every attempt would be stopped the same way"


def test_two_silent_startups_are_a_configuration_error_and_told_how_to_give_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = Run(tmp_path, [stalls_showing_nothing(output_works=False)] * 2)
    assert run() == ExitCode.MISCONFIGURED
    said = capsys.readouterr().err
    assert "configuration error" in said and HOW_TO_GIVE_PROGRESS in said and "(no output)" in said


def test_a_ladder_file_steps_the_command_down_after_a_stall(tmp_path: Path) -> None:
    rungs = [Rung(name="fast", args=["--workers", "4"]), Rung(name="careful", args=["--workers", "0"], env={"X": "1"})]
    steps = [stalls(f"phase train, step 4, profile {rung}", "loader_deadlock") for rung in ("fast", "careful")]
    run = Run(tmp_path, [*steps, exits(0)], rungs=rungs)
    assert run() == ExitCode.OK, "the same place on another rung is another try"
    assert [(launch.profile, list(launch.argv)) for launch in run.script.launches] == [
        ("fast", ["train.py", "--workers", "4"]),
        ("careful", ["train.py", "--workers", "0"]),
        ("careful", ["train.py", "--workers", "0"]),
    ]
    starts = [record["profile"] for record in run.events if record["event"] == "start"]
    restarts = [(r["previous_profile"], r["profile"], r["reason"]) for r in run.events if r["event"] == "restart"]
    assert starts == ["fast", "careful", "careful"]
    assert restarts[0] == ("fast", "careful", "loader_deadlock: down the ladder to careful")
    assert restarts[1][2] == "loader_deadlock: careful again: no rung left below it"


class Clock:
    """The ladder ledger's clock, moved on by the scripted attempts: minutes of training in milliseconds."""

    def __init__(self) -> None:
        self.now = 1.0e6

    def __call__(self) -> float:
        return self.now


#: A scripted attempt's launch to its first step, and a stall's kill, in seconds of the Clock.
RESTART_S, KILL_S = 2.0, 1.0
TOTAL = 1000


def trained(clock: Clock, first: int, last: int, seconds: float, step: Step) -> Step:
    """``step``, its outcome having trained from step ``first`` to ``last`` in ``seconds`` (then its stall's kill)."""

    def run(record: Record, number: int, launch: Launch) -> Outcome:
        started = clock.now
        clock.now += RESTART_S + seconds
        outcome = step(record, number, launch)
        outcome.started_ts, outcome.first_step, outcome.first_step_ts = started, first, started + RESTART_S
        outcome.last_beat, outcome.last_beat_ts = {"phase": "train", "step": last, "total_steps": TOTAL}, clock.now
        if outcome.kind is OutcomeKind.STALLED:
            clock.now += outcome.detail["silent_s"] + KILL_S
        return outcome

    return run


def checkpoints(clock: Clock, planner: Planner, first: int, rate: float, every_s: float) -> Step:
    """Trains from ``first`` at ``rate`` steps/s with a checkpoint every ``every_s``, asking the planner at each, as
    the monitor does; ends ``MOVED`` when it probes another rung."""

    def run(record: Record, number: int, launch: Launch) -> Outcome:
        clock.now += RESTART_S
        outcome, step = Outcome(OutcomeKind.EXITED, started_ts=clock.now - RESTART_S), first
        outcome.saw({"phase": "train", "step": step, "total_steps": TOTAL}, clock.now)
        record.set_state(State.RUNNING)
        while step < TOTAL:
            clock.now, step = clock.now + every_s, step + int(rate * every_s)
            if outcome.saw({"phase": "train", "step": step, "total_steps": TOTAL, "checkpoint_ts": clock.now}, clock.now):
                following = planner.at_checkpoint(outcome)
                if following is not None:
                    outcome.kind, outcome.detail["next"] = OutcomeKind.MOVED, following
                    return outcome
        raise AssertionError("the safe rung ran to the end without a probe")

    return run


def test_the_ladder_stays_on_a_cheap_stall_steps_down_on_a_deterministic_one_and_probes_back_up(tmp_path: Path) -> None:
    rungs = [Rung(name="fast"), Rung(name="safe", expected_speed=0.5)]
    run, clock = Run(tmp_path, [], rungs=rungs), Clock()
    ladder = run.supervisor.spec.planner
    ladder.ledger.clock = clock  # type: ignore[attr-defined]
    at = "phase train, step 300, profile fast"
    run.script_steps = [
        trained(clock, 0, 300, 30.0, stalls(at, "idle")),  # 10 steps/s; one stall in 30 s, 700 steps left
        trained(clock, 200, 300, 10.0, stalls(at, "idle")),  # resumed from its checkpoint: the same place again
        checkpoints(clock, ladder, 200, 5.0, 20.0),  # safe, at half the speed, past step 300
        exits(0),
    ]
    assert run() == ExitCode.OK
    assert [launch.profile for launch in run.script.launches] == ["fast", "fast", "safe", "fast"]
    moves = [(r["event"], r["previous_profile"], r["profile"], r["ladder"]) for r in run.events if "ladder" in r]
    assert [(event, before, now, ladder["kind"]) for event, before, now, ladder in moves] == [
        ("restart", "fast", "fast", "stay"),
        ("restart", "fast", "safe", "down"),
        ("probe", "safe", "fast", "probe"),
    ]
    stay, down, probe = (ladder for *_, ladder in moves)
    assert stay["reason"].endswith("staying on fast") and "fast: 10 it/s, 1 stall in" in stay["reason"]
    assert "fast: hung twice at phase train, step 300, banned here" in down["reason"]
    assert "probing fast" in probe["reason"] and probe["probation"]["probing"] == "fast"
    assert [c["rung"] for c in probe["candidates"]] == ["fast", "safe"] and probe["candidates"][1]["rate"] == 5.0
    assert probe["lost_to_stalls_s"] > 0 and probe["safety_would_cost_s"] > 0
    assert run.one("exit")["restarts"] == 2 and run.one("exit")["stalls"] == 2, "a probe is no restart and no stall"
    assert run.state()["state"] == "succeeded"


def test_the_same_place_rule_still_ends_a_deterministic_hang_on_the_last_rung(tmp_path: Path) -> None:
    def stalls_here(record: Record, number: int, launch: Launch) -> Outcome:
        return stalls(f"phase train, step 300, profile {launch.profile}", "idle")(record, number, launch)

    rungs = [Rung(name="fast"), Rung(name="safe", expected_speed=0.5)]
    run, clock = Run(tmp_path, [], rungs=rungs), Clock()
    run.supervisor.spec.planner.ledger.clock = clock  # type: ignore[attr-defined]
    run.script_steps = [trained(clock, 200, 300, 10.0, stalls_here) for _ in range(4)]
    assert run() == ExitCode.HUNG
    assert [launch.profile for launch in run.script.launches] == ["fast", "fast", "safe", "safe"]
    assert run.one("give_up")["reason"].startswith("stalls again at phase train, step 300, profile safe")
    kinds = [(r["ladder"]["kind"], r["ladder"]["exhausted"]) for r in run.events if r["event"] == "restart"]
    assert kinds == [("stay", False), ("down", False), ("stay", False)], "one stall on safe: weighed, and stays"


def test_a_stop_signal_as_a_probe_ends_the_tree_stops_the_run(tmp_path: Path) -> None:
    run = Run(tmp_path, [], rungs=[Rung(name="fast"), Rung(name="safe")])
    ladder = run.supervisor.spec.planner

    def probed_and_signalled(record: Record, number: int, launch: Launch) -> Outcome:
        record.set_state(State.RUNNING)
        os.kill(os.getpid(), signal.SIGTERM)
        return Outcome(OutcomeKind.MOVED, beats=3, detail={"next": Next(ladder.current(), None, "probing fast")})

    run.script_steps = [probed_and_signalled]
    assert run() == ExitCode.for_signal(signal.SIGTERM)
    assert run.names() == ["start", "exit"] and run.state()["state"] == "stopped"


def test_the_restart_budget_is_kept(tmp_path: Path) -> None:
    settings = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0, max_restarts=2)
    run = Run(tmp_path, [exits(1), exits(1), exits(1), exits(0)], settings)
    assert run() == ExitCode.GAVE_UP
    assert run.names().count("start") == 3 and run.one("give_up")["reason"] == "restart budget spent"
    assert run.one("exit")["crashes"] == 3 and run.one("exit")["restarts"] == 2


def test_a_full_disk_ends_the_run_with_its_own_code(tmp_path: Path) -> None:
    run = Run(tmp_path, [disk_full])
    assert run() == ExitCode.DISK_FULL
    assert run.one("exit")["reason"] == "disk full"
    assert run.state()["state"] == "disk_full"
    assert run.ended == [], "no report is drawn on a full disk"


def test_a_stop_signal_during_an_attempt_stops_without_a_restart(tmp_path: Path) -> None:
    run = Run(tmp_path, [signalled, exits(0)])
    assert run() == ExitCode.for_signal(signal.SIGTERM)
    assert run.names() == ["start", "exit"] and run.one("exit")["reason"] == "stopped by signal"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handlers in place before the run are back"


def test_a_stop_signal_during_the_back_off_stops_before_the_next_attempt(tmp_path: Path) -> None:
    settings = SupervisorSettings(backoff_s=30.0, backoff_max_s=30.0)
    sent: List[int] = []

    def stop_once_backing_off(run_dir: RunDir) -> None:
        """SIGTERM as the back-off begins (state.json says so), not after a fixed delay that a loaded machine outruns."""
        if not sent and json.loads(run_dir.state.read_text())["state"] == "backoff":
            sent.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    run = Run(tmp_path, [exits(1), exits(0)], settings, on_publish=stop_once_backing_off)
    started = time.monotonic()
    assert run() == ExitCode.for_signal(signal.SIGTERM)
    assert time.monotonic() - started < 10, "the 30 s back-off was cut short by the signal"
    assert run.names() == ["start", "crash", "restart", "exit"] and run.one("exit")["attempt"] == 0 and sent


def test_supervisors_that_hung_too_often_give_up_before_any_attempt(tmp_path: Path) -> None:
    log = EventLog(RunDir(tmp_path).events)
    for _ in range(MAX_HANGS):
        log.emit("supervisor_hung", 0)
    run = Run(tmp_path, [exits(0)])
    assert run() == ExitCode.GAVE_UP
    assert run.names()[-2:] == ["give_up", "exit"] and run.one("give_up")["hangs"] == MAX_HANGS
    assert "start" not in run.names()


def test_the_record_refuses_a_move_the_state_machine_has_not(tmp_path: Path) -> None:
    record = Record(RunDir(tmp_path))
    record.set_state(State.RUNNING)
    record.set_state(State.SUCCEEDED)
    with pytest.raises(InvalidTransition, match="from succeeded to running"):
        record.set_state(State.RUNNING)
    record.set_state(State.DISK_FULL)  # reachable from anywhere


def test_every_ending_counts_in_its_exit_event(tmp_path: Path) -> None:
    """Each way to end writes one exit event with the counters, as the events table in docs/contract.md says."""
    endings = {
        "ok": [exits(0)],
        "gave_up": [stalls(), stalls()],
        "misconfigured": [exits(2, beats=0), exits(2, beats=0)],
        "disk_full": [disk_full],
        "signal": [signalled],
    }
    for name, steps in endings.items():
        run = Run(tmp_path / name, steps)
        run()
        (exit_event,) = [record for record in run.events if record["event"] == "exit"]
        assert {"restarts", "stalls", "crashes", "code", "reason", "slow_s", "slow_episodes"} <= set(exit_event), (
            name,
            exit_event,
        )
        assert exit_event["code"] == run.code, name


# -- telling the person and their tools --------------------------------------------------------------------------------------
def teller(tmp_path: Path) -> Tuple[Path, Path]:
    """A real notifier (a shell script) that appends ``NAME JSON`` for each event it is given; and where it writes."""
    told = tmp_path / "told.txt"
    script = tmp_path / "tell.sh"
    script.write_text(f'#!/bin/sh\n{{ printf "%s " "$TRAINBOX_EVENT"; cat; }} >> {told}\n')
    script.chmod(0o755)
    return script, told


def test_every_chosen_event_is_told_in_order_and_the_last_before_run_returns(tmp_path: Path) -> None:
    script, told = teller(tmp_path)
    chosen = ("stall", "restart", "give_up", "exit")
    settings = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0, notify=str(script), notify_on=",".join(chosen))
    run = Run(tmp_path / "run", [stalls(), stalls()], settings)
    assert run() == ExitCode.HUNG
    lines = [line.split(" ", 1) for line in told.read_text().splitlines()]  # complete: run() closed the notifier
    assert [name for name, _ in lines] == ["stall", "restart", "stall", "give_up", "exit"]
    written = [json.loads(line) for line in run.run_dir.events.read_text().splitlines()]  # as written: nulls too
    assert [json.loads(body) for _, body in lines] == [e for e in written if e["event"] in chosen]


def test_a_missing_notifier_is_one_line_and_one_event_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-notifier"
    settings = SupervisorSettings(backoff_s=0.0, backoff_max_s=0.0, notify=f"{missing} --loud", notify_on="stall,exit")
    run = Run(tmp_path / "run", [stalls(), exits(0)], settings)
    assert run() == ExitCode.OK
    said = [line for line in capsys.readouterr().err.splitlines() if "notif" in line]
    assert said == [
        f"trainbox: notify: notifier {missing} cannot start: not found, or not executable (said once; the run goes on)"
    ]
    assert run.names() == ["notify_failed", "start", "stall", "restart", "start", "exit"]
    assert run.one("notify_failed")["kind"] == "start"


def test_an_ending_that_cannot_be_written_is_still_told(tmp_path: Path) -> None:
    record = Record(RunDir(tmp_path))
    RunDir(tmp_path).events.mkdir()  # every append fails, as on a full disk
    heard: List[Dict[str, Any]] = []
    record.listen(heard.append)
    told = record.emit_best_effort("exit", 2, code=ExitCode.DISK_FULL, reason="disk full")
    assert heard == [told] and told["event"] == "exit" and told["reason"] == "disk full"


def test_the_metrics_hook_runs_on_news_at_once_and_otherwise_every_few_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(record_module.time, "monotonic", lambda: clock[0])
    calls: List[float] = []
    record = Record(RunDir(tmp_path), on_publish=lambda run: calls.append(clock[0]))
    for _ in range(30):  # 15 s of publishing every half second, as the monitor does
        record.publish()
        clock[0] += 0.5
    assert calls == [1000.0, 1005.0, 1010.0]
    record.set_state(State.RUNNING)  # news: at once
    assert calls[-1] == clock[0] and len(calls) == 4


def test_the_metrics_hook_sees_the_run_as_it_ended(tmp_path: Path) -> None:
    seen: List[Tuple[str, List[str]]] = []

    def look(run: RunDir) -> None:
        seen.append((json.loads(run.state.read_text())["state"], [e["event"] for e in read_events(run.events)]))

    run = Run(tmp_path, [stalls(), exits(0)], on_publish=look)
    assert run() == ExitCode.OK
    assert seen[-1] == ("succeeded", run.names())
    assert {state for state, _ in seen} >= {"starting", "stalled", "backoff", "succeeded"}
