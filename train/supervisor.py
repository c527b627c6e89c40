"""The supervisor: run a child, notice when it stops making progress, diagnose, kill, restart.

Shaped after torchelastic's agent: a spec validated on creation, a state enum
that documents the machine, and a ``run()`` that always cleans up. What to do
after an attempt ends is decided by :mod:`trainbox.restart` (a pure policy),
whether a silence is a stall by :mod:`trainbox.silence` (budget, idleness, compile progress),
the settings and their rules are :mod:`trainbox.supervisor_settings`, and
every path of the run directory is named by :class:`trainbox.rundir.RunDir`.

What the supervisor must survive, and how:

* another supervisor on the same directory: :mod:`trainbox.runlock` refuses it;
* its own death: the child dies with it (:func:`trainbox.proctree.die_with_parent`);
* its own hang: it promises ``health`` a fresh ``state.json`` and declares longer
  work beforehand; ``health --act`` ends it when it breaks that promise
  (:mod:`trainbox.watchdog`, :mod:`trainbox.health`);
* a reader that goes away (``| head``, a closed terminal) or a full disk under
  the log: :class:`OutputTee` stops echoing or logging but never stops draining
  the child's pipe, which would block the child and fake a stall;
* a full disk: ``state.json``, the attempt logs and incident reports are
  best-effort and killing and restarting go on without them; only the run's
  history (``events.jsonl``) must be written, and when it cannot be the
  supervisor ends the tree and exits ``ExitCode.DISK_FULL`` with one line;
* a process that survives SIGKILL (D state in a hung driver): waiting for it
  would hang forever, so the supervisor gives up with ``ExitCode.STUCK`` and
  one line naming it and its kernel wait channel (a reboot is needed).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from trainbox import errors, faults, gpu_release, heartbeat, incident, interrupt, proctree, ranks, report, restart, watchdog
from trainbox.atomic import write_text_atomic
from trainbox.budgets import Budget, BudgetPolicy
from trainbox.errors import DISK_FULL_ERRNOS, DiskFull, ExitCode, Stuck
from trainbox.events import EventLog, device_fields, read_events
from trainbox.output import OutputTee, say
from trainbox.progress_log import ProgressLog
from trainbox.restart import CauseStreak, Counters, Outcome, OutcomeKind, Retry, Verdict, decide, retry_for
from trainbox.rundir import RunDir
from trainbox.runlock import RunLock
from trainbox.silence import Action, Call, Limits, SilenceWatch, extension, stall_line
from trainbox.supervisor_settings import COMPILE_CAP, IDLE_TIMEOUT, LAUNCH_SETTINGS, SupervisorSettings

#: Longest pause between two looks at the heartbeat (shorter when the budget is short: budget / 20).
POLL_S = 0.5
#: How long the killed child may take to be reaped once its whole tree is gone (normally microseconds;
#: longer means the kernel holds it, and waiting on would hang the supervisor).
REAP_S = 10.0


class State(str, Enum):
    """Where the supervisor is. The transitions::

    STARTING --first beat--> RUNNING --exit 0--> SUCCEEDED
    STARTING | RUNNING --exit != 0--------------> CRASHED
    STARTING | RUNNING --budget spent or idle---> STALLED  (incident written, tree killed; trainbox.silence)
    STARTING | RUNNING --the same, with --on-stall report--> unchanged (incident written once per silence)
    CRASHED | STALLED --restarts left-----------> BACKOFF --delay--> STARTING (next attempt)
    CRASHED | STALLED --restart budget spent, or the same stall again with nothing left to try--> GAVE_UP
    CRASHED | STALLED --2nd attempt in a row without a beat--> MISCONFIGURED

    The arrows out of CRASHED and STALLED are :func:`trainbox.restart.decide`'s.
    any --SIGTERM/SIGINT/SIGHUP to the supervisor--> STOPPING --tree gone--> STOPPED
    any --the run's history cannot be written-----> DISK_FULL
    any --a process survives SIGKILL--------------> STUCK
    """

    STARTING = "starting"
    RUNNING = "running"
    CRASHED = "crashed"
    STALLED = "stalled"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    GAVE_UP = "gave_up"
    MISCONFIGURED = "misconfigured"
    STOPPING = "stopping"
    STOPPED = "stopped"
    DISK_FULL = "disk_full"
    STUCK = "stuck"


#: States in which ``python -m trainbox health`` reports healthy (while beats keep coming).
LIVE_STATES = (State.STARTING, State.RUNNING, State.BACKOFF)
#: States after which the supervisor only exits: ``health --act`` never ends it there.
FINAL_STATES = (State.SUCCEEDED, State.GAVE_UP, State.MISCONFIGURED, State.STOPPED, State.DISK_FULL, State.STUCK)
#: Seconds the SIGKILL rounds of ``ProcessTree.terminate`` may take after the grace (50 rounds, 0.05 s each, and scans).
KILL_S = 5.0


@dataclass(frozen=True)
class Launch:
    """One attempt's command, the profile it stands for, and its budgets."""

    argv: Sequence[str]
    startup_timeout: float
    stall_timeout: float
    profile: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    idle_timeout: float = IDLE_TIMEOUT.number
    compile_cap: float = COMPILE_CAP.number

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("no command to supervise: give it after '--'")
        for setting in LAUNCH_SETTINGS:
            setting.check(getattr(self, setting.field))


@dataclass(frozen=True)
class Next:
    """The attempt after a failed one: its launch, the retry a stall's cause chose, and why (``restart.reason``)."""

    launch: Launch
    retry: Optional[Retry] = None
    reason: str = ""


class Planner:
    """Chooses each attempt's launch. This one repeats the same command."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.streak = CauseStreak()

    def first(self) -> Launch:
        return self.launch

    def after(self, outcome: Outcome) -> Next:
        """The attempt after one that ended as ``outcome`` (a stall or a crash): always the same command."""
        if outcome.kind is not OutcomeKind.STALLED:
            return Next(self.launch, reason="crash: the same command again")
        cause = outcome.detail.get("cause") or "unknown"
        if retry_for(cause, self.streak.count(cause)) is Retry.GPU_RELEASE:
            return Next(self.launch, Retry.GPU_RELEASE, f"{cause}: the same command, after the GPU memory is released")
        return Next(self.launch, Retry.SAME, f"{cause}: the same command again{restart.hint(cause)}")


@dataclass(frozen=True)
class SupervisorSpec:
    """What to supervise (``planner``), where (``run_dir``) and how (``settings``, validated on creation)."""

    run_dir: Path
    planner: Planner
    settings: SupervisorSettings = field(default_factory=SupervisorSettings)
    echo: bool = True


@dataclass
class Running:
    """One attempt in flight: what it was launched with and the handles to watch and end it."""

    attempt: int
    launch: Launch
    policy: BudgetPolicy
    proc: subprocess.Popen[bytes]
    tree: proctree.ProcessTree
    tee: OutputTee
    beats: ranks.JobBeats
    watch: SilenceWatch


class Supervisor:
    def __init__(self, spec: SupervisorSpec) -> None:
        self.spec = spec
        self.settings = spec.settings
        self.run_dir = RunDir(Path(spec.run_dir))
        self.events = EventLog(self.run_dir.events)
        self.progress = ProgressLog(self.run_dir.progress)
        #: Names this supervisor's incident reports apart from earlier ones in the same directory.
        self.session = 0
        #: The attempt under way (or the last one), for events written outside the loop.
        self.attempt = 0
        self._running: Optional[Running] = None
        self.state = State.STARTING
        self.counters = Counters()
        self._stop_signal: Optional[int] = None
        #: What state.json says besides the state and the counters (attempt, budget, last beat, ...).
        self._status: Dict[str, Any] = {}
        self._status_written = 0.0
        #: ``health --act`` ended this many supervisors of the run in a row before this one (trainbox.watchdog).
        self.hangs = 0

    # -- public ----------------------------------------------------------
    def run(self) -> int:
        """Supervise until success, give-up or a stop signal; return the exit code.

        Raises UserError, having written nothing, when another supervisor holds the run directory.
        """
        lock = RunLock(self.run_dir)
        lock.acquire()
        self.session = self.run_dir.new_session(time.time())
        previous = {sig: signal.signal(sig, self._on_signal) for sig in interrupt.STOP_SIGNALS}
        proctree.become_subreaper()
        self._status.update(watchdog.identity(self.session, self.settings.hung_after_s))
        own_stacks = watchdog.install_stack_dump(self.run_dir, os.getpid())
        self.hangs = watchdog.hangs_in_a_row(read_events(self.run_dir.events))
        code: int = ExitCode.GAVE_UP
        try:
            code = self._hung_too_often() if self.hangs >= watchdog.MAX_HANGS else self._loop()
            return code
        except Stuck as stuck:
            code = self._stuck(stuck)
            return code
        except DiskFull as full:
            code = full.code
            self.state = State.DISK_FULL
            with contextlib.suppress(OSError):
                self.events.emit("exit", self.attempt, code=code, reason="disk full", **self.counters.published())
            with contextlib.suppress(OSError, ValueError):
                errors.report(full)
            return code
        finally:
            with contextlib.suppress(Stuck):
                self._end_tree()
            self._publish(force=True, exit_code=code)
            if self.state is not State.DISK_FULL:  # best-effort, under our signal handlers (a Ctrl-C only sets a flag)
                report.refresh(self.run_dir)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            watchdog.remove_stack_dump(own_stacks)
            lock.release()

    # -- the loop ----------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        planner = self.spec.planner
        launch = planner.first()
        policy = self._policy(launch)
        attempt = 0
        history: List[str] = []
        while True:
            outcome = self._attempt(attempt, launch, policy)
            if self._stop_signal is not None and not outcome.succeeded:
                outcome.kind = OutcomeKind.STOPPED  # it came as the attempt ended (while a report was written): no restart
            following = None if outcome.succeeded or outcome.kind is OutcomeKind.STOPPED else planner.after(outcome)
            last_rung = following is None or (following.launch.profile, following.launch.argv) == (launch.profile, launch.argv)
            decision = decide(outcome, self.counters, self.settings, last_rung)
            self.counters = decision.counters
            if decision.verdict is Verdict.STOPPED:
                return self._finish(attempt, self._signal_code(), State.STOPPED, "stopped by signal", outcome)
            if decision.verdict is Verdict.SUCCEEDED:
                return self._finish(attempt, ExitCode.OK, State.SUCCEEDED, "completed", outcome)
            assert following is not None  # any other ending was a failure, and the planner has planned its retry
            history.append(self._describe(outcome, launch))
            if decision.verdict is Verdict.MISCONFIGURED:
                return self._misconfigured(attempt, outcome)
            if decision.verdict is Verdict.GAVE_UP:
                return self._give_up(attempt, history, decision.reason)
            next_launch = following.launch
            if next_launch.profile != launch.profile or next_launch.startup_timeout != launch.startup_timeout:
                policy = self._policy(next_launch)
            if self._back_off(attempt + 1, outcome, launch, following, decision.delay_s):
                return self._finish(attempt, self._signal_code(), State.STOPPED, "stopped by signal")
            attempt += 1
            launch = next_launch

    def _back_off(self, attempt: int, after: Outcome, previous: Launch, following: Next, delay: float) -> bool:
        """Announce ``attempt`` and wait ``delay`` seconds before it; True when a stop signal came meanwhile."""
        launch = following.launch
        released = gpu_release.wait(after.detail.get("pids", []), self._sleep) if following.retry is Retry.GPU_RELEASE else {}
        self._emit(
            "restart",
            attempt,
            after=after.kind.value,
            delay_s=round(delay, 3),
            profile=launch.profile,
            previous_profile=previous.profile,
            reason=following.reason,
            retry=following.retry.value if following.retry else None,
            **released,
        )
        say(
            f"restarting (attempt {attempt}, after {after.kind.value}) in {delay:.1f} s"
            + (f" with profile {launch.profile}" if launch.profile else "")
            + (f": {following.reason}" if following.retry else "")
        )
        # No budget runs while backing off: `health` must not judge the wait by the last attempt's silence.
        self._set_state(State.BACKOFF, attempt=attempt, budget=None, silent_s=None, next_attempt_ts=time.time() + delay)
        return self._sleep(delay)

    def _policy(self, launch: Launch) -> BudgetPolicy:
        return BudgetPolicy(
            startup_s=launch.startup_timeout,
            stall_s=launch.stall_timeout,
            factor=self.settings.learned_factor,
            floor_s=self.settings.learned_floor_s,
            min_samples=self.settings.learned_min_samples,
        )

    def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a stop signal, keeping state.json fresh for `health`; True when stopped."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop_signal is not None:
                return True
            self._publish()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return self._stop_signal is not None

    def _child_env(self, attempt: int, launch: Launch) -> Dict[str, str]:
        env = dict(ranks.TORCHRUN_DEFAULTS, **os.environ)
        env.update(launch.env)
        env.update(
            {
                heartbeat.HEARTBEAT_ENV: str(self.run_dir.heartbeat),
                heartbeat.ATTEMPT_ENV: str(attempt),
                heartbeat.RUN_DIR_ENV: str(self.run_dir.root),
                ranks.ERROR_FILE_ENV: str(self.run_dir.rank_error(attempt)),
                "TRAIN_STARTUP_TIMEOUT": str(launch.startup_timeout),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _attempt(self, attempt: int, launch: Launch, policy: BudgetPolicy) -> Outcome:
        self.attempt = attempt
        ranks.clear(self.run_dir)
        env = self._child_env(attempt, launch)
        try:
            # Popen from the main thread: the child's death signal is tied to the thread that forked it.
            proc = subprocess.Popen(
                list(launch.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=proctree.die_with_parent(),
            )
        except OSError as exc:
            self._emit("start", attempt, profile=launch.profile, argv=list(launch.argv), pid=None)
            say(f"cannot start {launch.argv[0]!r}: {exc.strerror or exc}")
            self._emit("crash", attempt, code=127, beats=0, last_output=[str(exc)])
            failed = Outcome(OutcomeKind.EXITED, code=127, detail={"last_output": [str(exc)]})
            self.counters = self.counters.counted(failed)
            return failed
        tee = OutputTee(proc.stdout, self.run_dir.attempt_log(attempt), self.spec.echo)
        tree = proctree.ProcessTree(proc.pid)
        beats = ranks.JobBeats(self.run_dir, policy, time.monotonic())
        watch = SilenceWatch(tree, env, Limits(launch.idle_timeout, launch.compile_cap))
        run = Running(attempt, launch, policy, proc, tree, tee, beats, watch)
        self._running = run
        launched_at = time.time()
        outcome = Outcome(OutcomeKind.EXITED)
        try:
            self._emit(
                "start",
                attempt,
                profile=launch.profile,
                argv=list(launch.argv),
                pid=proc.pid,
                startup_timeout_s=launch.startup_timeout,
                stall_timeout_s=launch.stall_timeout,
                idle_timeout_s=launch.idle_timeout,
                compile_cap_s=launch.compile_cap,
            )
            self._set_state(State.STARTING, attempt=attempt, profile=launch.profile, child_pid=proc.pid, launched_ts=launched_at)
            outcome = self._watch(run)
        finally:
            try:
                self._end_tree()
            finally:
                tee.close()
                self._running = None
        if outcome.crashed:
            outcome.detail["last_output"] = tee.tail_lines(20)
            self.counters = self.counters.counted(outcome)
            self._emit(
                "crash",
                attempt,
                code=outcome.code,
                beats=outcome.beats,
                first_beat_ts=outcome.first_beat_ts,
                first_step_ts=outcome.first_step_ts,
                last_beat=outcome.last_beat,
                last_output=tee.tail_lines(5),
                rank_failure=ranks.failure(self.run_dir.rank_error(attempt), tee.tail().decode(errors="replace")),
            )
            say(f"attempt {attempt} exited with status {outcome.code} after {outcome.beats} beat(s)")
        return outcome

    def _end_tree(self) -> Dict[str, List[int]]:
        """End the running attempt's whole tree and reap its root; what ``ProcessTree.terminate`` returns.

        Raises Stuck when a process outlives SIGKILL or the root cannot be reaped
        within ``REAP_S``: waiting on would hang the supervisor for good.
        """
        run = self._running
        if run is None:
            return {"terminated": [], "killed": [], "survivors": []}
        result: Dict[str, List[int]] = {"terminated": [], "killed": [], "survivors": []}
        with self._quiet(self.settings.grace_s + KILL_S + REAP_S):
            if run.tree.alive():
                result = run.tree.terminate(self.settings.grace_s)
            if result["survivors"]:
                raise proctree.stuck(result["survivors"])
            try:
                run.proc.wait(timeout=REAP_S)
            except subprocess.TimeoutExpired:
                raise proctree.stuck([run.proc.pid]) from None
        return result

    def _watch(self, run: Running) -> Outcome:
        outcome = Outcome(OutcomeKind.EXITED)
        tree, policy = run.tree, run.policy
        device_recorded = False
        while True:
            if self._stop_signal is not None:
                self._set_state(State.STOPPING)
                say(f"signal {self._stop_signal}: stopping the training tree (grace {self.settings.grace_s:.0f} s)")
                self._end_tree()
                outcome.kind = OutcomeKind.STOPPED
                return outcome
            code = run.proc.poll()
            now = time.monotonic()
            progressed = run.beats.poll(now)  # the beats that made progress: every rank's, under torchrun
            record = progressed[-1].record if progressed else outcome.last_beat
            faults.point("supervisor", **{k: (record or {}).get(k) for k in ("epoch", "step")}, hangs=self.hangs)
            for progress in progressed:
                self.progress.observe(run.attempt, progress.previous, progress.silent_s, progress.budget, progress.record)
            if progressed:
                run.watch.beat()
                outcome.beats += 1
                outcome.last_beat = record
                wall = time.time()
                if outcome.first_beat_ts is None:
                    outcome.first_beat_ts = wall
                if outcome.first_step_ts is None and record and ("step" in record or "batch" in record):
                    outcome.first_step_ts = wall
                if self.state is State.STARTING:
                    self._set_state(State.RUNNING, heartbeat=record)
                device = None if device_recorded else device_fields(record)
                if device is not None:
                    self._emit("device", run.attempt, **device)
                    device_recorded = True
            if code is not None:
                outcome.code = code
                return outcome
            lagging = run.beats.lagging(now)  # the job is as far as its slowest rank (or its one process)
            budget, silent = lagging.budget, lagging.silent_s
            stalled = self._judge_silence(run, outcome, budget, silent, lagging.beat)
            if stalled is not None:
                return stalled
            tree.scan()
            self._publish(
                budget={"name": budget.name, "seconds": run.watch.budget_s(budget)},  # extended while compiling
                silent_s=round(silent, 2),
                last_progress_ts=time.time() - silent,
                heartbeat=outcome.last_beat,
                learned=policy.learned(),
            )
            time.sleep(min(POLL_S, max(0.05, budget.seconds / 20)))

    def _judge_silence(
        self, run: Running, outcome: Outcome, budget: Budget, silent_s: float, silent_beat: Optional[Dict[str, Any]]
    ) -> Optional[Outcome]:
        """Judge the silence (:mod:`trainbox.silence`): record an extension, report a stall, or end the attempt.

        ``silent_beat``: the last beat of the rank that is silent (under torchrun), which the stall is about.
        """
        call = run.watch.look(silent_s, budget)
        if call.action is Action.EXTEND:
            self._publish(force=True, budget={"name": budget.name, "seconds": call.budget_s})  # `health` judges by it at once
            self._emit("extend", run.attempt, **extension(budget, call, silent_s))
            say(f"attempt {run.attempt} is compiling ({call.evidence[0]}): budget extended to {call.budget_s:.0f} s")
        if call.action is not Action.STALL or run.watch.reported:
            return None
        outcome.last_beat = silent_beat or outcome.last_beat
        if self.settings.on_stall == "report":  # observe mode: one report per silence, nothing killed
            run.watch.reported = True
            self._emit("stall", run.attempt, action="report", **self._report(run, outcome, budget, call, silent_s))
            return None
        return self._stalled(run, outcome, budget, call, silent_s)

    def _report(self, run: Running, outcome: Outcome, budget: Budget, call: Call, silent_s: float) -> Dict[str, Any]:
        """Announce a stall and write its incident report; the ``stall`` event's fields so far."""
        attempt, launch = run.attempt, run.launch
        by_rank = run.beats.report(time.monotonic())  # under torchrun: silent_ranks and each rank's last beat
        phase = (outcome.last_beat or {}).get("phase")
        say(stall_line(attempt, silent_s, budget, call, run.watch.limits, phase) + "; writing incident report")
        reason = {
            "attempt": attempt,
            "profile": launch.profile,
            "budget": budget.name,
            "budget_s": call.budget_s,
            "silent_s": round(silent_s, 3),
            "phase": phase,
        }
        detected = time.monotonic()
        where = self.run_dir.incident_dir(self.session, attempt)
        written: Dict[str, Any] = {"incident": str(where)}
        try:
            # Declared to `health` (trainbox.watchdog); _end_tree, which comes next, ends the declaration.
            self._publish(force=True, quiet_until_ts=time.time() + incident.time_limit(len(run.tree.alive())))
            summary = incident.write_incident(
                where,
                tree=run.tree,
                reason=dict(reason, **by_rank),
                last_beat=outcome.last_beat,
                output_tail=run.tee.tail(),
                dumps=self.run_dir.stack_dump,
                samples=run.watch.window.to_json(),
                diagnose=lambda stacks, kernel: run.watch.diagnose(call, stacks, kernel),
            )
            written["incident_bytes"] = summary["bytes"]
            say(f"incident written to {where} ({summary['write_s']:.1f} s)")
        except OSError as exc:  # a full disk: the report is lost, killing and restarting go on
            say(f"cannot write the incident report to {where}: {exc.strerror or exc}")
            written = {"incident": None, "incident_bytes": 0, "incident_error": f"{exc.strerror or exc}: {exc.filename or where}"}
        found = run.watch.diagnosis_fields(call)
        first = (found["evidence"] or ["no evidence"])[0]
        say(f"attempt {attempt} stall cause: {found['cause']} ({first})")
        self._publish(force=True, last_stall={"attempt": attempt, "cause": found["cause"], "evidence": first})
        at = restart.position(outcome.last_beat, launch.profile)
        fields = {k: v for k, v in reason.items() if k != "attempt"}
        return dict(
            fields,
            **found,
            **written,
            silent_ranks=by_rank.get("silent_ranks"),
            at=at,
            incident_s=round(time.monotonic() - detected, 3),
            learned=run.policy.learned(),
            beats=outcome.beats,
            first_beat_ts=outcome.first_beat_ts,
            first_step_ts=outcome.first_step_ts,
            last_beat=outcome.last_beat,
        )

    def _stalled(self, run: Running, outcome: Outcome, budget: Budget, call: Call, silent_s: float) -> Outcome:
        outcome.kind = OutcomeKind.STALLED
        self.counters = self.counters.counted(outcome)
        self._set_state(State.STALLED)
        report = self._report(run, outcome, budget, call, silent_s)
        diagnosed = time.monotonic()
        # The child may have ended by itself while the report was written: an exit 0 then is a success.
        code_before_kill = run.proc.poll()
        pids = [p.pid for p in run.tree.scan()]
        stuck: Optional[Stuck] = None
        try:
            result = self._end_tree()
        except Stuck as error:  # recorded as the stall's survivors first, then the run ends on it
            stuck = error
            result = {"killed": [p["pid"] for p in error.processes], "survivors": [p["pid"] for p in error.processes]}
        killed = time.monotonic()
        self._emit(
            "stall",
            run.attempt,
            action="restart",
            kill_s=round(killed - diagnosed, 3),
            killed_ts=round(time.time(), 3),
            sigkilled=result["killed"],
            survivors=result["survivors"],
            code_before_kill=code_before_kill,
            **report,
        )
        if stuck is not None:
            self._running = None  # nothing more can be done to it: the attempt's clean-up must not try for another grace
            raise stuck
        say(f"tree killed in {killed - diagnosed:.1f} s")
        outcome.detail.update(
            {k: report[k] for k in ("budget", "budget_s", "silent_s", "phase", "incident", "cause", "evidence", "at", "rule")},
            pids=pids,
        )
        if code_before_kill == 0:
            say(f"attempt {run.attempt} completed (exit status 0) while its incident report was written")
            outcome.kind, outcome.code = OutcomeKind.EXITED, 0
        return outcome

    # -- endings -----------------------------------------------------------
    def _signal_code(self) -> int:
        return ExitCode.for_signal(self._stop_signal or signal.SIGTERM)

    def _finish(self, attempt: int, code: int, state: State, reason: str, outcome: Optional[Outcome] = None) -> int:
        self._set_state(state)
        timing = {}
        if outcome is not None:
            timing = {"beats": outcome.beats, "first_beat_ts": outcome.first_beat_ts, "first_step_ts": outcome.first_step_ts}
        self._emit("exit", attempt, code=code, reason=reason, **timing, **self.counters.published())
        if state is State.SUCCEEDED:
            counts = self.counters
            say(f"completed after {attempt + 1} attempt(s) ({counts.stalls} stall(s), {counts.crashes} crash(es))")
        return code

    def _describe(self, outcome: Outcome, launch: Launch) -> str:
        profile = f" with profile {launch.profile}" if launch.profile else ""
        if outcome.kind is OutcomeKind.STALLED:
            d = outcome.detail
            phase = f" in phase {d['phase']!r}" if d.get("phase") else ""
            budget = f"{d['budget']} budget {d['budget_s']:.0f} s, silent {d['silent_s']:.0f} s"
            cause = f"cause {d['cause']}: {(d['evidence'] or ['no evidence'])[0]}; "
            return f"stall{phase}{profile} ({cause}{budget}, report {d['incident'] or 'not written'})"
        return f"exit status {outcome.code}{profile} after {outcome.beats} beat(s)"

    def _stuck(self, stuck: Stuck) -> int:
        """A process survived SIGKILL: nothing restarts while it holds the GPU; say so once and stop."""
        self._running = None  # it cannot be ended: do not try again on the way out
        self.state = State.STUCK
        reason = "process stuck in the kernel"
        with contextlib.suppress(OSError):
            self.events.emit("give_up", self.attempt, reason=reason, stuck=stuck.processes, **self.counters.published())
            self.events.emit("exit", self.attempt, code=stuck.code, reason=reason, **self.counters.published())
        with contextlib.suppress(OSError, ValueError):
            errors.report(stuck)
        return stuck.code

    def _hung_too_often(self) -> int:
        """The supervisors before this one hung ``self.hangs`` times in a row: give up rather than loop (trainbox.watchdog)."""
        self._set_state(State.GAVE_UP)
        reason = "supervisor hung"
        self._emit("give_up", 0, reason=reason, hangs=self.hangs, **self.counters.published())
        self._emit("exit", 0, code=ExitCode.GAVE_UP, reason=reason, **self.counters.published())
        say(
            f"giving up: the supervisor of this run hung {self.hangs} times in a row, each time ended by "
            f"`health --act`; its stacks are in {self.run_dir.incident_dir.directory}/*-supervisor.txt, the history in "
            f"{self.run_dir.events}. Find out why before running again (the run resumes from its last checkpoint)."
        )
        return ExitCode.GAVE_UP

    def _misconfigured(self, attempt: int, outcome: Outcome) -> int:
        self._set_state(State.MISCONFIGURED)
        self._emit("give_up", attempt, reason="misconfigured", **self.counters.published())
        self._emit("exit", attempt, code=ExitCode.MISCONFIGURED, reason="misconfigured", **self.counters.published())
        lines = outcome.detail.get("last_output") or ["(no output)"]
        say(
            "two attempts in a row ended before their first heartbeat: this is a configuration error, "
            "not a stall; fix it and run again. The child's last output:\n    " + "\n    ".join(lines)
        )
        return ExitCode.MISCONFIGURED

    def _give_up(self, attempt: int, history: List[str], reason: str) -> int:
        self._set_state(State.GAVE_UP)
        counts = self.counters
        self._emit("give_up", attempt, reason=reason, **counts.published())
        self._emit("exit", attempt, code=ExitCode.GAVE_UP, reason="gave up", **counts.published())
        say(
            f"giving up after {attempt + 1} attempts and {counts.restarts} restart(s) "
            f"({reason}; --max-restarts {self.settings.max_restarts}): {counts.stalls} stall(s), "
            f"{counts.crashes} crash(es). In order: " + "; ".join(history) + ". "
            f"Incident reports are in {self.run_dir.incident_dir.directory}, the history in {self.run_dir.events}."
        )
        return ExitCode.GAVE_UP

    # -- what the run leaves behind -------------------------------------------
    def _emit(self, event: str, attempt: int, **fields: Any) -> None:
        """Append to the run's history, which must not be lost: a full disk ends the run (DiskFull)."""
        try:
            self.events.emit(event, attempt, **fields)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFull.writing(self.run_dir.events, exc) from None
            raise

    # -- status for `health` and `invoke status` -----------------------------
    @contextlib.contextmanager
    def _quiet(self, seconds: float) -> Iterator[None]:
        """Work that may keep state.json unwritten for up to ``seconds``: declared to ``health`` (trainbox.watchdog)."""
        self._publish(force=True, quiet_until_ts=time.time() + seconds)
        try:
            yield
        finally:
            self._publish(force=True, quiet_until_ts=None)

    def _set_state(self, state: State, **fields: Any) -> None:
        self.state = state
        self._publish(force=True, **fields)

    def _publish(self, force: bool = False, **fields: Any) -> None:
        self._status.update(fields)
        now = time.monotonic()
        if not force and now - self._status_written < 1.0:
            return
        record = dict(
            self._status, **self.counters.published(), state=self.state.value, supervisor_pid=os.getpid(), updated_ts=time.time()
        )
        try:
            write_text_atomic(self.run_dir.state, json.dumps(record, sort_keys=True, default=str), fsync=False)
        except OSError:
            return  # best-effort (a full disk): `health` reads an old state as stale, and the next publish tries again
        self._status_written = now
