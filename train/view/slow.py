"""The periods a run spent slower than its own pace, read from its ``slow`` and ``recovered`` events.

The supervisor records (:mod:`trainbox.supervise.pace.watch`); this draws. A period opens at a ``slow`` event
(from its ``since_ts``, when the change began) and closes at the next ``recovered`` event, or when the run ended
(its ``exit``) while still slow; one that has neither is going on. A restart does not close it: a slowdown that
a restart cured recovers in the next attempt, and that is what its ``recovered`` says.

Events are untrusted (a hand-edited or half-written file, an older trainbox): a field of the wrong type reads as
unknown, and nothing here raises on it.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _lines(value: Any) -> Tuple[str, ...]:
    """An event's ``evidence``: its strings (one string is one line)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(" ".join(str(line).split()) for line in value if isinstance(line, (str, int, float)))
    return ()


@dataclass(frozen=True)
class SlowPeriod:
    """One slowdown: when it began, when it was flagged and ended (None: going on), how slow, and why."""

    attempt: Any
    since_ts: float
    flagged_ts: float
    ended_ts: Optional[float]
    recovered: bool
    ratio: Optional[float]
    phase: Optional[str]
    suspect: str
    evidence: Tuple[str, ...]
    action: str

    def seconds(self, now: float) -> float:
        return max(0.0, (self.ended_ts if self.ended_ts is not None else now) - self.since_ts)

    def line(self) -> str:
        """``slow: 0.41x of this run's pace since 14:02 (suspect: contention)``."""
        ratio = f"{self.ratio:.2f}x" if self.ratio is not None else "a fraction"
        since = datetime.datetime.fromtimestamp(self.since_ts).strftime("%H:%M")
        return f"slow: {ratio} of this run's pace since {since} (suspect: {self.suspect})"


def _opened(event: Dict[str, Any]) -> Optional[SlowPeriod]:
    flagged = _number(event.get("ts"))
    if flagged is None:
        return None
    since = _number(event.get("since_ts"))
    phase = event.get("phase")
    return SlowPeriod(
        attempt=event.get("attempt"),
        since_ts=since if since is not None and since <= flagged else flagged,
        flagged_ts=flagged,
        ended_ts=None,
        recovered=False,
        ratio=_number(event.get("ratio")),
        phase=phase if isinstance(phase, str) else None,
        suspect=str(event.get("suspect") or "unknown"),
        evidence=_lines(event.get("evidence")),
        action=str(event.get("action") or "report"),
    )


def _closed(period: SlowPeriod, ts: Optional[float], recovered: bool) -> SlowPeriod:
    ended = max(ts, period.since_ts) if ts is not None else period.flagged_ts
    return dataclasses.replace(period, ended_ts=ended, recovered=recovered)


def periods(events: Sequence[Dict[str, Any]]) -> List[SlowPeriod]:
    """Every slow period in ``events`` (events.jsonl's records, in order)."""
    found: List[SlowPeriod] = []
    current: Optional[SlowPeriod] = None
    for event in events:
        kind = event.get("event")
        if kind == "slow":
            if current is not None:
                found.append(_closed(current, _number(event.get("ts")), recovered=False))
            current = _opened(event)
        elif kind in ("recovered", "exit") and current is not None:
            when = _number(event.get("recovered_ts")) if kind == "recovered" else None
            found.append(_closed(current, when if when is not None else _number(event.get("ts")), kind == "recovered"))
            current = None
    return found + ([current] if current is not None else [])


def going_on(events: Sequence[Dict[str, Any]]) -> Optional[SlowPeriod]:
    """The slow period under way (the run is slow now), None when the run is at its pace or over."""
    found = periods(events)
    return found[-1] if found and found[-1].ended_ts is None else None


def total_s(found: Sequence[SlowPeriod], now: float) -> float:
    """Seconds spent slow over ``found``."""
    return sum(period.seconds(now) for period in found)
