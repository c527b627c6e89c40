"""The rung that finishes first: where on the ladder the run goes after a stall or a checkpoint (a pure policy).

Why it exists. Today one stall moves a run down the ladder (``fast`` -> ``balanced``
-> ``safe``) for good. That was right when a hang went unseen for hours and took
an epoch with it (seed 001: "accept 19 % slower speed for 100 % reliability").
trainbox finds a hang in minutes, restarts in seconds and loses at most a
checkpoint interval of work, so an intermittent hang now costs minutes, while
safety costs a fixed fraction of the whole run: 19 % on an RX 5600 XT, a factor
of about 10 on an H100 (bench/results/gpu.md). This module weighs the two on
the run's own figures and says which rung finishes the remaining work first.

The rule. :func:`choose` is called after each stall (``Trigger.STALL``) and at
each epoch end or mid-epoch checkpoint (``Trigger.CHECKPOINT``). For every
candidate rung it computes the expected time to finish::

    to go = remaining steps / rate  +  expected stalls x cost per stall (+ a restart to switch to it)

* **rate**: the steady step rate measured on this run; a rung that has not run
  yet gets the measured rate of the rung with the most hours, scaled by the two
  rungs' prior relative speeds (a profile's ``expected_speed``, the bench figures);
* **expected stalls**: the stall rate per hour of training times the hours the
  rung needs. The rate is the mean of a Gamma-Poisson posterior,
  ``(PRIOR_STALLS + stalls) / (PRIOR_HOURS + hours)``: one stall in ten minutes
  reads as 4.1 per hour, one in ten hours as 0.10 per hour;
* **cost per stall**: the silence before the kill, incident + kill + restart,
  and the work redone since the last checkpoint, as measured for this rung's
  stalls (else the run's, else :data:`PRIOR_STALL_COST_S`).

Then:

1. **A deterministic hang stays a hang** (the same-place rule of
   trainbox.restart): a rung's stall at the same place as its stall before
   bans that rung at that place. It steps down at once, and no decision ever
   takes the run onto a rung while a ban holds: until the run has passed the
   place in the training phase, for the rest of the run in a phase that every
   launch or epoch repeats (setup, workers, val, save), or when the place has no
   step. A probe never climbs into a place where the rung hung at all.
2. **An intermittent hang is weighed**: after a stall the candidates are the
   current rung and the safer ones; the one with the least time to go wins, the
   current one on a tie. A stall never climbs.
3. **Probe back up** at a checkpoint, once the current rung has run without a
   stall for ``wait = (restart + cost per stall on the faster rung) / rent``, where
   ``rent = 1 - rate here / rate there`` is the fraction of each second that safety
   costs. This is the ski-rental rule (Karlin, Manasse, McGeoch, Owicki,
   "Competitive randomized algorithms for non-uniform problems", SODA 1990;
   Greyhound, USENIX ATC'25, weighs fail-slow actions the same way): rent
   (stay safe) until the rent paid equals the price of a failed try, then buy
   (try). The probe also needs the faster rung to save more than that price on
   the remaining work. A probed rung is on probation for ``wait``: the mean time
   between stalls at which staying and stepping down break even. A stall on
   probation goes ``back`` to the rung it came from, and each failed probe of a
   rung doubles the wait before the next (exponential backoff).
4. **With a deadline**, the rung with the highest probability of finishing by
   then wins (within :data:`DEADLINE_TIE`, the least time to go). Stalls are
   Poisson with a Gamma-distributed rate, so their number over the hours a rung
   needs is negative binomial (the Gamma-Poisson mixture; Gelman et al., *Bayesian
   Data Analysis*, 3rd ed., sec. 2.6): P(finish) = P(stalls <= (time left - work
   time) / cost per stall). No probe is taken while staying makes the deadline
   with at least :data:`DEADLINE_SURE`.
5. ``PolicyName.DOWN`` is today's rule: every stall moves one rung down for good
   (skipping banned rungs), and nothing ever climbs.

Limits. The policy believes its inputs: a prior speed that is wrong is used
until the rung has run long enough to be measured. Stall rates are stationary:
a rung's old stalls count as much as new ones (a probe that holds through
probation starts no new history). Before any rate is measured the cost policy
cannot put stalls and speed on one scale, and falls back to the ``down`` rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: The prior's weight, in hours of stall-free training: one mid-epoch checkpoint interval (300 s). A rate measured
#: over less than that is mostly noise; anything longer outweighs it, so even a run of minutes (the bench's) learns.
PRIOR_HOURS = 300.0 / 3600.0
#: The prior's stalls in PRIOR_HOURS: a mean of one stall per 5 hours, seed 001's rate on its fast rung (hangs at
#: one per 4-5 hours), the only field figure there is. The same for every rung: which one hangs is what is measured.
PRIOR_STALLS = PRIOR_HOURS / 5.0
#: Cost of a stall before this run has measured one: the issue's arithmetic (about 2 min until the idle timeout
#: kills, about 4 s to restart, half of a 5 min mid-epoch checkpoint interval redone).
PRIOR_STALL_COST_S = 300.0
#: A launch to its first step, before the run has measured one: 3.5 s on the CPU bench, 12-54 s on an H100
#: (bench/results/profiles.md, gpu.md); the larger end, since a probe that costs more than expected is the worse error.
PRIOR_RESTART_S = 30.0
#: Probabilities of meeting the deadline this close are the same chance; the least time to go decides between them.
DEADLINE_TIE = 0.01
#: With a deadline, no probe while staying finishes in time with at least this chance: a user who gave a deadline
#: would rather be sure than fast, and a probe can only lower a chance that is already this high.
DEADLINE_SURE = 0.95
#: Phases in which the place moves on with the work: a hang elsewhere (setup, workers, val, save) comes back with
#: every launch or epoch, so its ban holds for the rest of the run.
TRAINING_PHASES = frozenset({"train"})
#: Doublings of the probe wait counted at most: 2**60 waits are forever already, and a larger power overflows.
MAX_DOUBLINGS = 60
#: Terms of the negative binomial sum at most: its tail is then below any probability worth telling apart.
MAX_TERMS = 20000


class PolicyName(str, Enum):
    """``--ladder-policy``."""

    COST = "cost"  # the rung that finishes first (this module)
    DOWN = "down"  # today's: one stall moves one rung down for good


class Trigger(str, Enum):
    STALL = "stall"  # a stall on the current rung, the last in its history, was just reported
    CHECKPOINT = "checkpoint"  # an epoch end or mid-epoch checkpoint was just written: a probe can start from it


class Kind(str, Enum):
    """What the decision does (``restart``/``probe`` events' ``ladder.kind``)."""

    STAY = "stay"  # the same rung
    DOWN = "down"  # a safer rung, after a stall
    PROBE = "probe"  # a faster rung, from a checkpoint, on probation
    BACK = "back"  # the probed rung stalled on probation: back to the rung the probe came from


@dataclass(frozen=True)
class Rung:
    """A rung of the ladder; ``prior_speed`` is its speed relative to the others before this run measures it."""

    name: str
    prior_speed: float = 1.0


@dataclass(frozen=True)
class Stall:
    """One stall on a rung, with what it cost this run."""

    #: Where (trainbox.restart.position of the last beat): two stalls of one rung at the same ``at`` are a ban.
    at: str
    #: The run's global step at the stall (orders places: a ban holds until the run passes it); None: unknown.
    step: Optional[int] = None
    #: The heartbeat's phase at the stall (see TRAINING_PHASES).
    phase: Optional[str] = "train"
    #: Silence from the last beat to the kill.
    silent_s: float = 0.0
    #: Incident report, kill and relaunch until the first step again.
    handling_s: float = 0.0
    #: Training between the last checkpoint and the stall, done again after the resume.
    redone_s: float = 0.0

    @property
    def cost_s(self) -> float:
        return _nonneg(self.silent_s) + _nonneg(self.handling_s) + _nonneg(self.redone_s)


@dataclass(frozen=True)
class RungHistory:
    """What this run measured on one rung."""

    #: Steady steps per second, None until measured.
    rate: Optional[float] = None
    #: Hours of training on it (silences and restarts not counted).
    hours: float = 0.0
    stalls: Tuple[Stall, ...] = ()


@dataclass(frozen=True)
class Probation:
    """The climbing state the supervisor keeps between calls: each Decision returns the next one."""

    #: When the current rung's stall-free stretch began (a stall, a move, or the run's start).
    since: float = 0.0
    #: The rung on probation (the current one, after a probe), None when there is none.
    probing: Optional[str] = None
    #: The rung the probe came from: where a stall on probation goes back to.
    origin: Optional[str] = None
    #: How long the probed rung must run without a stall to pass.
    window_s: float = 0.0
    #: Failed probes per rung: the next probe of it waits 2**failures times the ski-rental wait.
    failures: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "since": _plain(self.since, 3),
            "probing": self.probing,
            "origin": self.origin,
            "window_s": _plain(self.window_s, 3),
            "failures": {str(k): int(_nonneg(v)) for k, v in self.failures.items()},
        }


@dataclass(frozen=True)
class Situation:
    """Everything a decision looks at, as plain data."""

    #: The ladder, least safe first (fast, balanced, safe).
    rungs: Sequence[Rung]
    current: str
    remaining_steps: int
    now: float
    history: Mapping[str, RungHistory] = field(default_factory=dict)
    #: The run's global step now (at a stall: the stall's); None when the command beats no step.
    step: Optional[int] = None
    #: When the run should be done (same clock as ``now``), None for none.
    deadline: Optional[float] = None
    #: The run's measured launch-to-first-step time (what switching rungs costs), None before one is measured.
    restart_s: Optional[float] = None
    probation: Probation = field(default_factory=Probation)
    policy: PolicyName = PolicyName.COST


@dataclass(frozen=True)
class Candidate:
    """One rung's figures at a decision (plain data for events, ``status`` and the report)."""

    rung: str
    #: Steps per second used, None when no rate is known on any rung.
    rate: Optional[float]
    #: ``rate`` was measured on this rung (not scaled from another by the prior speeds).
    measured: bool
    stalls: int
    hours: float
    stalls_per_h: float
    cost_per_stall_s: float
    expected_stalls: float
    #: Expected seconds to finish the remaining work on this rung, None without a rate.
    to_go_s: Optional[float]
    #: Probability of finishing by the deadline, None without one (or without a rate).
    p_deadline: Optional[float] = None
    #: Where this rung hung twice, when that ban holds here (it is then never chosen).
    banned_at: Optional[str] = None

    @property
    def banned(self) -> bool:
        return self.banned_at is not None

    def as_dict(self) -> Dict[str, Any]:
        return {
            "rung": self.rung,
            "rate": _plain(self.rate, 4),
            "measured": self.measured,
            "stalls": self.stalls,
            "hours": _plain(self.hours, 4),
            "stalls_per_h": _plain(self.stalls_per_h, 4),
            "cost_per_stall_s": _plain(self.cost_per_stall_s, 1),
            "expected_stalls": _plain(self.expected_stalls, 3),
            "to_go_s": _plain(self.to_go_s, 1),
            "p_deadline": _plain(self.p_deadline, 4),
            "banned_at": self.banned_at,
        }


@dataclass(frozen=True)
class Decision:
    """Where the run goes next, why, and the climbing state to pass to the next call."""

    rung: str
    kind: Kind
    reason: str
    candidates: Tuple[Candidate, ...]
    probation: Probation
    #: Every allowed rung is banned here: the run stays, and the supervisor's repeat rule gives up on it.
    exhausted: bool = False

    @property
    def moves(self) -> bool:
        """The next attempt runs another rung."""
        return self.kind is not Kind.STAY

    def as_dict(self) -> Dict[str, Any]:
        """The ``ladder`` field of a ``restart`` or ``probe`` event."""
        return {
            "rung": self.rung,
            "kind": self.kind.value,
            "reason": self.reason,
            "exhausted": self.exhausted,
            "candidates": [c.as_dict() for c in self.candidates],
            "probation": self.probation.as_dict(),
        }


@dataclass(frozen=True)
class Tally:
    """For ``status`` and the report: time lost to stalls against the time safety would have cost."""

    lost_to_stalls_s: float
    #: Extra time the last rung would have needed for the training done on the others (negative: it is faster).
    safety_would_cost_s: float


# -- numbers -------------------------------------------------------------------------------------------------


def _finite(value: Any, default: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if math.isfinite(number) else default


def _nonneg(value: Any) -> float:
    return max(0.0, _finite(value))


def _plain(value: Any, digits: int) -> Optional[float]:
    """A figure for JSON: rounded, None when missing or not finite (events.jsonl must stay strict JSON)."""
    number = _finite(value, math.nan)
    return round(number, digits) if math.isfinite(number) else None


def _rate(value: Any) -> Optional[float]:
    """A usable step rate, or None."""
    number = _finite(value)
    return number if number > 0 else None


def stalls_per_hour(stalls: int, hours: float) -> float:
    """The posterior mean stall rate of a Gamma(PRIOR_STALLS, PRIOR_HOURS) prior after ``stalls`` in ``hours``."""
    return (PRIOR_STALLS + max(0, stalls)) / (PRIOR_HOURS + _nonneg(hours))


def p_at_most(most: int, stalls: int, hours: float, exposure_h: float) -> float:
    """P(at most ``most`` stalls in ``exposure_h`` more hours), after ``stalls`` in ``hours`` (negative binomial).

    Poisson stalls whose rate has the posterior Gamma(a, b), a = PRIOR_STALLS + stalls, b = PRIOR_HOURS + hours,
    give a count over t hours that is negative binomial: P(0) = p**a with p = b / (b + t), and
    P(n + 1) = P(n) (a + n) / (n + 1) (1 - p). The sum stops once the tail cannot matter.
    """
    if most < 0:
        return 0.0
    exposure = _nonneg(exposure_h)
    if exposure == 0:
        return 1.0
    shape = PRIOR_STALLS + max(0, stalls)
    scale = PRIOR_HOURS + _nonneg(hours)
    p = scale / (scale + exposure)
    term = math.exp(shape * math.log(p)) if p > 0 else 0.0
    total = term
    for n in range(min(most, MAX_TERMS)):
        term *= (shape + n) / (n + 1) * (1 - p)
        total += term
        if term < 1e-15 and n > shape * (1 - p) / p:
            break
    return min(1.0, total)


# -- places ----------------------------------------------------------------------------------------------------


def deterministic_stalls(history: RungHistory) -> List[Stall]:
    """The stalls of a rung at the same place as its stall before (the same-place rule)."""
    stalls = history.stalls
    return [later for earlier, later in zip(stalls, stalls[1:]) if later.at and later.at == earlier.at]


def _ahead(stall: Stall, step: Optional[int]) -> bool:
    """The run has not yet passed ``stall``'s place (unknown places count as ahead)."""
    return stall.step is None or step is None or step <= stall.step


def ban(history: RungHistory, step: Optional[int]) -> Optional[str]:
    """Where a deterministic hang of this rung bans it at ``step``: ahead of it, or in a phase that repeats."""
    holding = [s.at for s in deterministic_stalls(history) if s.phase not in TRAINING_PHASES or _ahead(s, step)]
    return holding[-1] if holding else None


def _hung_ahead(history: RungHistory, step: Optional[int]) -> bool:
    """A stall of this rung, deterministic or not, at a step the run has not passed: a probe never climbs into it."""
    return step is not None and any(s.step is not None and step <= s.step for s in history.stalls)


# -- figures ---------------------------------------------------------------------------------------------------


def _rates(sit: Situation) -> Dict[str, Optional[float]]:
    """Each rung's steps per second: measured, else scaled from the longest-measured rung by prior speeds."""
    measured = {r.name: _rate(_history(sit, r.name).rate) for r in sit.rungs}
    speeds = {r.name: _rate(r.prior_speed) for r in sit.rungs}
    reference: Optional[Tuple[float, float]] = None  # (hours, steps per second per unit of prior speed)
    for name, rate in measured.items():
        speed, hours = speeds[name], _nonneg(_history(sit, name).hours)
        if rate and speed and (reference is None or hours > reference[0]):
            reference = (hours, rate / speed)
    if reference is None:
        return measured
    per_speed = reference[1]
    return {name: measured[name] or (_rate(per_speed * speed) if speed else None) for name, speed in speeds.items()}


def _history(sit: Situation, name: str) -> RungHistory:
    found = sit.history.get(name)
    return found if isinstance(found, RungHistory) else RungHistory()


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _cost_per_stall(sit: Situation, name: str) -> float:
    """This rung's mean stall cost, else the run's, else the prior."""
    own = [s.cost_s for s in _history(sit, name).stalls]
    run = [s.cost_s for r in sit.rungs for s in _history(sit, r.name).stalls]
    return _mean(own) or _mean(run) or PRIOR_STALL_COST_S


def _restart_s(sit: Situation) -> float:
    """What switching rungs costs: the measured restart, else the stalls' mean handling, else the prior."""
    handling = [_nonneg(s.handling_s) for r in sit.rungs for s in _history(sit, r.name).stalls]
    return _rate(sit.restart_s) or _mean(handling) or PRIOR_RESTART_S


def _candidate(sit: Situation, name: str, rate: Optional[float], extra_s: float) -> Candidate:
    """``name``'s figures; ``extra_s``: a restart to switch to it (0 after a stall, when one happens anyway)."""
    history = _history(sit, name)
    stalls, hours = len(history.stalls), _nonneg(history.hours)
    per_h, cost = stalls_per_hour(stalls, hours), _cost_per_stall(sit, name)
    expected, to_go, p_deadline = 0.0, None, None
    if rate is not None:
        work_s = max(0, sit.remaining_steps) / rate
        expected = per_h * work_s / 3600.0
        to_go = work_s + expected * cost + extra_s
        if sit.deadline is not None:
            room = _finite(sit.deadline) - _finite(sit.now) - work_s - extra_s
            most = -1 if room < 0 else int(min(room / cost, MAX_TERMS)) if cost > 0 else MAX_TERMS
            p_deadline = p_at_most(most, stalls, hours, work_s / 3600.0)
    measured = _rate(history.rate) is not None
    return Candidate(name, rate, measured, stalls, hours, per_h, cost, expected, to_go, p_deadline, ban(history, sit.step))


def figures(sit: Situation, switch_from: Optional[str] = None) -> Tuple[Candidate, ...]:
    """Every rung's figures; rungs other than ``switch_from`` pay a restart to switch to."""
    rates = _rates(sit)
    restart = _restart_s(sit) if switch_from is not None else 0.0
    return tuple(_candidate(sit, r.name, rates[r.name], 0.0 if r.name == switch_from else restart) for r in sit.rungs)


def tally(sit: Situation) -> Tally:
    """Time lost to stalls so far against the time the last rung would have cost for the same training."""
    lost = sum(s.cost_s for r in sit.rungs for s in _history(sit, r.name).stalls)
    rates = _rates(sit)
    safest = rates[sit.rungs[-1].name] if sit.rungs else None
    extra = 0.0
    for r in sit.rungs:
        rate = rates[r.name]
        if safest and rate:
            extra += _nonneg(_history(sit, r.name).hours) * 3600.0 * (rate / safest - 1.0)
    return Tally(lost, extra)


# -- words -----------------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.2g}"


def duration(seconds: float) -> str:
    """``45 s``, ``5.1 min``, ``41.2 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe(c: Candidate) -> str:
    """``fast: 2.6 it/s, 1 stall in 4.6 h, 5.1 min per stall -> 41.2 h to go``."""
    if c.banned:
        return f"{c.rung}: hung twice at {c.banned_at}, banned here"
    if c.rate is None or c.to_go_s is None:
        return f"{c.rung}: no step rate yet"
    text = f"{c.rung}: {_number(c.rate)} it/s"
    if c.stalls:
        text += f", {c.stalls} stall{'s' if c.stalls > 1 else ''} in {duration(c.hours * 3600)}"
        text += f", {duration(c.cost_per_stall_s)} per stall"
    text += f" -> {duration(c.to_go_s)} to go"
    return text + (f", {c.p_deadline:.0%} by the deadline" if c.p_deadline is not None else "")


def _compared(candidates: Sequence[Candidate], verdict: str) -> str:
    return "; ".join([describe(c) for c in candidates] + [verdict])


# -- decisions -------------------------------------------------------------------------------------------------


def choose(sit: Situation, trigger: Trigger) -> Decision:
    """The rung for the run's next stretch (see the module docstring for the rules).

    Call it with ``Trigger.STALL`` once the stall is in the current rung's history (the next attempt runs the
    returned rung), and with ``Trigger.CHECKPOINT`` after each checkpoint (when the decision ``moves``, normally a
    ``Kind.PROBE``: stop the child and relaunch on the returned rung; else carry on). Pass the returned
    ``probation`` to the next call.
    Raises ValueError only for a ladder without rungs or a current rung that is not on it.
    """
    names = [r.name for r in sit.rungs]
    if not names:
        raise ValueError("a ladder needs at least one rung")
    if sit.current not in names:
        raise ValueError(f"{sit.current!r} is not on the ladder ({', '.join(names)})")
    unique = tuple(r for i, r in enumerate(sit.rungs) if r.name not in names[:i])
    sit = replace(sit, rungs=unique, remaining_steps=max(0, int(_finite(sit.remaining_steps))), now=_finite(sit.now))
    if trigger is Trigger.STALL:
        return _after_stall(sit)
    return _at_checkpoint(sit)


def _index(sit: Situation, name: Optional[str]) -> int:
    return [r.name for r in sit.rungs].index(name) if name in {r.name for r in sit.rungs} else -1


def _after_stall(sit: Situation) -> Decision:
    """Stay, step down, or (a stall on probation) go back; a stall never climbs."""
    restarted = Probation(since=sit.now, failures=dict(sit.probation.failures))
    if sit.policy is PolicyName.DOWN:
        return _down(sit, restarted, "")
    held = sit.now - _finite(sit.probation.since)
    if sit.probation.probing == sit.current and held < _finite(sit.probation.window_s):
        return _back(sit, restarted, held)
    return _weigh_below(sit, restarted)


def _weigh_below(sit: Situation, probation: Probation) -> Decision:
    """The allowed rung, the current one or a safer one, that finishes first."""
    candidates = figures(sit)
    below = candidates[_index(sit, sit.current) :]
    allowed = [c for c in below if not c.banned]
    if not allowed:
        return _exhausted(sit, candidates, probation)
    if any(c.to_go_s is None for c in allowed):
        return _down(sit, probation, "no step rate measured yet: ")
    best = _best(allowed, sit.current)
    verdict = f"staying on {best.rung}" if best.rung == sit.current else f"down to {best.rung}"
    kind = Kind.STAY if best.rung == sit.current else Kind.DOWN
    return Decision(best.rung, kind, _compared(below, verdict), candidates, probation)


def _best(options: Sequence[Candidate], current: str) -> Candidate:
    """The best chance of meeting the deadline (when there is one), then the least time to go, then staying."""
    chances = [c.p_deadline for c in options if c.p_deadline is not None]
    if chances:
        top = max(chances)
        options = [c for c in options if c.p_deadline is not None and c.p_deadline >= top - DEADLINE_TIE]
    return min(options, key=lambda c: (c.to_go_s or 0.0, c.rung != current))


def _down(sit: Situation, probation: Probation, prefix: str) -> Decision:
    """Today's rule: the first allowed rung below; on the last rung, the same one again."""
    candidates = figures(sit)
    at = _index(sit, sit.current)
    lower = [c for c in candidates[at + 1 :] if not c.banned]
    if lower:
        reason = f"{prefix}down to {lower[0].rung}: a stall moves one rung down for good"
        return Decision(lower[0].rung, Kind.DOWN, reason, candidates, probation)
    if candidates[at].banned:
        return _exhausted(sit, candidates, probation)
    return Decision(sit.current, Kind.STAY, f"{prefix}no rung below {sit.current}: {sit.current} again", candidates, probation)


def _exhausted(sit: Situation, candidates: Sequence[Candidate], probation: Probation) -> Decision:
    here = candidates[_index(sit, sit.current)]
    reason = f"{describe(here)}, and no rung below it is allowed here: nothing left to try"
    return Decision(sit.current, Kind.STAY, reason, tuple(candidates), probation, exhausted=True)


def _back(sit: Situation, probation: Probation, held: float) -> Decision:
    """A stall on probation: back to the rung the probe came from (else the nearest allowed below), wait doubled."""
    failures = dict(probation.failures)
    failures[sit.current] = int(_nonneg(failures.get(sit.current, 0))) + 1
    probation = replace(probation, failures=failures)
    candidates = figures(sit)
    lower = [c for c in candidates[_index(sit, sit.current) + 1 :] if not c.banned]
    if not lower:
        return _weigh_below(sit, probation)
    target = next((c for c in lower if c.rung == sit.probation.origin), lower[0])
    reason = (
        f"{sit.current} stalled {duration(held)} into its {duration(sit.probation.window_s)} probation: "
        f"back to {target.rung}; its next probe waits {2 ** min(failures[sit.current], MAX_DOUBLINGS)}x longer"
    )
    return Decision(target.rung, Kind.BACK, reason, candidates, probation)


def _at_checkpoint(sit: Situation) -> Decision:
    """Carry on, end a probation that held, or probe a faster rung."""
    probation = sit.probation
    if ban(_history(sit, sit.current), sit.step) is not None:  # only from figures that skipped the stall that banned it
        moved = Probation(since=sit.now, failures=dict(probation.failures))
        return _down(sit, moved, "") if sit.policy is PolicyName.DOWN else _weigh_below(sit, moved)
    if sit.policy is PolicyName.DOWN:
        return Decision(sit.current, Kind.STAY, "--ladder-policy down never climbs", figures(sit), probation)
    if probation.probing == sit.current:
        held = sit.now - _finite(probation.since)
        if held < _finite(probation.window_s):
            reason = f"{sit.current} on probation: {duration(held)} of {duration(probation.window_s)} held"
            return Decision(sit.current, Kind.STAY, reason, figures(sit), probation)
        ended = replace(probation, probing=None, origin=None, window_s=0.0)
        return Decision(sit.current, Kind.STAY, f"{sit.current} held {duration(held)} on probation: passed", figures(sit), ended)
    return _maybe_probe(sit)


@dataclass(frozen=True)
class _Probe:
    candidate: Candidate
    #: The ski-rental wait before doubling: also the probation window.
    base_s: float
    #: The wait with this rung's failed probes doubled in.
    wait_s: float
    #: Time to go on it if it no longer stalls (what the probe hopes for).
    optimistic_s: float


def _probe_option(sit: Situation, there: Candidate, here: Candidate, restart: float) -> Optional[_Probe]:
    """The wait before probing ``there`` from ``here``, None when it must not or would not pay."""
    history = _history(sit, there.rung)
    if there.banned or _hung_ahead(history, sit.step) or there.rate is None or here.rate is None or here.to_go_s is None:
        return None
    rent = 1.0 - here.rate / there.rate
    price = restart + there.cost_per_stall_s
    optimistic = sit.remaining_steps / there.rate + restart
    if rent <= 0 or here.to_go_s - optimistic <= price:
        return None
    base = price / rent
    failures = max(0, int(_finite(sit.probation.failures.get(there.rung, 0))))
    return _Probe(there, base, base * 2.0 ** min(failures, MAX_DOUBLINGS), optimistic)


def _maybe_probe(sit: Situation) -> Decision:
    """PROBE the fastest faster rung whose wait this stall-free stretch has served; else STAY and say when."""
    candidates = figures(sit, switch_from=sit.current)
    here = candidates[_index(sit, sit.current)]
    stable = sit.now - _finite(sit.probation.since)
    if here.p_deadline is not None and here.p_deadline >= DEADLINE_SURE:
        reason = f"{describe(here)}: sure enough of the deadline, no probe"
        return Decision(sit.current, Kind.STAY, reason, candidates, sit.probation)
    restart = _restart_s(sit)
    options = [_probe_option(sit, c, here, restart) for c in candidates[: _index(sit, sit.current)]]
    probes = [o for o in options if o is not None]
    ready = [o for o in probes if stable >= o.wait_s]
    if not ready:
        soonest = min(probes, key=lambda o: o.wait_s, default=None)
        later = f", probing {soonest.candidate.rung} after {duration(soonest.wait_s)} stable" if soonest else ""
        reason = f"{sit.current} stable for {duration(stable)}{later}"
        return Decision(sit.current, Kind.STAY, reason, candidates, sit.probation)
    pick = min(ready, key=lambda o: o.optimistic_s)
    target = pick.candidate.rung
    probation = replace(sit.probation, since=sit.now, probing=target, origin=sit.current, window_s=pick.base_s)
    verdict = (
        f"probing {target} (without stalls: {duration(pick.optimistic_s)} to go) after {duration(stable)} stable "
        f"on {sit.current}, on probation for {duration(pick.base_s)}"
    )
    return Decision(target, Kind.PROBE, _compared([pick.candidate, here], verdict), candidates, probation)
