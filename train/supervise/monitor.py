"""The watch over one attempt: progress in, silences judged, until the child exits, stalls or is told to stop.

:meth:`Monitor.run` starts an :class:`~trainbox.supervise.attempt.Attempt` and polls it every ``POLL_S`` at most:
the progress it made (its beats, every rank's under torchrun, or while it has not beaten the counters its output
shows: :mod:`trainbox.supervise.output.source` decides which counts) goes to the progress log; an attempt that
shows neither is told once how to give progress; the silence of the slowest rank is judged by
:class:`~trainbox.supervise.stalls.silence.SilenceWatch` (a new silence when that rank changes or makes progress, not
when any other rank does; keep watching, extend for a compile, let a busy tree go on past a learned budget
(:mod:`trainbox.supervise.stalls.busy`), or a stall, which :mod:`trainbox.supervise.stalls.stall` handles); the
pace of that progress is the :class:`~trainbox.supervise.pace.watch.PaceWatch`'s (a run that became slow, and with
``--on-slow restart`` an attempt ended for it); state.json is kept fresh for ``health``. What it returns is the
attempt's :class:`~trainbox.supervise.policy.Outcome`; what happens next is the supervisor's and the policy's business, not
the monitor's.

The supervisor's loop runs attempts through this one class, which is why an in-process test can put a stand-in
in its place (``tests/supervise/test_loop.py``) and script whole runs in milliseconds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from trainbox import faults
from trainbox.errors import say
from trainbox.rundir.events import device_fields
from trainbox.rundir.progress import ProgressLog
from trainbox.rundir.state import State
from trainbox.supervise import crashes, endings, ranks
from trainbox.supervise.attempt import Attempt, CannotStart
from trainbox.supervise.output.progress import HOW_TO_GIVE_PROGRESS, with_user_patterns
from trainbox.supervise.output.source import notice_due, output_works
from trainbox.supervise.pace.watch import PaceWatch, SlowRestart
from trainbox.supervise.planner import Launch, Next
from trainbox.supervise.policy import Outcome, OutcomeKind
from trainbox.supervise.record import Record
from trainbox.supervise.resume.checkpoints import Checkpoint
from trainbox.supervise.resume.notes import ResumeNotes
from trainbox.supervise.settings import SupervisorSettings
from trainbox.supervise.stalls import stall
from trainbox.supervise.stalls.budgets import BudgetPolicy
from trainbox.supervise.stalls.silence import Action, allow_line, extension

#: Longest pause between two looks at the heartbeat (shorter when the budget is short: budget / 20).
POLL_S = 0.5
#: Exit status of a command that cannot be started, as a shell reports "command not found".
NOT_STARTED = 127


class Monitor:
    """Runs attempts and watches each one to its end (one per call of :meth:`run`)."""

    def __init__(
        self,
        record: Record,
        settings: SupervisorSettings,
        stop_signal: Callable[[], Optional[int]],
        session: int,
        pace: PaceWatch,
        hangs: int = 0,
        echo: bool = True,
        foreign_groups: Callable[[], FrozenSet[int]] = frozenset,
        at_checkpoint: Callable[[Outcome], Optional[Next]] = lambda outcome: None,
        stopping: Optional[Callable[[int, Optional[Dict[str, Any]]], None]] = None,
        newest_checkpoint: Callable[[Launch], Optional[Checkpoint]] = lambda launch: None,
    ) -> None:
        self.record = record
        #: Says what a stop signal stops, given the attempt and its last beat (the supervisor's one line).
        self.stopping = stopping or self._say_stopping
        #: The newest checkpoint and the work done again after a restart, for ``status`` (trainbox.supervise.resume).
        self.resume_notes = ResumeNotes(record, newest_checkpoint)
        #: The planner's answer to a checkpoint the running attempt wrote: a launch to move to (a probe), or None.
        self.at_checkpoint = at_checkpoint
        #: The supervisor's process groups that are not any attempt's (the notifiers in flight).
        self.foreign_groups = foreign_groups
        self.settings = settings
        self.stop_signal = stop_signal
        self.session = session
        self.hangs = hangs
        self.echo = echo
        self.progress = ProgressLog(record.run_dir.progress)
        self.pace = pace
        #: The lines each attempt's output is read for: the user's --progress-pattern first (checked already).
        self.patterns = with_user_patterns(settings.progress_patterns)
        #: Whether this run was told that an attempt shows no progress (once per run).
        self.noticed = False

    def run(self, number: int, launch: Launch, policy: BudgetPolicy) -> Outcome:
        """Start attempt ``number`` and watch it to its end; its outcome (a crash recorded as one)."""
        try:
            with Attempt(
                number, launch, policy, self.record, self.settings.grace_s, self.echo, self.patterns, self.foreign_groups
            ) as attempt:
                self.pace.begin(number, launch, time.time())
                try:
                    outcome = self._watch(attempt)
                finally:
                    self.pace.finish(time.time())
                    self.resume_notes.look(attempt.launch, time.monotonic(), last=True)
                tail = attempt.tee
            self.resume_notes.ended(outcome.last_beat)
        except CannotStart as exc:
            return self._not_started(number, launch, str(exc))
        outcome.detail["progress_source"] = attempt.progress.source.value
        outcome.detail["last_output"] = tail.tail_lines(20)
        outcome.detail["log"] = str(self.record.run_dir.attempt_log(number))  # what the planner may read (ladder.defaults)
        if outcome.crashed:
            output = crashes.Output(tail.tail(), attempt.progress.output.latest()[0])
            rank_failure = ranks.failure(self.record.run_dir.rank_error(number), output.tail)
            outcome.detail.update(crashes.named(outcome, launch.profile, Path(outcome.detail["log"]), rank_failure, output))
            self._crashed(number, outcome, tail.tail_lines(5), rank_failure)
        return outcome

    def _not_started(self, number: int, launch: Launch, why: str) -> Outcome:
        self.record.set_state(State.STARTING, attempt=number, profile=launch.profile, child_pid=None)
        self.record.emit("start", number, profile=launch.profile, argv=list(launch.argv), pid=None)
        say(f"cannot start {launch.argv[0]!r}: {why}")
        failed = Outcome(OutcomeKind.EXITED, code=NOT_STARTED, detail={"last_output": [why]})
        self._crashed(number, failed, [why], None)
        return failed

    def _crashed(self, number: int, outcome: Outcome, last_lines: List[str], rank_failure: Optional[Dict[str, Any]]) -> None:
        self.record.count(outcome)
        self.record.set_state(State.CRASHED)
        fields = dict(code=outcome.code, **outcome.timing(), last_beat=outcome.last_beat, last_output=last_lines)
        self.record.emit("crash", number, **fields, rank_failure=rank_failure)
        say(f"attempt {number} exited with status {outcome.code} after {outcome.beats} beat(s)")

    def _started(self, attempt: Attempt) -> None:
        launch = attempt.launch
        self.record.emit(
            "start",
            attempt.number,
            profile=launch.profile,
            argv=list(launch.argv),
            pid=attempt.proc.pid,
            resumed=launch.resumed,
            startup_timeout_s=launch.startup_timeout,
            stall_timeout_s=launch.stall_timeout,
            idle_timeout_s=launch.idle_timeout,
            compile_cap_s=launch.compile_cap,
            slow_ratio=launch.slow_ratio,
        )
        self.record.set_state(
            State.STARTING, attempt=attempt.number, profile=launch.profile, child_pid=attempt.proc.pid, launched_ts=time.time()
        )
        if (launch.resumed or {}).get("from"):  # said before its output: the work done again is said once it is known
            say(f"attempt {attempt.number} resumed from {launch.resumed['from']}")

    def _watch(self, attempt: Attempt) -> Outcome:
        self._started(attempt)
        outcome = Outcome(OutcomeKind.EXITED, started_ts=time.time())
        device_recorded = False
        while True:
            if self.stop_signal() is not None:
                return self._stop(attempt, outcome)
            code = attempt.exit_code()
            now = time.monotonic()
            progressed, saved = self._progress(attempt, outcome, now)
            if progressed and not device_recorded:
                device_recorded = self._device(attempt, outcome.last_beat)
            if code is not None:
                return self._exited(attempt, outcome, code)
            if saved and self._moved(attempt, outcome):
                return outcome
            lagging = attempt.progress.lagging(now)  # the job is as far as its slowest rank (or its one process)
            attempt.watch.judging(lagging.rank, lagging.silent_s)  # a new silence is judged: the last one's window goes
            stalled = self._judge_silence(attempt, outcome, lagging)
            if stalled is not None:
                return stalled
            self._notice(attempt, now)
            self.resume_notes.look(attempt.launch, now)
            tree = [process.pid for process in attempt.tree.scan()]
            slow = self.pace.poll(tree, attempt.proc.pid, time.time())
            if slow is not None:
                return self._slow_restart(attempt, outcome, slow)
            self.record.publish(
                # the budget in force: extended while a compile shows progress
                budget={"name": lagging.budget.name, "seconds": attempt.watch.budget_s(lagging.budget)},
                silent_s=round(lagging.silent_s, 2),
                last_progress_ts=time.time() - lagging.silent_s,
                heartbeat=outcome.last_beat,
                progress_source=attempt.progress.source.value,
                learned=attempt.policy.learned(),
                busy=attempt.watch.allowed(),  # a busy silence past its suspicion, for `status`
            )
            time.sleep(min(POLL_S, max(0.05, lagging.budget.seconds / 20)))

    def _exited(self, attempt: Attempt, outcome: Outcome, code: int) -> Outcome:
        """The child exited with ``code``: what it printed up to its end is read first, so that its last counter is
        where it ended (a crash's place), not the one the last look happened to see."""
        attempt.tee.read_to_end()
        self._progress(attempt, outcome, time.monotonic())
        outcome.code = code
        return outcome

    def _stop(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        self._progress(attempt, outcome, time.monotonic())  # the newest position read (the bar drawn), not the last look's
        self.record.set_state(State.STOPPING)
        attempt.tee.end_echo()  # the line that says the stop is a line of its own, after the bar as it was
        self.stopping(attempt.number, outcome.last_beat)
        attempt.end_tree()
        outcome.kind = OutcomeKind.STOPPED
        return outcome

    def _say_stopping(self, number: int, beat: Optional[Dict[str, Any]]) -> None:
        signum = self.stop_signal() or signal.SIGTERM
        say(endings.stopped_line(signum, number, beat, self.record.run_dir, "", self.settings.grace_s))

    def _slow_restart(self, attempt: Attempt, outcome: Outcome, slow: SlowRestart) -> Outcome:
        """``--on-slow restart``: end the slow attempt's tree; the supervisor restarts it (it resumes from its checkpoint)."""
        self.record.set_state(State.SLOW)
        saved = f"its checkpoint written in {slow.checkpoint_s:g} s" if slow.checkpoint_s is not None else "no checkpoint"
        say(
            f"attempt {attempt.number} has been slow for {slow.slow_s:.0f} s, suspect {slow.suspect} inside the run "
            f"({slow.evidence[0]}), {saved}: ending it to restart (--on-slow restart)"
        )
        pids = [process.pid for process in attempt.tree.scan()]
        attempt.end_tree()
        outcome.kind = OutcomeKind.SLOW
        outcome.detail.update(suspect=slow.suspect, evidence=list(slow.evidence), slow_s=slow.slow_s, pids=pids)
        outcome.detail.update(checkpoint_s=slow.checkpoint_s)
        return outcome

    def _notice(self, attempt: Attempt, now: float) -> None:
        """Say once per run that an attempt shows neither beats nor a counter, how it is judged, and what to do; and
        what its output reader says of how its counter is judged (a percentage-only bar)."""
        for line in attempt.progress.output.notices():
            say(f"attempt {attempt.number}: {line}")
        if self.noticed or not notice_due(attempt.progress.source, now - attempt.started, attempt.launch.startup_timeout):
            return
        self.noticed = True
        say(
            f"attempt {attempt.number}: no beat and no progress counter in its output after {now - attempt.started:.0f} s, "
            f"so it is judged by its process tree's activity (idle, compiling) and its {attempt.launch.startup_timeout:g} s "
            f"startup budget. {HOW_TO_GIVE_PROGRESS}"
        )

    def _moved(self, attempt: Attempt, outcome: Outcome) -> bool:
        """Ask the planner about the checkpoint just written; on a probe end the tree (``OutcomeKind.MOVED``, the
        launch to move to in ``detail["next"]``) and say True."""
        following = self.at_checkpoint(outcome)
        if following is None:
            return False
        attempt.end_tree()
        outcome.kind = OutcomeKind.MOVED
        outcome.detail["next"] = following
        return True

    def _progress(self, attempt: Attempt, outcome: Outcome, now: float) -> Tuple[bool, bool]:
        """Take in the progress made since the last look; whether there was any, and whether a beat told of a new
        checkpoint."""
        progressed = attempt.progress.poll(now)  # beats that made progress (every rank's), or a counter that advanced
        record = progressed[-1].record if progressed else outcome.last_beat
        faults.point("supervisor", **{k: (record or {}).get(k) for k in ("epoch", "step")}, hangs=self.hangs)
        for progress in progressed:
            self.progress.observe(attempt.number, progress.previous, progress.silent_s, progress.budget, progress.record)
            self.pace.observe(progress.record, time.time())
        if not progressed:
            return False, False
        self.resume_notes.progressed(attempt.number, attempt.launch, attempt.progress)
        saved = outcome.saw(record, time.time())
        if self.record.state is State.STARTING:
            self.record.set_state(State.RUNNING, heartbeat=record)
        else:
            self.record.publish(heartbeat=record)  # state.json's last counter: up to the exit, written as the run ends
        return True, saved

    def _device(self, attempt: Attempt, beat: Optional[Dict[str, Any]]) -> bool:
        """Record the first beat that says which device the child found (once per attempt); whether it did."""
        device = device_fields(beat)
        if device is not None:
            self.record.emit("device", attempt.number, **device)
        return device is not None

    def _judge_silence(self, attempt: Attempt, outcome: Outcome, lagging: ranks.Standing) -> Optional[Outcome]:
        """Judge the slowest rank's silence: record an extension, report a stall, or end the attempt on one."""
        budget, silent_s = lagging.budget, lagging.silent_s
        call = attempt.watch.look(silent_s, budget)
        if call.action is Action.EXTEND:
            # `health` must judge by the extended budget at once, not a second later
            self.record.publish(force=True, budget={"name": budget.name, "seconds": call.budget_s})
            self.record.emit("extend", attempt.number, **extension(budget, call, silent_s))
            say(f"attempt {attempt.number} is compiling ({call.evidence[0]}): budget extended to {call.budget_s:.0f} s")
        if call.action is Action.ALLOW:  # `health` and `status` see the allowance at once
            allowed = attempt.watch.allowed() or {}
            self.record.publish(force=True, budget={"name": budget.name, "seconds": call.budget_s}, busy=allowed)
            say(allow_line(attempt.number, budget, call, silent_s, allowed.get("guess", "")))
        if call.action is not Action.STALL or attempt.watch.reported:
            return None
        self.pace.stalled()
        outcome.last_beat = lagging.beat or outcome.last_beat  # the stall is about the silent rank's last beat
        quiet_s = None if attempt.tee.last_output is None else time.monotonic() - attempt.tee.last_output
        outcome.output_works = outcome.beats == 0 and output_works(silent_s, quiet_s)
        if self.settings.on_stall == "report":  # observe mode: one report per silence, nothing killed
            attempt.watch.reported = True
            stall.report_only(attempt, stall.examine(attempt, outcome, budget, call, silent_s, self.session))
            return None
        return stall.stalled(attempt, outcome, budget, call, silent_s, self.session)
