"""How long a child may stay silent before it counts as stalled.

Which budget applies, in order:

1. no beat yet in this attempt: ``startup`` (``--startup-timeout``);
2. the last beat declared ``timeout``: ``phase:<phase>`` with that value;
3. the phase has a learned budget: ``learned:<phase>``;
4. otherwise ``stall`` (``--stall-timeout``).

Learned budgets follow NVIDIA's nvidia-resiliency-ext: after ``min_samples``
silent intervals have been seen in a phase, its budget becomes ``factor`` times
the longest of them, never below ``floor``. A learned budget is in force only
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
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

#: The most a beat's declared ``timeout`` is honoured for: a day. No silent phase of a training run
#: (a MIOpen or torch.compile cold start, a checkpoint gather, a long validation) legitimately lasts
#: longer, and a child must not switch stall detection off with ``Infinity`` or ``1e308``.
MAX_DECLARED_S = 24 * 3600.0


@dataclass(frozen=True)
class Budget:
    name: str
    seconds: float


@dataclass
class PhaseRhythm:
    samples: int = 0
    longest_s: float = 0.0


@dataclass
class BudgetPolicy:
    startup_s: float
    stall_s: float
    factor: float
    floor_s: float
    min_samples: int
    rhythm: Dict[str, PhaseRhythm] = field(default_factory=dict)

    def observe(self, beat: Optional[Dict[str, Any]], silent_s: float) -> None:
        """Record how long the child stayed silent after ``beat`` before its next progress."""
        if beat is None or beat.get("timeout") is not None or self.factor == 0:
            return
        rhythm = self.rhythm.setdefault(str(beat.get("phase", "")), PhaseRhythm())
        rhythm.samples += 1
        rhythm.longest_s = max(rhythm.longest_s, silent_s)

    def learned(self) -> Dict[str, float]:
        """Learned budgets in force, by phase."""
        if self.factor == 0:
            return {}
        known = {phase: r for phase, r in self.rhythm.items() if r.samples >= self.min_samples}
        budgets = {phase: round(max(self.floor_s, self.factor * r.longest_s), 3) for phase, r in known.items()}
        return {phase: seconds for phase, seconds in budgets.items() if seconds < self.stall_s}

    def current(self, beat: Optional[Dict[str, Any]]) -> Budget:
        if beat is None:
            return Budget("startup", self.startup_s)
        phase = str(beat.get("phase", ""))
        declared = beat.get("timeout")
        if isinstance(declared, (int, float)) and not isinstance(declared, bool) and declared > 0:  # NaN is not > 0
            return Budget(f"phase:{phase}", min(float(declared), MAX_DECLARED_S))
        learned = self.learned().get(phase)
        if learned is not None:
            return Budget(f"learned:{phase}", learned)
        return Budget("stall", self.stall_s)


def rounded_up(seconds: float, places: int) -> float:
    """``seconds`` rounded up to ``places`` decimals: how a silence or an age found past its bound is recorded.

    Rounded to the nearest, 2.0004 s found past a 2 s bound would read 2.0, no longer than the bound (a stall event
    and a hung supervisor's age both did). The product is rounded to 6 decimals first, so that float noise
    (4.03 * 1000 = 4030.0000000000005) does not add a step.
    """
    scale = 10**places
    return math.ceil(round(seconds * scale, 6)) / scale
