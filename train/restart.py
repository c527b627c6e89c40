"""What the supervisor does after an attempt ends: a pure, typed policy.

``decide(outcome, counters, settings)`` looks at how the attempt ended and at
the run's counters so far, and returns a ``Decision``: finish (succeeded,
stopped), give up (misconfigured, restart budget spent) or restart after a
delay, together with the counters to carry on with. It reads no clock, file or
process, so ``tests/test_restart.py`` scripts whole runs as outcome sequences
in milliseconds; the supervisor loop only carries out what it returns.

The rules, in the order they are applied:

1. stopped by a signal: ``STOPPED``; exit status 0: ``SUCCEEDED``;
2. the **no-beat rule**: a second attempt *in a row* that ended before its
   first beat is ``MISCONFIGURED``. One such attempt can be bad luck (a startup
   that stalled on a slow disk or a busy GPU, a kill from outside), so it is
   restarted; two in a row with the same command mean the command cannot start
   (a typo, an import error, bad arguments), and restarting again would spend
   the restart budget and bury the error under identical reports;
3. no restart left (``max_restarts``): ``GAVE_UP``;
4. otherwise ``RESTART`` after the **backoff rule**'s delay.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Dict, Optional

from trainbox.supervisor_settings import SupervisorSettings

#: Attempts in a row without a beat that make the run a configuration error (see the no-beat rule).
NO_BEAT_ATTEMPTS = 2


class OutcomeKind(str, Enum):
    """How an attempt ended (the value is what events.jsonl's ``restart.after`` says)."""

    EXITED = "exited"  # the child exited by itself, with ``Outcome.code``
    STALLED = "stalled"  # a budget ran out; the supervisor wrote an incident and killed the tree
    STOPPED = "stopped"  # the supervisor was told to stop (SIGTERM/SIGINT) and stopped the tree


@dataclass
class Outcome:
    """One attempt's end, as the supervisor observed it."""

    kind: OutcomeKind
    code: Optional[int] = None
    beats: int = 0
    first_beat_ts: Optional[float] = None
    first_step_ts: Optional[float] = None
    last_beat: Optional[Dict[str, Any]] = None
    detail: Dict[str, Any] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.code == 0

    @property
    def crashed(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.code not in (0, None)


@dataclass(frozen=True)
class Counters:
    """What the run has been through so far.

    ``restarts``, ``stalls`` and ``crashes`` are published (state.json, the
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

    def published(self) -> Dict[str, int]:
        return {"restarts": self.restarts, "stalls": self.stalls, "crashes": self.crashes}

    def counted(self, outcome: Outcome) -> Counters:
        """With ``outcome`` counted as a stall or a crash (the supervisor calls this as it reports one)."""
        if outcome.kind is OutcomeKind.STALLED:
            return replace(self, stalls=self.stalls + 1)
        if outcome.crashed:
            return replace(self, crashes=self.crashes + 1)
        return self

    def after_failure(self, beats: int) -> Counters:
        """The streaks after a failed attempt that beat ``beats`` times."""
        # A run that beat more than once made progress: whatever went wrong did not go wrong at once, so the
        # next failure starts a new series at the first delay. One beat proves only that the child started.
        failures = self.failures + 1 if beats <= 1 else 1
        return replace(self, no_beat_streak=self.no_beat_streak + 1 if beats == 0 else 0, failures=failures)


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


def backoff_s(failures: int, settings: SupervisorSettings) -> float:
    """The backoff rule: ``--backoff`` after the first quick failure, doubled for each further one in a row.

    Doubling (as systemd and Kubernetes do for crash loops) keeps a child that
    dies at once from spinning, while a one-off fault costs only the first
    delay. ``--backoff-max`` caps it, so a long series never waits longer than
    the user said between two tries.
    """
    return min(settings.backoff_max_s, settings.backoff_s * 2 ** max(0, failures - 1))


def decide(outcome: Outcome, counters: Counters, settings: SupervisorSettings) -> Decision:
    """The next step after ``outcome`` (see the module docstring for the rules)."""
    if outcome.kind is OutcomeKind.STOPPED:
        return Decision(Verdict.STOPPED, counters)
    if outcome.succeeded:
        return Decision(Verdict.SUCCEEDED, counters)
    counters = counters.after_failure(outcome.beats)
    if counters.no_beat_streak >= NO_BEAT_ATTEMPTS:
        return Decision(Verdict.MISCONFIGURED, counters)
    if counters.restarts >= settings.max_restarts:
        return Decision(Verdict.GAVE_UP, counters)
    delay = backoff_s(counters.failures, settings)
    return Decision(Verdict.RESTART, replace(counters, restarts=counters.restarts + 1), delay)
