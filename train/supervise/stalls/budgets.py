"""How long a child may stay silent before it counts as stalled.

Which budget applies, in order:

1. no beat yet in this attempt: ``startup`` (``--startup-timeout``);
2. the last beat declared ``timeout``: ``phase:<phase>`` with that value (a percentage-only bar's budget, read from
   the output, is bounded by a ``--stall-timeout`` the user gave: :attr:`BudgetPolicy.bound_s`);
3. the last beat was a step of a counter that is still counting, and its phase has a learned budget:
   ``learned:<phase>``;
4. otherwise ``stall`` (``--stall-timeout``).

**A learned or output-declared budget is a suspicion, not a verdict** (:attr:`Budget.busy_s`). It is a guess from
the rhythm of a counter; a program's own declared ``timeout``, the startup and the stall budgets are verdicts. When a
suspicion runs out, :func:`trainbox.supervise.stalls.silence.judge` calls a tree that is idle, stopped or waiting
forever (the stack says so) a stall at once, and gives a busy one (an evaluation, a save between two steps) until
``busy_s``: the plain stall budget, or, once the phase has had :data:`EARLIER_SAMPLES` silences longer than its
learned budget that ended in progress (the evaluation every ``eval_interval`` steps), ``factor`` times the longest of
them, whichever is less (rule ``earlier_silences``: an evaluation that took 70 s twice and now runs for 10 minutes is
judged at 210 s). Those long silences are kept apart from the rhythm (:attr:`PhaseRhythm.long`): learned from, an
evaluation would raise the budget between two steps to three times its length, and an idle hang in the middle of
the counter would no longer be found at the floor.

**A learned budget applies only between steps of a counter that is still counting** (:func:`counting`): the
beat before the silence moved the same counter on (the same bar or line form, phase, epoch and total) and did not
bring it to its total. After a bar reaches its total, and after the first reading of a new bar or a new phase,
the silence is judged by the plain budgets and the idle rule: that is where a real script evaluates, saves a
checkpoint, re-scans its data or runs an end-of-epoch hook, silently and for as long as it takes, and the rhythm
of the bar's steps says nothing about how long that is. (A learned budget applied there killed a healthy script
60 s into a 90 s silent evaluation after its bar had finished.) The same intervals are the only ones learned from:
the gap between one bar's end and the next bar's first step is not a step.

Learned budgets follow NVIDIA's nvidia-resiliency-ext: after ``min_samples``
silent intervals between steps have been seen in a phase, its budget becomes ``factor`` times
the longest of them, never below ``floor``. A steady counter is learned sooner (:meth:`BudgetPolicy.learned`):
from :data:`EARLY_SAMPLES` intervals on, while the longest is within :data:`STEADY_RATIO` of their median, with
the margin scaled to how little was seen (``factor x longest x min_samples / samples``: four times the margin at
5 of 20 intervals, the plain one at 20), and never below ``floor`` either, so a mid-bar pause of up to the floor
(a garbage collection, a save inside the bar) is never a stall. A learned budget is in force only
when it is below the stall timeout: it only ever tightens detection of a phase
whose rhythm is known, and a stall under the plain stall timeout is named
``stall`` however many intervals were seen (how many a reader of printed
progress sees depends on how often it looks). They are
forgotten when the profile changes (other loader settings, other rhythm): the
supervisor starts a new policy then.

The numbers come from ``trainbox.supervise.settings`` (defaults, rules) and
the attempt's ``Launch``, both validated before a policy is made.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: The most a beat's declared ``timeout`` is honoured for: a day. No silent phase of a training run
#: (a MIOpen or torch.compile cold start, a checkpoint gather, a long validation) legitimately lasts
#: longer, and a child must not switch stall detection off with ``Infinity`` or ``1e308``.
MAX_DECLARED_S = 24 * 3600.0
#: A phase's budget is learned from this many intervals on when its counter is steady (see the module docstring):
#: five gaps between steps show a rhythm; fewer are one slow first batch away from a wrong one.
EARLY_SAMPLES = 5
#: A phase's earlier long silences bound a busy silence once this many were seen ("twice before"): one is a slow
#: first evaluation (a cold cache) away from a bound too tight.
EARLIER_SAMPLES = 2
#: The long silences of a phase that are kept (the newest): a program's evaluations change with its data.
EARLIER_KEEP = 8
#: A counter is steady while its longest interval is at most this many times the median one (a loop at an even
#: pace, with the odd slower step); a counter that stalls for seconds now and then waits for the full count.
STEADY_RATIO = 3.0


@dataclass(frozen=True)
class Budget:
    name: str
    seconds: float
    #: A suspicion's allowance: how long a busy tree may stay silent before it is judged (the plain stall budget, or
    #: the phase's earlier long silences' bound, the lesser); None: this budget is a verdict.
    busy_s: Optional[float] = None
    #: ``busy_s`` is the bound of the phase's earlier long silences, not the plain stall budget.
    by_earlier: bool = False


@dataclass
class PhaseRhythm:
    samples: int = 0
    longest_s: float = 0.0
    #: The intervals seen while fewer than the full count: the early budget's steadiness is judged from them.
    early: List[float] = field(default_factory=list)
    #: Silences between two steps longer than the learned budget in force (an evaluation, a save), newest last.
    long: List[float] = field(default_factory=list)


def _whole(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reading(beat: Optional[Dict[str, Any]]) -> Optional[Tuple[Tuple[Any, ...], int, Optional[int]]]:
    """Which counter a beat reads, where it stands, and its total: ``(counter, count, total)``; None without one.

    A counter is the same bar or line form (``pattern``, and the output's ``counter`` where it names one) in the
    same phase; a batch counts within its epoch and ``batches``, a step within ``steps`` (a bar's total, when the
    output showed one), a bar nested in the main one (an evaluation, a save: ``side_step``) within ``side_total``.
    """
    if beat is None:
        return None
    form = (str(beat.get("pattern", "")), str(beat.get("counter", "")), str(beat.get("phase", "")))
    side, batch, step = (_whole(beat.get(key)) for key in ("side_step", "batch", "step"))
    if side is not None:
        return (*form, "side"), side, _whole(beat.get("side_total"))
    if batch is not None:
        total = _whole(beat.get("batches"))
        return (*form, "batch", repr(beat.get("epoch")), total), batch, total
    if step is not None:
        total = _whole(beat.get("steps"))
        return (*form, "step", total), step, total
    return None


def from_output(beat: Optional[Dict[str, Any]]) -> bool:
    """Whether ``beat`` was read from the output (a counter's), not written by the program itself."""
    return beat is not None and ("pattern" in beat or "counter" in beat)


def continues(previous: Optional[Dict[str, Any]], beat: Optional[Dict[str, Any]]) -> bool:
    """Whether ``beat`` is a step of the counter ``previous`` read: the same counter, further on."""
    before, after = _reading(previous), _reading(beat)
    return before is not None and after is not None and before[0] == after[0] and after[1] > before[1]


def counting(previous: Optional[Dict[str, Any]], beat: Optional[Dict[str, Any]]) -> bool:
    """Whether the silence after ``beat`` (which followed ``previous``) is one between steps of a counter that is still
    counting: ``beat`` moved its counter on, and not to its total. Only such a silence is judged by a learned budget."""
    reading = _reading(beat)
    if reading is None or not continues(previous, beat):
        return False
    _, count, total = reading
    return total is None or count < total


@dataclass
class BudgetPolicy:
    startup_s: float
    stall_s: float
    factor: float
    floor_s: float
    min_samples: int
    rhythm: Dict[str, PhaseRhythm] = field(default_factory=dict)
    #: The ``--stall-timeout`` the user gave (None: the default or a profile's): it bounds every budget a bar declares.
    bound_s: Optional[float] = None

    def observe(self, beat: Optional[Dict[str, Any]], silent_s: float, following: Optional[Dict[str, Any]]) -> None:
        """Record how long the child stayed silent after ``beat`` before its next progress, ``following``: an interval
        of the phase's rhythm when ``following`` is a step of the counter ``beat`` read (:func:`continues`); a long
        silence of the phase when it outlasted the learned budget in force (see the module docstring)."""
        if beat is None or beat.get("timeout") is not None or self.factor == 0 or not continues(beat, following):
            return
        phase = str(beat.get("phase", ""))
        learned = self.learned().get(phase)
        rhythm = self.rhythm.setdefault(phase, PhaseRhythm())
        if learned is not None and silent_s > learned:
            rhythm.long = [*rhythm.long, silent_s][-EARLIER_KEEP:]
            return
        rhythm.samples += 1
        rhythm.longest_s = max(rhythm.longest_s, silent_s)
        if rhythm.samples < self.min_samples:
            rhythm.early.append(silent_s)
        else:
            rhythm.early = []

    def _budget(self, rhythm: PhaseRhythm) -> Optional[float]:
        """A phase's learned budget; None while too little was seen (see the module docstring)."""
        if rhythm.samples >= self.min_samples:
            return max(self.floor_s, self.factor * rhythm.longest_s)
        steady = rhythm.longest_s <= STEADY_RATIO * statistics.median(rhythm.early) if rhythm.early else False
        if rhythm.samples < EARLY_SAMPLES or not steady:
            return None
        return max(self.floor_s, self.factor * rhythm.longest_s * self.min_samples / rhythm.samples)

    def learned(self) -> Dict[str, float]:
        """Learned budgets in force, by phase."""
        if self.factor == 0:
            return {}
        budgets = {phase: self._budget(r) for phase, r in self.rhythm.items()}
        return {phase: round(seconds, 3) for phase, seconds in budgets.items() if seconds is not None and seconds < self.stall_s}

    def earlier_s(self, phase: str) -> Optional[float]:
        """The bound a busy silence of ``phase`` gets from the phase's earlier long silences; None while too few."""
        rhythm = self.rhythm.get(phase)
        if self.factor == 0 or rhythm is None or len(rhythm.long) < EARLIER_SAMPLES:
            return None
        return round(self.factor * max(rhythm.long), 3)

    def _suspicion(self, name: str, seconds: float, phase: str) -> Budget:
        """A learned or output-declared budget, with what a busy tree is allowed past it (none when it is no less)."""
        earlier = self.earlier_s(phase)
        allowed = self.stall_s if earlier is None else min(self.stall_s, earlier)
        if allowed <= seconds:
            return Budget(name, seconds)
        return Budget(name, seconds, allowed, by_earlier=earlier is not None and earlier < self.stall_s)

    def current(self, beat: Optional[Dict[str, Any]], counting: bool = False) -> Budget:
        """The budget for the silence after ``beat``; ``counting``: that silence is between steps of a counter still
        counting (:func:`counting`), the only kind a learned budget judges."""
        if beat is None:
            return Budget("startup", self.startup_s)
        phase = str(beat.get("phase", ""))
        declared = beat.get("timeout")
        if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared > 0:  # NaN is not > 0
            seconds = min(float(declared), MAX_DECLARED_S)
            if not from_output(beat):  # the program's own word for its phase: a verdict
                return Budget(f"phase:{phase}", seconds)
            return self._suspicion(f"phase:{phase}", seconds if self.bound_s is None else min(seconds, self.bound_s), phase)
        learned = self.learned().get(phase) if counting else None
        if learned is not None:
            return self._suspicion(f"learned:{phase}", learned, phase)
        return Budget("stall", self.stall_s)


def rounded_up(seconds: float, places: int) -> float:
    """``seconds`` rounded up to ``places`` decimals: how a silence or an age found past its bound is recorded.

    Rounded to the nearest, 2.0004 s found past a 2 s bound would read 2.0, no longer than the bound (a stall event
    and a hung supervisor's age both did). The product is rounded to 6 decimals first, so that float noise
    (4.03 * 1000 = 4030.0000000000005) does not add a step.
    """
    scale = 10**places
    return math.ceil(round(seconds * scale, 6)) / scale
