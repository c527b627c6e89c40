"""What the supervisor does after an attempt ends: a pure, typed policy.

``decide(outcome, counters, settings)`` looks at how the attempt ended and at
the run's counters so far, and returns a ``Decision``: finish (succeeded,
stopped), give up (misconfigured, restart budget spent) or restart after a
delay, together with the counters to carry on with. It reads no clock, file or
process, so ``tests/supervise/test_policy.py`` scripts whole runs as outcome sequences
in milliseconds; the supervisor loop only carries out what it returns.

The rules, in the order they are applied:

1. stopped by a signal: ``STOPPED``; exit status 0: ``SUCCEEDED``;
2. the **no-beat rule**: a second attempt *in a row* that ended before its
   first beat is ``MISCONFIGURED``. One such attempt can be bad luck (a startup
   that stalled on a slow disk or a busy GPU, a kill from outside), so it is
   restarted; two in a row with the same command mean the command cannot start
   (a typo, an import error, bad arguments), and restarting again would spend
   the restart budget and bury the error under identical reports. A counter
   that advanced in the child's output is a beat here too
   (:mod:`trainbox.supervise.output.source`): an attempt whose output advanced
   made progress. One exception: when the second attempt's output was still
   coming as it was stopped (``Outcome.output_works``), the command ran and only
   its progress could not be read, so the run ``GAVE_UP`` with
   :data:`NO_PROGRESS_READ` (and is told how to give progress) instead of being
   called a configuration error;
3. the **repeat rule**: a stall at the same place as the attempt before (the
   same heartbeat position, :func:`position`, on the same profile) when there is
   nothing else left to try (``last_rung``) is ``GAVE_UP`` at once. Ray calls a
   hang terminal because "a deterministic hang would usually just hang again";
   the second identical stall proves it, and the remaining restarts would only
   repeat it;
4. the **crash repeat rule**: a crash with the same exception line at the same place (or before any progress)
   as the attempt before (``Outcome.detail``'s ``exception`` and ``crash_at``, named by
   :mod:`trainbox.supervise.crashes`) when there is nothing else to try is ``GAVE_UP`` at once: a crash that
   repeats word for word repeats at every restart, and the back-off would only delay the error a person must
   read. A crash without an exception line, or with another one each time, is retried as any crash. A crash
   whose line says it is transient (``Outcome.detail``'s ``transient``: a connection reset, a timeout, an HTTP 5xx)
   is never a repeat and never counts toward the no-beat rule: the same upload failing twice for a few seconds of
   network trouble is no reason to stop, and the back-off below grows with each one in a row (``transients``);
5. no restart left (``max_restarts``): ``GAVE_UP``;
6. otherwise ``RESTART`` after the **backoff rule**'s delay.

What the next attempt runs after a stall is chosen by the stall's cause
(:func:`retry_for` and the ``RETRIES`` table; a profile may override it with
its ``stall_retry`` key); :class:`trainbox.yolo.ladder.ProfileLadder` carries it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from trainbox.rundir.events import Cause, Retry  # their home is the words the run directory uses; re-exported here
from trainbox.supervise.settings import SupervisorSettings

#: Attempts in a row without a beat that make the run a configuration error (see the no-beat rule).
NO_BEAT_ATTEMPTS = 2
#: The ``give_up`` reason of a run whose attempts ran without any progress trainbox could read (the no-beat rule).
NO_PROGRESS_READ = "no progress to read"
#: How the ``give_up`` reason of the crash repeat rule starts (the place follows).
REPEATED_CRASH = "the same crash twice in a row,"


class OutcomeKind(str, Enum):
    """How an attempt ended (the value is what events.jsonl's ``restart.after`` says)."""

    EXITED = "exited"  # the child exited by itself, with ``Outcome.code``
    STALLED = "stalled"  # a budget ran out; the supervisor wrote an incident and killed the tree
    STOPPED = "stopped"  # the supervisor was told to stop (SIGTERM/SIGINT) and stopped the tree
    MOVED = "moved"  # the ladder policy probed another rung at a checkpoint: the tree was ended to relaunch on it
    SLOW = "slow"  # slow for --slow-restart-after with a suspect inside the run: --on-slow restart ended it


@dataclass
class Outcome:
    """One attempt's end, as the supervisor observed it."""

    kind: OutcomeKind
    code: Optional[int] = None
    beats: int = 0
    first_beat_ts: Optional[float] = None
    first_step_ts: Optional[float] = None
    last_beat: Optional[Dict[str, Any]] = None
    #: When the attempt was launched (unix time; None when unknown): its first step minus this is a restart's cost.
    started_ts: Optional[float] = None
    #: The ``step`` of the first beat that had one (how far the work was when this attempt began).
    first_step: Optional[int] = None
    #: When the last beat that made progress was seen (unix time).
    last_beat_ts: Optional[float] = None
    #: The ``checkpoint_ts`` of the last beat that carried one: when this attempt last saved a checkpoint.
    checkpoint_ts: Optional[float] = None
    #: Stalled without any progress, but its output was still coming (:func:`trainbox.supervise.output.source.output_works`).
    output_works: bool = False
    #: The whole ``epoch`` of the last beat that carried one (an epoch that moves on stands for a checkpoint, below).
    last_epoch: Optional[int] = None
    detail: Dict[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.code == 0

    @property
    def crashed(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.code not in (0, None)

    def saw(self, beat: Optional[Dict[str, Any]], wall: float) -> bool:
        """Count one beat that made progress, seen at unix time ``wall``; whether it tells of a new checkpoint
        (its ``checkpoint_ts`` differs from the one before: the child saved one since the last look), or, while no beat
        of this attempt has carried a ``checkpoint_ts``, of a new epoch (most programs save at each epoch's end)."""
        epoch = (beat or {}).get("epoch")
        whole_epoch = (
            int(epoch) if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch) else None
        )
        new_epoch = whole_epoch is not None and self.last_epoch is not None and whole_epoch > self.last_epoch
        self.last_epoch = whole_epoch if whole_epoch is not None else self.last_epoch
        return self._saw(beat, wall) or (new_epoch and self.checkpoint_ts is None)

    def _saw(self, beat: Optional[Dict[str, Any]], wall: float) -> bool:
        self.beats += 1
        self.last_beat = beat
        self.last_beat_ts = wall
        if self.first_beat_ts is None:
            self.first_beat_ts = wall
        if self.first_step_ts is None and beat and ("step" in beat or "batch" in beat):
            self.first_step_ts = wall
            step = beat.get("step")
            self.first_step = step if isinstance(step, int) and not isinstance(step, bool) else None
        saved = (beat or {}).get("checkpoint_ts")
        if not isinstance(saved, (int, float)) or isinstance(saved, bool) or not math.isfinite(saved):
            return False
        if saved == self.checkpoint_ts:
            return False
        self.checkpoint_ts = float(saved)
        return True

    def timing(self) -> Dict[str, Any]:
        """How far the attempt got: its beats and when the first beat and the first step came (events carry these)."""
        return {"beats": self.beats, "first_beat_ts": self.first_beat_ts, "first_step_ts": self.first_step_ts}


@dataclass(frozen=True)
class Counters:
    """What the run has been through so far.

    ``restarts``, ``stalls``, ``crashes`` and ``redone_steps`` are published (state.json, the
    ``exit`` and ``give_up`` events); ``no_beat_streak`` and ``failures`` only
    drive the rules.
    """

    restarts: int = 0
    stalls: int = 0
    crashes: int = 0
    #: Attempts in a row that ended without a single beat (the no-beat rule).
    no_beat_streak: int = 0
    #: Quick failures in a row, counting the last one (the backoff rule's exponent).
    failures: int = 0
    #: Where the last attempt stalled (``Outcome.detail["at"]``), None when it did not (the repeat rule).
    stalled_at: Optional[str] = None
    #: The last attempt's crash, (exception line, place), None when it did not crash with one (the crash repeat rule).
    crashed: Optional[Tuple[str, str]] = None
    #: Steps done again after restarts: from where each resumed attempt began up to where the one before it got.
    redone_steps: int = 0
    #: Transient crashes in a row, counting the last one (the backoff rule's exponent for them, see the crash repeat rule).
    transients: int = 0

    def published(self) -> Dict[str, int]:
        return {"restarts": self.restarts, "stalls": self.stalls, "crashes": self.crashes, "redone_steps": self.redone_steps}

    def counted(self, outcome: Outcome) -> Counters:
        """With ``outcome`` counted as a stall or a crash (the supervisor calls this as it reports one)."""
        if outcome.kind is OutcomeKind.STALLED:
            return replace(self, stalls=self.stalls + 1)
        if outcome.crashed:
            return replace(self, crashes=self.crashes + 1)
        return self

    def after_failure(self, beats: int, transient: bool = False) -> Counters:
        """The streaks after a failed attempt that beat ``beats`` times (``transient``: a crash that said it may pass)."""
        # A run that beat more than once made progress: whatever went wrong did not go wrong at once, so the
        # next failure starts a new series at the first delay. One beat proves only that the child started.
        failures = self.failures + 1 if beats <= 1 else 1
        no_beat = self.no_beat_streak + 1 if beats == 0 and not transient else 0
        return replace(self, no_beat_streak=no_beat, failures=failures, transients=self.transients + 1 if transient else 0)


def position(beat: Optional[Mapping[str, Any]], profile: Optional[str] = None) -> Optional[str]:
    """Where a child stands by its last beat: ``"phase val, epoch 3 batch 0"``, ``"phase train, epoch 2 step 40"``,
    ``"phase train, step 40"``.

    None before the first beat (the no-beat rule covers those). The profile is
    part of the place: the same batch on another rung is another try.
    """
    if not beat:
        return None
    parts = [f"phase {beat['phase']}"] if beat.get("phase") is not None else []
    if "batch" in beat:
        parts.append(f"epoch {beat.get('epoch', '?')} batch {beat['batch']}")
    elif "epoch" in beat:
        parts.append(f"epoch {beat['epoch']}" + (f" step {beat['step']}" if "step" in beat else ""))
    elif "step" in beat:
        parts.append(f"step {beat['step']}")
    if profile:
        parts.append(f"profile {profile}")
    return ", ".join(parts) or None


def transient_crash(outcome: Outcome) -> bool:
    """Whether ``outcome`` is a crash whose exception line says it may pass on its own (named so by the monitor)."""
    return outcome.crashed and outcome.detail.get("transient") is True


def crash_name(outcome: Outcome) -> Optional[Tuple[str, str]]:
    """A crash's (exception line, place) as the monitor named them (:mod:`trainbox.supervise.crashes`); None for
    an attempt that did not crash, crashed without an exception line, or with a transient one (never a repeat)."""
    exception, at = outcome.detail.get("exception"), outcome.detail.get("crash_at")
    if not outcome.crashed or transient_crash(outcome) or not isinstance(exception, str) or not isinstance(at, str):
        return None
    return exception, at


class Verdict(str, Enum):
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"
    MISCONFIGURED = "misconfigured"
    GAVE_UP = "gave_up"
    RESTART = "restart"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    counters: Counters
    #: Seconds to wait before the next attempt (``RESTART`` only).
    delay_s: float = 0.0
    #: Why the run gives up (``GAVE_UP`` only): the ``give_up`` event's ``reason``.
    reason: str = ""


def backoff_s(failures: int, settings: SupervisorSettings) -> float:
    """The backoff rule: ``--backoff`` after the first quick failure, doubled for each further one in a row.

    Doubling (as systemd and Kubernetes do for crash loops) keeps a child that
    dies at once from spinning, while a one-off fault costs only the first
    delay. ``--backoff-max`` caps it, so a long series never waits longer than
    the user said between two tries.
    """
    return min(settings.backoff_max_s, settings.backoff_s * 2 ** max(0, failures - 1))


def decide(outcome: Outcome, counters: Counters, settings: SupervisorSettings, last_rung: bool = True) -> Decision:
    """The next step after ``outcome`` (see the module docstring for the rules).

    ``last_rung``: the attempt after this one would run the same profile (the planner has nothing else to try).
    """
    if outcome.kind is OutcomeKind.STOPPED:
        return Decision(Verdict.STOPPED, counters)
    if outcome.succeeded:
        return Decision(Verdict.SUCCEEDED, counters)
    at = outcome.detail.get("at") if outcome.kind is OutcomeKind.STALLED else None
    repeated = at is not None and at == counters.stalled_at
    crash = crash_name(outcome)
    crashed_again = crash is not None and crash == counters.crashed
    counters = replace(counters.after_failure(outcome.beats, transient_crash(outcome)), stalled_at=at, crashed=crash)
    if counters.no_beat_streak >= NO_BEAT_ATTEMPTS:
        if outcome.output_works:
            return Decision(Verdict.GAVE_UP, counters, reason=NO_PROGRESS_READ)
        return Decision(Verdict.MISCONFIGURED, counters)
    if repeated and last_rung:
        cause = outcome.detail.get("cause") or Cause.UNKNOWN.value
        return Decision(Verdict.GAVE_UP, counters, reason=f"stalls again at {at} (cause {cause}) with nothing left to try")
    if crashed_again and last_rung and crash is not None:
        return Decision(Verdict.GAVE_UP, counters, reason=f"{REPEATED_CRASH} {crash[1]}")
    if counters.restarts >= settings.max_restarts:
        return Decision(Verdict.GAVE_UP, counters, reason="restart budget spent")
    delay = backoff_s(max(counters.failures, counters.transients), settings)
    return Decision(Verdict.RESTART, replace(counters, restarts=counters.restarts + 1), delay)


#: The retries for a cause's first, second, ... stall in a row on one profile; the last one repeats.
#: A deadlocked loader needs fewer workers; a compile past the cap will not finish faster on a retry, so
#: skip it (and warm the cache with `trainbox warmup`); a GPU that still holds the dead tree's memory gets
#: time to release it and one more try before FP32/native convolutions; a busy spin, a process stopped from outside
#: and a C call that kept the GIL may be one-offs.
RETRIES: Dict[Cause, Tuple[Retry, ...]] = {
    Cause.LOADER_DEADLOCK: (Retry.LADDER,),
    Cause.KERNEL_COMPILE: (Retry.NATIVE,),
    Cause.GPU_WAIT: (Retry.GPU_RELEASE, Retry.NATIVE),
    Cause.BUSY_PYTHON: (Retry.SAME, Retry.LADDER),
    Cause.BUSY_NATIVE: (Retry.SAME, Retry.LADDER),
    Cause.IO_WAIT: (Retry.LADDER,),
    Cause.STOPPED: (Retry.SAME, Retry.LADDER),
    Cause.GIL_HELD: (Retry.SAME, Retry.LADDER),
    Cause.IDLE: (Retry.LADDER,),
    Cause.UNKNOWN: (Retry.LADDER,),
}


def hint(cause: Optional[str]) -> str:
    """What the user can do about a cause, appended to the ``restart`` event's ``reason`` ('' when nothing)."""
    return "; run `trainbox warmup` to compile the kernels ahead" if cause == Cause.KERNEL_COMPILE.value else ""


def retry_for(cause: Optional[str], earlier: int, overrides: Optional[Mapping[str, Sequence[Retry]]] = None) -> Retry:
    """The retry after a stall of ``cause`` that follows ``earlier`` stalls of that cause in a row on this profile.

    ``overrides`` (a profile's ``stall_retry``) replaces the table's row for the causes it names.
    """
    known = cause if cause in {c.value for c in Cause} else Cause.UNKNOWN.value
    row = (overrides or {}).get(known) or RETRIES[Cause(known)]
    return row[min(earlier, len(row) - 1)]


class CauseStreak:
    """Stalls in a row with the same cause (on one rung: the planner starts a new streak when it moves)."""

    def __init__(self) -> None:
        self.cause: Optional[str] = None
        self.length = 0

    def count(self, cause: Optional[str]) -> int:
        """How many stalls of ``cause`` came right before this one; this one is then counted."""
        earlier = self.length if cause == self.cause else 0
        self.cause, self.length = cause, earlier + 1
        return earlier
