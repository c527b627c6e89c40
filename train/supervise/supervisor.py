"""The supervisor: run a child, notice when it stops making progress, diagnose, kill, restart.

Shaped after torchelastic's agent: a spec validated on creation, a state enum that documents the machine
(:class:`trainbox.rundir.state.State`), and a ``run()`` that always cleans up; and after gunicorn's arbiter: a
loop of named verbs. The :class:`Supervisor` only conducts: each attempt is run and watched by a
:class:`~trainbox.supervise.monitor.Monitor` (a child tree in an :class:`~trainbox.supervise.attempt.Attempt`,
a stall handled by :mod:`trainbox.supervise.stalls.stall`), what comes next is decided by the planner
(:mod:`trainbox.supervise.planner`: which launch) and the policy (:func:`trainbox.supervise.policy.decide`:
whether and when), everything is written down by the :class:`~trainbox.supervise.record.Record`, and every
ending goes through :meth:`Supervisor._end`, so each writes its ``exit`` the same way. Presentation is passed
in (``SupervisorSpec.on_end``, the CLI's HTML report; ``on_publish``, its metrics textfile): the core never
imports it. With ``--notify`` the record tells a :class:`~trainbox.supervise.notify.notifier.Notifier` every event
(:func:`trainbox.supervise.notify.notifier.attach`), which is closed as the run ends, and whose process groups the attempts'
trees leave out.

What the supervisor must survive, and how:

* another supervisor on the same directory: :mod:`trainbox.rundir.lock` refuses it;
* its own death: the child dies with it (:func:`trainbox.system.proctree.die_with_parent`), and the rest of the
  attempt's session with its guard (:mod:`trainbox.system.guard`: a forkserver, its workers, the resource tracker);
* its own hang: it promises ``health`` a fresh ``state.json`` and declares longer
  work beforehand; ``health --act`` ends it when it breaks that promise
  (:mod:`trainbox.supervise.watchdog`, :mod:`trainbox.supervise.health`);
* a reader that goes away (``| head``, a closed terminal) or a full disk under
  the log: :class:`OutputTee` stops echoing or logging but never stops draining
  the child's pipe, which would block the child and fake a stall (:mod:`trainbox.supervise.output.reader`);
* a full disk: ``state.json``, the attempt logs and incident reports are
  best-effort and killing and restarting go on without them; only the run's
  history (``events.jsonl``) must be written, and when it cannot be the
  supervisor ends the tree and exits ``ExitCode.DISK_FULL`` with one line;
* a run directory whose content is hostile (issue 33): everything in it is read and written through
  :mod:`trainbox.rundir.safe`; an ``events.jsonl`` it refuses (a link, a FIFO, a folder) is one line and exit 2,
  before anything starts when it is found at the start, else as the run's end (state ``refused``);
* a process that survives SIGKILL (D state in a hung driver): waiting for it
  would hang forever, so the supervisor gives up with ``ExitCode.STUCK`` and
  one line naming it and its kernel wait channel (a reboot is needed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Protocol, Tuple

from trainbox import errors, interrupt
from trainbox.errors import DiskFull, ExitCode, Stuck, TrainboxError, say
from trainbox.rundir.events import HistoryRefused, history
from trainbox.rundir.first_start import first_start
from trainbox.rundir.layout import RunDir
from trainbox.rundir.lock import RunLock
from trainbox.rundir.safe import Refusal
from trainbox.rundir.state import State
from trainbox.supervise import endings, gpu_release, watchdog
from trainbox.supervise.monitor import Monitor
from trainbox.supervise.notify import notifier
from trainbox.supervise.pace.watch import PaceWatch
from trainbox.supervise.planner import Launch, Next, Planner
from trainbox.supervise.policy import Outcome, OutcomeKind, Retry, Verdict, decide
from trainbox.supervise.record import Listener, Record
from trainbox.supervise.resume.resumer import Resumer, resumed_words
from trainbox.supervise.settings import SupervisorSettings
from trainbox.supervise.stalls.budgets import BudgetPolicy
from trainbox.system import proctree


def _restart_line(number: int, after: Outcome, following: Next, launch: Launch, delay: float) -> str:
    """``restarting (attempt 1, after stalled) in 2.0 s with profile P: REASON, resuming from PATH (step N)``."""
    return (
        f"restarting (attempt {number}, after {after.kind.value}) in {delay:.1f} s"
        + (f" with profile {launch.profile}" if launch.profile else "")
        + (f": {following.reason}" if following.retry else "")
        + resumed_words(launch.resumed)
    )


class Attempts(Protocol):
    """What the loop runs each attempt through: the real :class:`Monitor`, or a test's stand-in."""

    def run(self, number: int, launch: Launch, policy: BudgetPolicy) -> Outcome: ...


@dataclass(frozen=True)
class SupervisorSpec:
    """What to supervise (``planner``), where (``run_dir``) and how (``settings``, validated on creation).

    ``on_end`` runs once as the run ends (not when the disk is full), with its run directory: the CLI passes the
    HTML report's refresh there, so the supervisor itself never imports presentation code. ``on_publish`` runs as
    state.json is rewritten (:class:`~trainbox.supervise.record.Record`: at each forced publish, the last one
    included, and otherwise every few seconds): the CLI passes the metrics textfile's refresh there.
    """

    run_dir: Path
    planner: Planner
    settings: SupervisorSettings = field(default_factory=SupervisorSettings)
    echo: bool = True
    on_end: Optional[Callable[[RunDir], None]] = None
    on_publish: Optional[Callable[[RunDir], None]] = None
    #: The name of the command whose run this is (state.json's ``command``: trainbox.rundir.owner), when known.
    command: Optional[str] = None
    #: The command line that goes on with this run, said when a stop signal stops it.
    resume: str = ""
    #: Told every event after it is written (:meth:`Record.listen`): what a job of several nodes adds (trainbox.job).
    listeners: Tuple[Listener, ...] = ()


class Supervisor:
    """Runs attempts until one succeeds, the policy gives up, or a signal stops it; see the module docstring."""

    def __init__(self, spec: SupervisorSpec, attempts: Optional[Callable[[Record], Attempts]] = None) -> None:
        self.spec = spec
        self.settings = spec.settings
        self.run_dir = RunDir(Path(spec.run_dir))
        self.record = Record(self.run_dir, spec.on_publish)
        for listener in spec.listeners:
            self.record.listen(listener)
        #: The run's pace, kept across attempts (trainbox.supervise.pace.watch): a slowdown outlives a restart.
        self.pace = PaceWatch(self.record, self.settings)
        #: Names this supervisor's incident reports apart from earlier ones in the same directory.
        self.session = 0
        #: The attempt under way (or the last one), for the events written at the end.
        self.attempt = 0
        #: ``health --act`` ended this many supervisors of the run in a row before this one (trainbox.supervise.watchdog).
        self.hangs = 0
        self._attempts = attempts
        self._stop_signal: Optional[int] = None
        #: The stop has been told (once: as the tree is ended, or as the run ends when no tree was running).
        self._stop_said = False
        self._notifier: Optional[notifier.Notifier] = None

    def run(self) -> int:
        """Supervise until success, give-up or a stop signal; return the exit code.

        Raises UserError, having written nothing, when another supervisor holds the run directory.
        """
        lock = RunLock(self.run_dir)
        lock.acquire()
        past = history(self.run_dir.events)
        if past.refused not in (None, Refusal.MISSING):
            lock.release()
            raise HistoryRefused.at(self.run_dir.events, past.refused or Refusal.UNREADABLE)
        self.session = self.run_dir.new_session(time.time())
        began = first_start(self.run_dir, past.records, time.time())  # a run's checkpoints are those written since
        self.resumer = Resumer(self.settings, self.run_dir.root, began.ts, new=began.new)  # resume/resumer.py
        if self.settings.notify:  # after the lock: a supervisor refused there tells nobody anything
            self._notifier = notifier.attach(self.record, self.settings.notify_command, self.settings.notify_events, self._at)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in interrupt.STOP_SIGNALS}
        owned = {"command": self.spec.command} if self.spec.command else {}
        self.record.publish(**watchdog.identity(self.session, self.settings.hung_after_s), **owned)
        own_stacks = watchdog.install_stack_dump(self.run_dir, os.getpid())
        self.hangs = watchdog.hangs_in_a_row(past.records)
        code: int = ExitCode.GAVE_UP
        try:
            code = self._hung_too_often() if self.hangs >= watchdog.MAX_HANGS else self._loop()
        except Stuck as stuck:
            code = self._end(State.STUCK, stuck.code, "process stuck in the kernel", error=stuck, stuck=stuck.processes)
        except DiskFull as full:
            code = self._end(State.DISK_FULL, full.code, "disk full", error=full)
        except HistoryRefused as refused:
            code = self._end(State.REFUSED, refused.code, "history refused", error=refused)
        finally:
            self.record.publish(force=True, exit_code=code)
            if self.record.state not in (State.DISK_FULL, State.REFUSED) and self.spec.on_end is not None:
                self.spec.on_end(self.run_dir)  # best-effort, under our signal handlers (a Ctrl-C only sets a flag)
            if self._notifier is not None:
                self._notifier.close(notifier.CLOSE_S)  # the exit notification goes out (bounded; it ran during the report)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            watchdog.remove_stack_dump(self.run_dir, own_stacks)
            lock.release()
        return code

    # -- the loop ----------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    def _at(self) -> int:
        return self.attempt

    def _stop_signal_now(self) -> Optional[int]:
        return self._stop_signal

    def _notifier_groups(self) -> FrozenSet[int]:
        return self._notifier.groups() if self._notifier is not None else frozenset()

    def _monitor(self, record: Record) -> Attempts:
        """The real attempts: child trees, watched. Orphans of those trees (``setsid`` escapees) are ours to reap."""
        proctree.become_subreaper()
        return Monitor(
            record,
            self.settings,
            self._stop_signal_now,
            self.session,
            self.pace,
            self.hangs,
            self.spec.echo,
            self._notifier_groups,
            self.spec.planner.at_checkpoint,
            self._say_stop,
            self.resumer.newest,
        )

    def _say_stop(self, number: int, beat: Optional[Dict[str, Any]], running: bool = True) -> None:
        """Say the stop's one line (:func:`endings.stopped_line`): as attempt ``number``'s tree is ended (``running``),
        or as the run ends when no tree was running."""
        self._stop_said = True
        grace = self.settings.grace_s if running else None
        say(endings.stopped_line(self._stop_signal or signal.SIGTERM, number, beat, self.run_dir, self.spec.resume, grace))

    def _stopped(self, outcome: Outcome, **fields: Any) -> int:
        """End the run stopped by a signal, said once (:meth:`_say_stop`)."""
        if not self._stop_said:
            self._say_stop(self.attempt, outcome.last_beat, running=False)
        return self._end(State.STOPPED, self._signal_code(), "stopped by signal", **fields)

    def _loop(self) -> int:
        planner = self.spec.planner
        attempts = (self._attempts or self._monitor)(self.record)
        launch = planner.first()
        running = self.resumer.launch(launch, restart=False)
        policy = self._policy(launch)
        history: List[str] = []
        while True:
            outcome = attempts.run(self.attempt, running, policy)
            if self._stop_signal is not None and not outcome.succeeded:
                if outcome.kind is OutcomeKind.MOVED:  # it came as a probe ended the tree: stopped, not moved
                    self.record.set_state(State.STOPPING)
                outcome.kind = OutcomeKind.STOPPED  # it came as the attempt ended (while a report was written): no restart
            if outcome.kind is OutcomeKind.MOVED:  # a probe at a checkpoint: no stall, crash or restart to count
                following = outcome.detail["next"]
                running = self.resumer.launch(following.launch, restart=True, after=outcome)
                if self._probe(self.attempt + 1, launch, following, running):
                    return self._stopped(outcome)
                self.attempt, launch, policy = self.attempt + 1, following.launch, self._policy(following.launch)
                continue
            following = None if outcome.succeeded or outcome.kind is OutcomeKind.STOPPED else planner.after(outcome)
            last_rung = following is None or (following.launch.profile, following.launch.argv) == (launch.profile, launch.argv)
            decision = decide(outcome, self.record.counters, self.settings, last_rung)
            self.record.counters = decision.counters
            if decision.verdict is Verdict.STOPPED:
                return self._stopped(outcome, **outcome.timing())
            if decision.verdict is Verdict.SUCCEEDED:
                return self._end(State.SUCCEEDED, ExitCode.OK, "completed", self._completed_line(), **outcome.timing())
            assert following is not None  # any other ending was a failure, and the planner has planned its retry
            history.append(endings.describe(outcome, launch))
            if decision.verdict is Verdict.MISCONFIGURED:
                line = endings.misconfigured_line(outcome)
                return self._end(State.MISCONFIGURED, ExitCode.MISCONFIGURED, "misconfigured", line, give_up="misconfigured")
            if decision.verdict is Verdict.GAVE_UP:
                line, code = self._gave_up_line(history, decision.reason, outcome), endings.gave_up_code(outcome, decision.reason)
                return self._end(State.GAVE_UP, code, "gave up", line, give_up=decision.reason)
            if following.launch.profile != launch.profile or following.launch.startup_timeout != launch.startup_timeout:
                policy = self._policy(following.launch)
            running = self.resumer.launch(following.launch, restart=True, after=outcome)
            if self._back_off(self.attempt + 1, outcome, launch, following, running, decision.delay_s):
                return self._stopped(outcome)
            self.attempt += 1
            launch = following.launch

    def _back_off(self, number: int, after: Outcome, previous: Launch, following: Next, launch: Launch, delay: float) -> bool:
        """Announce attempt ``number`` (``launch``: as it runs) and wait ``delay`` s before it; True when a stop came."""
        released: Dict[str, Any] = {}
        if following.retry is Retry.GPU_RELEASE:
            released = gpu_release.wait(after.detail.get("pids", []), self._sleep, before_mib=after.detail.get("gpu_before_mib"))
        self.record.emit(
            "restart",
            number,
            after=after.kind.value,
            delay_s=round(delay, 3),
            profile=launch.profile,
            previous_profile=previous.profile,
            reason=following.reason,
            retry=following.retry.value if following.retry else None,
            resumed=launch.resumed,
            ladder=following.ladder,
            **released,
        )
        say(_restart_line(number, after, following, launch, delay))
        # No budget runs while backing off: `health` must not judge the wait by the last attempt's silence.
        self.record.set_state(State.BACKOFF, attempt=number, budget=None, silent_s=None, next_attempt_ts=time.time() + delay)
        return self._sleep(delay)

    def _probe(self, number: int, previous: Launch, following: Next, launch: Launch) -> bool:
        """Announce attempt ``number``, the ladder's probe from ``previous`` (``launch``: as it runs); True when stopped."""
        fields = dict(profile=launch.profile, previous_profile=previous.profile, reason=following.reason, resumed=launch.resumed)
        self.record.emit("probe", number, **fields, ladder=following.ladder)
        say(f"attempt {number}: probing profile {launch.profile}: {following.reason}")
        self.record.set_state(State.BACKOFF, attempt=number, budget=None, silent_s=None, next_attempt_ts=time.time())
        return self._stop_signal is not None

    def _policy(self, launch: Launch) -> BudgetPolicy:
        return BudgetPolicy(
            startup_s=launch.startup_timeout,
            stall_s=launch.stall_timeout,
            factor=self.settings.learned_factor,
            floor_s=self.settings.learned_floor_s,
            min_samples=self.settings.learned_min_samples,
            bound_s=launch.stall_timeout if launch.stall_given else None,
        )

    def _sleep(self, seconds: float) -> bool:
        """Sleep, waking early on a stop signal, keeping state.json fresh for `health`; True when stopped."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop_signal is not None:
                return True
            self.record.publish()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return self._stop_signal is not None

    # -- the one way to end ------------------------------------------------------
    def _signal_code(self) -> int:
        return ExitCode.for_signal(self._stop_signal or signal.SIGTERM)

    def _end(
        self,
        state: State,
        code: int,
        reason: str,
        line: str = "",
        give_up: Optional[str] = None,
        error: Optional[TrainboxError] = None,
        **fields: Any,
    ) -> int:
        """End the run in ``state``: ``give_up`` (its reason) and ``exit`` written the same way for every ending.

        ``fields`` go on the ``give_up`` event when there is one, else on ``exit``. The endings that are about the
        disk or the kernel already (``error``) write best-effort and report the error's line; the others say ``line``.
        """
        self.record.set_state(state)
        emit = self.record.emit if error is None else self.record.emit_best_effort
        counts = dict(self.record.counters.published(), **self.pace.summary(time.time()))
        if give_up is not None or state is State.STUCK:
            emit("give_up", self.attempt, reason=give_up or reason, **fields, **counts)
            fields = {}
        emit("exit", self.attempt, code=code, reason=reason, **fields, **counts)
        if error is not None:
            with contextlib.suppress(OSError, ValueError):  # stderr may be gone too
                errors.report(error)
        elif line:
            say(line)
        return code

    def _hung_too_often(self) -> int:
        """The supervisors before this one hung ``self.hangs`` times in a row: give up rather than loop (see watchdog)."""
        line = endings.hung_too_often_line(self.hangs, self.run_dir)
        return self._end(State.GAVE_UP, ExitCode.GAVE_UP, "supervisor hung", line, give_up="supervisor hung", hangs=self.hangs)

    def _completed_line(self) -> str:
        return endings.completed_line(self.attempt + 1, self.record.counters, self.pace.summary(time.time()))

    def _gave_up_line(self, history: List[str], reason: str, last: Outcome) -> str:
        counts, slow = self.record.counters, self.pace.summary(time.time())
        return endings.gave_up_line(
            self.attempt + 1, counts, self.settings.max_restarts, history, reason, last, self.run_dir, slow
        )
