"""The counters a run's output shows, followed as counters: which reading is progress, and which counter is the place.

:mod:`trainbox.supervise.output.progress` reads one display line into a :class:`Reading`; :class:`Counters` keeps
what each counter did and answers with a beat when one moved. Each bar or line form is a counter of its own (its
*track*: the pattern, its label with the digits masked, its total), and it must advance as a counter does:

* **Forward, by its own steps.** A reading is progress when it is past the furthest place its counter reached
  (epoch, then batch, then step). A reading behind it is no progress (another rank's copy of the bar, a number that
  only looked like a counter) and moves nothing, unless the counter starts again from :data:`RESTART_COUNT` or
  less: a new epoch's bar, a new evaluation, a new segment of that counter. A counter with no total that jumps
  more than :data:`JUMP_FACTOR` times its largest step so far is not trusted for that reading: its place moves
  (a log interval may change once) but the silence goes on.
* **One main counter gives the place.** The run's main counter is the one that ran longest: the seconds between
  its consecutive advances, summed (a training bar, over an evaluation bar that runs now and then, a save's
  ``Writing model shards 1/1``, a data set scan). The first counter seen is the main one until another has run
  longer, or until it is complete (``n == total``: what comes after a finished bar is not nested in it). A reading
  of another counter is a *phase inside that place*: its beat keeps the main counter's place (``epoch``,
  ``batch``, ``step``), takes that counter's phase when its label names one, and carries its count apart
  (``side_step``, ``side_total``). So a stall during a checkpoint save is placed at the training step, not at
  step 1 of the shard writer, and two saves of a run are two places.
* **One unit per run.** A reading that counts only epochs (Hugging Face's ``{'epoch': 0.625}`` log dict, an
  ``epoch 3`` line) is kept apart once a counter of batches or steps is known: it moves no place and is no
  progress (the bar it follows has already moved).
* **Each beat names its counter** (``counter``: the track), so that the pace of a training bar is never pooled with
  an evaluation bar's (:mod:`trainbox.supervise.pace.detector` measures each counter on its own).
* **A bar that shows only a percentage** (``rich.progress.track``: ``━━━ 45%``) is judged by the time one percent
  takes: its beats declare a ``timeout`` of :data:`PERCENT_FACTOR` times the longest percent seen, never under the
  stall budget, and before a percent has passed, :data:`~trainbox.supervise.stalls.budgets.MAX_DECLARED_S` (only an
  idle tree is a stall then). :attr:`Counters.notices` holds the line that says so, once.

Pure and thread-unsafe: :class:`~trainbox.supervise.output.progress.OutputProgress` calls it under its lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Optional, OrderedDict, Tuple, Union

from trainbox.supervise.stalls.budgets import MAX_DECLARED_S

Number = Union[int, float]

#: Tracks remembered at once (least recently advanced forgotten first; never the main one): a run draws a handful of
#: bars; a child whose bar labels keep changing (a path, a file name in the label) must not grow the table.
MAX_TRACKS = 64
#: A counter that goes back to this or less starts again (tqdm's bars start at 0, a log's steps at 0 or 1).
RESTART_COUNT = 1
#: A counter with no total that advances by more than this many times its largest step so far, once it has advanced
#: MIN_STEPS_KNOWN times, is not trusted for that reading: a log every 10 steps does not become one every 1000.
JUMP_FACTOR = 100
MIN_STEPS_KNOWN = 3
#: A percentage-only bar's silence budget: this many times the longest time one percent took (a percent is an
#: average of many steps, so its time varies less than a step's; the learned budgets use 3 for steps as well).
PERCENT_FACTOR = 3.0
#: The pattern of a bar that shows only a percentage (:mod:`trainbox.supervise.output.progress`'s rich form).
PERCENT_PATTERN = "rich-percent"
#: Said once per attempt when its output's counter is a percentage only.
PERCENT_NOTICE = (
    "its progress bar shows only a percentage: a silence is judged by the time one percent takes "
    f"({PERCENT_FACTOR:g}x the longest seen, never under the stall budget); until one percent has passed, "
    "only a process tree gone idle is a stall"
)


@dataclass(frozen=True)
class Reading:
    """What one line says about progress: the counters it shows, as printed, and which counter (``track``) it is.

    ``total`` is the total of its count (the batch's or the step's), None when the line shows none.
    """

    pattern: str
    track: str = ""
    phase: Optional[str] = None
    epoch: Optional[Number] = None
    epochs: Optional[int] = None
    batch: Optional[int] = None
    batches: Optional[int] = None
    step: Optional[int] = None
    total: Optional[int] = None

    @property
    def place(self) -> Tuple[Optional[str], Optional[Number], Optional[int], Optional[int]]:
        """Where the counter stands; the same place twice is no progress."""
        return self.phase, self.epoch, self.batch, self.step

    @property
    def count(self) -> Optional[int]:
        """The batch or step it counts, None for a reading of epochs only."""
        return self.batch if self.batch is not None else self.step

    @property
    def complete(self) -> bool:
        """A bar at its end (``n == total``)."""
        return self.total is not None and self.count is not None and self.count >= self.total


def beat_of(reading: Reading) -> Dict[str, Any]:
    """A reading as a heartbeat carries it: ``phase``, ``epoch``, ``batch``, ``step`` (the totals beside: ``epochs``,
    ``batches``, ``steps``), ``pattern``."""
    fields = ("phase", "epoch", "epochs", "batch", "batches", "step")
    beat: Dict[str, Any] = {name: getattr(reading, name) for name in fields if getattr(reading, name) is not None}
    if reading.step is not None and reading.batch is None and reading.total is not None:
        beat["steps"] = reading.total  # a learned budget judges no silence after a bar's last step
    beat["pattern"] = reading.pattern
    return beat


class Move(Enum):
    """What a reading does to its counter."""

    SAME = "same"  # a redraw, a repeat: nothing
    BACK = "back"  # behind the furthest place, not a restart: nothing
    JUMP = "jump"  # too far at once: the place moves, no progress
    FORWARD = "forward"  # progress
    RESTART = "restart"  # progress: the counter starts again (a new segment)


def _order(reading: Reading) -> Tuple[Number, Number, Number]:
    return tuple(-1 if value is None else value for value in (reading.epoch, reading.batch, reading.step))  # type: ignore[return-value]


@dataclass
class Track:
    """One counter as it ran: its furthest reading, when it last advanced, how long it ran, its largest step."""

    key: str
    reading: Reading
    last_at: float
    ran_s: float = 0.0
    advances: int = 0
    largest: int = 0
    #: Percentage-only bars: the longest seconds one percent took, None before one has passed.
    percent_s: Optional[float] = None

    def move(self, reading: Reading) -> Move:
        """What ``reading`` does to this counter (see the module docstring)."""
        new, old = _order(reading), _order(self.reading)
        if new == old:
            return Move.SAME
        if new < old:
            count = reading.count
            return Move.RESTART if count is not None and count <= RESTART_COUNT else Move.BACK
        step = self._step(reading)
        unbounded = reading.total is None and self.advances >= MIN_STEPS_KNOWN
        if step is not None and unbounded and step > JUMP_FACTOR * max(1, self.largest):
            return Move.JUMP
        return Move.FORWARD

    def _step(self, reading: Reading) -> Optional[int]:
        """How far ``reading``'s count is past this counter's, in the same epoch; None when not comparable."""
        count, before = reading.count, self.reading.count
        if count is None or before is None or reading.epoch != self.reading.epoch:
            return None
        return count - before

    def take(self, reading: Reading, move: Move, now: float, consecutive: bool) -> None:
        """``reading`` moved this counter at ``now``; ``consecutive``: this counter made the last progress too."""
        step = self._step(reading)
        if consecutive and move is Move.FORWARD:
            self.ran_s += max(0.0, now - self.last_at)
            if reading.pattern == PERCENT_PATTERN and step:
                per_percent = max(0.0, now - self.last_at) / step
                self.percent_s = max(self.percent_s or 0.0, per_percent)
        if move is Move.FORWARD and step is not None:
            self.largest = max(self.largest, step)
        self.reading, self.last_at = reading, now
        self.advances += 1


class Counters:
    """Every counter of one attempt's output, and its main one (see the module docstring).

    ``floor_s``: the least a percentage-only bar's declared budget may be (the attempt's stall budget).
    """

    def __init__(self, floor_s: float = 0.0) -> None:
        self.floor_s = floor_s
        self.tracks: OrderedDict[str, Track] = collections.OrderedDict()
        self.main: Optional[Track] = None
        self._last: Optional[str] = None
        #: Lines to say once, for the supervisor (a percentage-only bar's).
        self.notices: List[str] = []

    def take(self, reading: Reading, now: float) -> Optional[Dict[str, Any]]:
        """The beat when ``reading`` (at ``now``) was progress; None when it moved no counter forward."""
        track = self.tracks.get(reading.track)
        if track is None:
            track = self._new(reading, now)
        else:
            move = track.move(reading)
            if move in (Move.SAME, Move.BACK):
                return None
            track.take(reading, move, now, consecutive=self._last == track.key)
            self.tracks.move_to_end(track.key)
            if move is Move.JUMP:
                return None
        if reading.count is None and self.main is not None and self.main is not track:
            return None  # epochs only, beside a counter of batches or steps: kept apart
        self._choose(track)
        self._last = track.key
        return self._beat(track)

    def _new(self, reading: Reading, now: float) -> Track:
        track = Track(reading.track, reading, now)
        self.tracks[track.key] = track
        while len(self.tracks) > MAX_TRACKS:
            oldest = next(key for key in self.tracks if self.tracks[key] is not self.main)
            del self.tracks[oldest]
        if reading.pattern == PERCENT_PATTERN and PERCENT_NOTICE not in self.notices:
            self.notices.append(PERCENT_NOTICE)
        return track

    def _choose(self, track: Track) -> None:
        """``track`` becomes the main counter when there is none, the main one is complete, or it ran longer."""
        if track.reading.count is None:
            return
        main = self.main
        if main is None or main.reading.complete or track.ran_s > main.ran_s:
            self.main = track

    def _beat(self, track: Track) -> Dict[str, Any]:
        """The main counter's place; a side counter's phase and count inside it; the counter that moved."""
        main = self.main if self.main is not None else track
        beat = beat_of(main.reading)
        if main is not track:
            side = {"phase": track.reading.phase, "side_step": track.reading.count, "side_total": track.reading.total}
            beat.update((key, value) for key, value in side.items() if value is not None)
        timeouts = [seconds for seconds in (self._timeout(main), self._timeout(track)) if seconds is not None]
        if timeouts:
            beat["timeout"] = max(timeouts)
        beat["counter"] = track.key
        return beat

    def _timeout(self, track: Track) -> Optional[float]:
        """A percentage-only bar's budget, None for any other counter."""
        if track.reading.pattern != PERCENT_PATTERN:
            return None
        if track.percent_s is None:
            return MAX_DECLARED_S
        return min(MAX_DECLARED_S, max(self.floor_s, round(PERCENT_FACTOR * track.percent_s, 3)))
