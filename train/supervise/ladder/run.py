"""The ladder's memory of this run, and the move both ladders share: what :mod:`ladder_policy` decides from.

Why it exists. :func:`trainbox.supervise.ladder.policy.choose` is pure: it wants each rung's measured step rate,
hours and stalls, what a stall and a restart cost on this run, the work left and the deadline. Somebody must
measure those from the attempts as they happen and keep the policy's probation between calls. That is
:class:`RungLedger`; :class:`RungLadder` is the planner side of it, the one place where ``trainbox run``'s
profile ladder (:class:`trainbox.yolo.ladder.ProfileLadder`) and ``supervise --ladder FILE``
(:class:`trainbox.supervise.ladder.command.CommandLadder`) ask the policy which rung comes next.

What is measured, from the attempts' beats (:class:`~trainbox.supervise.policy.Outcome`):

* **training on a rung**: from an attempt's first beat with a ``step`` to its last beat, the steps it advanced
  and the seconds that took (silences before a kill are not training: they end at the last beat);
* **a restart**: an attempt's launch to its first step (what switching rungs costs);
* **a stall's cost**: its silence before the kill (``silent_s``), the handling after the silence (incident, kill:
  until the ledger hears of it) plus the run's mean restart, and the work redone: the last beat minus the
  attempt's last checkpoint (``checkpoint_ts`` in the beats), else minus its first step (it resumed from a
  checkpoint written before it began, so at least that much is redone);
* **the work left**: the beat's ``total_steps`` (the child says how many steps the run has: Ultralytics' beats do,
  ``python -m trainbox.faults`` does) minus its ``step``. A child that does not say has as much left as it has done
  (seen at a moment that is no special one, a run is as likely past its middle as before it: the median guess),
  and the events say the decision lacked ``total_steps``. A child that beats no ``step`` at all gets
  ``--ladder-policy down``'s rule, since without any count of work there is nothing to weigh.

When. After a stall whose cause calls for the ladder (:data:`~trainbox.rundir.events.Retry` ``ladder``: the other
retries, ``same``, ``native``, ``gpu_release``, stay with the cause table; the stall is recorded all the same), and
at each checkpoint a beat tells of (an epoch end or a mid-epoch save): there the decision may be a ``probe`` back up,
and the supervisor ends the tree and relaunches on that rung (a ``probe`` event, not a stall, crash or restart). A
child whose beats carry no ``checkpoint_ts`` is probed where its ``epoch`` moves on instead
(:meth:`~trainbox.supervise.policy.Outcome.saw`): most programs save at each epoch's end, and the restart resumes
from the newest complete checkpoint (:mod:`trainbox.supervise.resume`); the events say the decision lacked
``checkpoint_ts``.
A rung that is not on the policy's ladder (``safe-native``: a startup-only rung) keeps the ladder's own rules.

Limits. Beats are read every half second at most, so a step rate is exact only over many beats, and a probe
loses the steps made between the checkpoint and the look that saw it. Beat fields are untrusted: anything that is
not a finite number is ignored. The ledger lives as long as the supervisor: a new supervisor on the same run
directory starts with no history (the priors), as the old rule did.
"""

from __future__ import annotations

import datetime
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.rundir.events import Retry
from trainbox.supervise.ladder.policy import (
    PRIOR_RESTART_S,
    Decision,
    PolicyName,
    Probation,
    Rung,
    RungHistory,
    Situation,
    Stall,
    Trigger,
    choose,
    tally,
)
from trainbox.supervise.planner import Next, Planner, moved_reason
from trainbox.supervise.policy import Outcome, OutcomeKind, hint, position
from trainbox.supervise.settings import SupervisorSettings


def _number(value: Any) -> Optional[float]:
    """A finite number from an untrusted field, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _step(beat: Optional[Mapping[str, Any]]) -> Optional[int]:
    step = _number((beat or {}).get("step"))
    return int(step) if step is not None else None


def training(outcome: Outcome) -> Tuple[float, float]:
    """The steps an attempt advanced and the seconds of training that took (first step to last beat)."""
    first, last = _number(outcome.first_step), _step(outcome.last_beat)
    began, ended = _number(outcome.first_step_ts), _number(outcome.last_beat_ts)
    if first is None or last is None or began is None or ended is None:
        return 0.0, 0.0
    return max(0.0, last - first), max(0.0, ended - began)


@dataclass
class _Worked:
    """One rung's training so far."""

    steps: float = 0.0
    seconds: float = 0.0
    stalls: List[Stall] = field(default_factory=list)

    def history(self, extra: Tuple[float, float] = (0.0, 0.0)) -> RungHistory:
        steps, seconds = self.steps + extra[0], self.seconds + extra[1]
        rate = steps / seconds if steps > 0 and seconds > 0 else None
        return RungHistory(rate=rate, hours=seconds / 3600.0, stalls=tuple(self.stalls))


class RungLedger:
    """What this run measured on each rung, and the policy's probation between decisions (see the docstring)."""

    def __init__(
        self,
        rungs: Sequence[Rung],
        policy: PolicyName = PolicyName.COST,
        deadline_ts: Optional[float] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        self.rungs = tuple(rungs)
        self.policy = policy
        self.deadline_ts = deadline_ts
        self.clock = clock
        self.worked: Dict[str, _Worked] = {rung.name: _Worked() for rung in self.rungs}
        self.restarts: List[float] = []
        self.probation: Optional[Probation] = None
        self.total: Optional[int] = None
        #: Whether a beat of this run has told when a checkpoint was written (else epoch ends stand for them).
        self.checkpoints_told = False
        #: The rule that made the last decision (``down`` also when the work left is unknown): its words differ.
        self.decided_by = policy

    @classmethod
    def from_settings(cls, rungs: Sequence[Rung], settings: SupervisorSettings) -> RungLedger:
        """With ``--ladder-policy`` and ``--deadline`` (an ``HH:MM`` is the next such time from now)."""
        return cls(rungs, PolicyName(settings.ladder_policy), settings.deadline_ts(datetime.datetime.now()))

    def knows(self, rung: Optional[str]) -> bool:
        return rung in self.worked

    def commit(self, rung: str, outcome: Outcome) -> None:
        """Count an ended attempt's training, its restart and the work's total; once per attempt."""
        steps, seconds = training(outcome)
        worked = self.worked.get(rung)
        if worked is not None:
            worked.steps, worked.seconds = worked.steps + steps, worked.seconds + seconds
        started, first = _number(outcome.started_ts), _number(outcome.first_step_ts)
        if started is not None and first is not None and first >= started:
            self.restarts.append(first - started)
        self._saw(outcome)

    def _saw(self, outcome: Outcome) -> None:
        total = _number((outcome.last_beat or {}).get("total_steps"))
        if total is not None and total > 0:
            self.total = int(total)
        self.checkpoints_told = self.checkpoints_told or _number(outcome.checkpoint_ts) is not None
        first = _number(outcome.first_step_ts)
        if self.probation is None and first is not None:
            self.probation = Probation(since=first)

    def stalled(self, rung: str, outcome: Outcome) -> None:
        """Count a stalled attempt and its stall (what it cost: see the module docstring)."""
        self.commit(rung, outcome)
        worked = self.worked.get(rung)
        if worked is None:
            return
        beat, now = outcome.last_beat or {}, self.clock()
        silent = max(0.0, _number(outcome.detail.get("silent_s")) or 0.0)
        last = _number(outcome.last_beat_ts) or now
        since = _number(outcome.checkpoint_ts) or _number(outcome.first_step_ts) or last
        phase = beat.get("phase") if isinstance(beat.get("phase"), str) else None
        handling = max(0.0, now - last - silent) + self.restart_s()
        worked.stalls.append(Stall(position(beat) or "", _step(beat), phase, silent, handling, max(0.0, last - since)))

    def restart_s(self) -> float:
        """The run's mean launch-to-first-step, else the policy's prior."""
        return sum(self.restarts) / len(self.restarts) if self.restarts else PRIOR_RESTART_S

    def situation(self, rung: str, beat: Optional[Mapping[str, Any]], running: Optional[Outcome] = None) -> Situation:
        """The policy's view now, on ``rung`` at ``beat``; ``running``: an attempt still under way, counted too."""
        history = {name: worked.history(training(running) if running and name == rung else (0.0, 0.0))
                   for name, worked in self.worked.items()}  # fmt: skip
        step = _step(beat)
        known = step is not None
        total = self.total if self.total is not None else 2 * (step or 0)  # unknown: as much left as done (module doc)
        now = self.clock()
        return Situation(
            rungs=self.rungs,
            current=rung,
            remaining_steps=max(0, total - (step or 0)),
            now=now,
            history=history,
            step=step,
            deadline=self.deadline_ts,
            restart_s=self.restart_s() if self.restarts else None,
            probation=self.probation or Probation(since=now),
            policy=self.policy if known else PolicyName.DOWN,
        )

    def after_stall(self, rung: str, outcome: Outcome) -> Decision:
        """The rung after a stall the ladder must answer (already :meth:`stalled`)."""
        return self._keep(self.situation(rung, outcome.last_beat), Trigger.STALL)

    def at_checkpoint(self, rung: str, outcome: Outcome) -> Decision:
        """The rung from the checkpoint a beat of the running attempt ``outcome`` just told of."""
        self._saw(outcome)
        decision = self._keep(self.situation(rung, outcome.last_beat, outcome), Trigger.CHECKPOINT)
        if decision.moves:  # the attempt ends here: its training counts now, never again
            self.commit(rung, outcome)
        return decision

    def _keep(self, sit: Situation, trigger: Trigger) -> Decision:
        decision = choose(sit, trigger)
        self.probation, self.decided_by = decision.probation, sit.policy
        return decision

    def lacked(self) -> List[str]:
        """What the beats have not told that a decision would weigh: ``total_steps``, ``checkpoint_ts``."""
        return [
            name for name, told in (("total_steps", self.total is not None), ("checkpoint_ts", self.checkpoints_told)) if not told
        ]

    def lacking_words(self, beat: Optional[Mapping[str, Any]]) -> str:
        """What the decision lacked, for its reason (empty when the beats told everything)."""
        step, lacked = _step(beat), self.lacked()
        words = (
            [f"the work left taken as the {step} steps done (no total_steps in the beats)"]
            if "total_steps" in lacked and step
            else []
        )
        words += ["probes at epoch ends (no checkpoint_ts in the beats)"] if "checkpoint_ts" in lacked else []
        return f" [{'; '.join(words)}]" if words else ""

    def event(self, decision: Decision, rung: str, beat: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """The ``ladder`` field of a ``restart`` or ``probe`` event: the decision, what stalls and safety cost, and
        what the beats did not tell (``lacked``)."""
        counted = tally(self.situation(rung, beat))
        return {
            **decision.as_dict(),
            "policy": self.policy.value,
            "lost_to_stalls_s": round(counted.lost_to_stalls_s, 1),
            "safety_would_cost_s": round(counted.safety_would_cost_s, 1),
            "lacked": self.lacked(),
        }


class RungLadder(Planner):
    """A planner over named rungs whose ``ladder`` retries and checkpoints the policy decides.

    A subclass says which rung it stands on (:meth:`describe`), moves to a rung by name (:meth:`go_to`), and calls
    :meth:`ladder_rung` where its ``ladder`` retry chooses; this class records every attempt in the ledger.
    """

    ledger: RungLedger
    #: The ``restart`` event's ``ladder`` field for the stall being answered (None: the policy did not decide it).
    _ladder: Optional[Dict[str, Any]] = None
    #: The last beat of the stall being answered (what its reason says the decision lacked).
    last_beat: Optional[Mapping[str, Any]] = None

    def go_to(self, rung: str) -> None:
        raise NotImplementedError

    def after(self, outcome: Outcome) -> Next:
        rung = self.describe()
        if outcome.kind is OutcomeKind.STALLED:
            self.ledger.stalled(rung, outcome)
        else:
            self.ledger.commit(rung, outcome)
        self._ladder = None
        following = super().after(outcome)
        return Next(following.launch, following.retry, following.reason, self._ladder)

    def ladder_rung(self, outcome: Outcome) -> Optional[Decision]:
        """The policy's answer to a ``ladder`` retry after ``outcome``'s stall; None off its ladder."""
        rung = self.describe()
        if not self.ledger.knows(rung):
            return None
        decision = self.ledger.after_stall(rung, outcome)
        self._ladder = self.ledger.event(decision, rung, outcome.last_beat)
        self.last_beat = outcome.last_beat
        return decision

    def ladder_reason(self, cause: str, decision: Decision, before: str) -> str:
        """The ``restart`` reason of a stall the policy answered: the cause, the figures and the verdict (today's
        words when today's rule decided, ``--ladder-policy down`` or no work left to weigh, and when the run stays on
        the last rung, with nothing below to weigh; the figures are in the event's ``ladder`` all the same)."""
        last = decision.rung == before == self.ledger.rungs[-1].name  # nothing below to weigh against
        if self.ledger.decided_by is PolicyName.DOWN or last:
            return moved_reason(cause, Retry.LADDER, before, decision.rung)
        return f"{cause}: {decision.reason}{self.ledger.lacking_words(self.last_beat)}{hint(cause)}"

    def at_checkpoint(self, outcome: Outcome) -> Optional[Next]:
        """At a checkpoint of the running attempt: the launch to move to (a probe), None to carry on."""
        rung = self.describe()
        if not self.ledger.knows(rung):
            return None
        decision = self.ledger.at_checkpoint(rung, outcome)
        if not decision.moves or decision.exhausted:
            return None
        self.go_to(decision.rung)
        reason = decision.reason + self.ledger.lacking_words(outcome.last_beat)
        return Next(self.current(), None, reason, self.ledger.event(decision, rung, outcome.last_beat))
