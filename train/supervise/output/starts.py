"""Where each counter of one attempt's output started: its first reading and the first one past it.

The work an attempt did again is counted from where it began (:mod:`trainbox.supervise.resume.redone`), and the
beats the monitor sees are not that: it looks every half second, so a program that prints fast has long passed its
first counter by then, and the first counter it sees may be another one (a data set scan before the training bar).
So the output reader keeps, for every counter (its *track*, the ``counter`` each beat names), the place of its very
first reading and of the first reading past it, as they were read, line by line. Two are enough: a bar drawn at 0
before any work is known by the one after it, and the step between the two is the counter's stride.

Pure and thread-unsafe: :class:`~trainbox.supervise.output.progress.OutputProgress` calls it under its lock.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from trainbox.supervise.output.counters import Reading, beat_of

#: Counters whose start is remembered (a run draws a handful; labels that keep changing must not grow the table).
MAX_STARTS = 64


def _order(reading: Reading) -> Tuple[float, float, float]:
    return tuple(-1 if value is None else value for value in (reading.epoch, reading.batch, reading.step))  # type: ignore[return-value]


class Starts:
    """The first two places of each counter of one attempt (see the module docstring)."""

    def __init__(self) -> None:
        self._starts: Dict[str, List[Reading]] = {}

    def take(self, reading: Reading) -> None:
        """A reading of the output, in the order read (any reading, progress or not)."""
        if reading.count is None:
            return
        seen = self._starts.get(reading.track)
        if seen is None:
            if len(self._starts) < MAX_STARTS:
                self._starts[reading.track] = [reading]
        elif len(seen) == 1 and _order(reading) > _order(seen[0]):
            seen.append(reading)

    def of(self, counter: str) -> List[Dict[str, Any]]:
        """The first one or two places of ``counter``, as beats (``pattern``, ``epoch``, ``batch`` or ``step`` ...)."""
        return [dict(beat_of(reading), counter=counter) for reading in self._starts.get(counter, [])]

    def counters(self) -> List[str]:
        """Every counter read, the first read first."""
        return list(self._starts)
