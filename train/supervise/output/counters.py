"""What counts as progress in a run's output: one model of a counter, and which counter gives the place.

:mod:`trainbox.supervise.output.progress` reads one display line into a :class:`Reading`; :class:`Counters` follows
each counter the output shows and answers with a beat when a reading was progress. docs/progress.md says the same
for a user.

**A counter** is one bar or one line form with its label: the pattern that read it, its label with the digits
masked (an epoch number, a loss in the label), and its total (its *track*, which each beat names as ``counter``).
Its value is its place: epoch, then batch, then step. A counter makes progress when its value changes in any way
real programs change it:

* **forward, by any amount**: a bar's next step, a log line every 10 steps, a log that prints its first 5 steps
  and then every 1000th. A jump may lower trust in a rate measured across it, but it is progress;
* **back to its start**: to 0 or 1 (:data:`RESTART_COUNT`); to where it first stood, once it had moved on from
  there (a log that prints ``step 50/100`` and ``step 100/100`` in each epoch starts again at ``step 50/100``); or
  anywhere once it had reached its total. That is a new epoch, a new evaluation, a new pass;
* **a new total**: another track, so its first reading is progress (a new bar, a new evaluation set).

Two things are not progress:

* **numbers that are rates or measures** (``ms/step: 530``, ``9.8it/s``, ``avg step: 1.23s``, ``loss 0.17``,
  ``lr=1e-4``): the recogniser never reads them as a counter, so a thread that prints its timing while the loop
  hangs shows nothing;
* **a line that only repeats**: the same value again (a bar redrawn at the same count by tqdm's monitor thread
  or rich's refresh thread, a log line printed twice), a value behind the counter's furthest that is not its start
  (another rank's copy of the same line, a step behind), or a counter that has only ever shown the main counter's
  place (below), past its start, in another form (DeepSpeed logs each step twice, as ``step=20, skipped=0`` and as
  ``epoch=0/micro_step=20/global_step=20``): it moves nothing, and the main counter's steps stay one rhythm.

**Where the run is.** Several counters may move at once, so one of them gives the place:

* **The main counter** is the one that ran longest: the seconds between its consecutive forward moves, summed (a
  training bar, over an evaluation bar that runs now and then, a save's ``Writing model shards 1/1``, a data set
  scan). The first counter seen is the main one until another has run longer, or until it is complete (``n ==
  total``: what comes after a finished bar is not nested in it).
* **Any other counter is a phase inside that place**: its beat keeps the main counter's place (``epoch``,
  ``batch``, ``step``), takes that counter's phase when its label names one, and carries its count apart
  (``side_step``, ``side_total``). So a stall during a checkpoint save is placed at the training step, not at step
  1 of the shard writer, and two saves of a run are two places.
* **One unit per run.** A counter of epochs only (Hugging Face's ``{'epoch': 0.625}`` log dict, an ``epoch 3 of
  10`` line) never becomes the main counter: beside one of batches or steps, its new value is progress like any
  other, as a phase inside that counter's place (an epoch fraction is no step); alone, it is the place.

**A bar that shows only a percentage** (``rich.progress.track``: ``━━━ 45%``) is a counter of 100 like any other;
its budget is its own: once a percent has passed, its beats declare a ``timeout`` of :data:`PERCENT_FACTOR` times the
longest percent seen, never under the stall budget (nor over
:data:`~trainbox.supervise.stalls.budgets.MAX_DECLARED_S`); before that, they declare none, so the stall budget
judges (a hang before the first percent, busy or idle, is found in minutes, not in the day a declared budget would
allow). :attr:`Counters.notices` holds the line that says so, once.

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
#: A percentage-only bar's silence budget: this many times the longest time one percent took (a percent is an
#: average of many steps, so its time varies less than a step's; the learned budgets use 3 for steps as well).
PERCENT_FACTOR = 3.0
#: The pattern of a bar that shows only a percentage (:mod:`trainbox.supervise.output.progress`'s rich form).
PERCENT_PATTERN = "rich-percent"
#: Said once per attempt when its output's counter is a percentage only.
PERCENT_NOTICE = (
    "its progress bar shows only a percentage: a silence is judged by the time one percent takes "
    f"({PERCENT_FACTOR:g}x the longest seen, never under the stall budget); until one percent has passed, "
    "by the stall budget"
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
    """What a reading does to its counter (the model: the module docstring)."""

    SAME = "same"  # a line that only repeats (a redraw): no progress
    BEHIND = "behind"  # behind the furthest place, not back to its start (a copy of another rank's line): no progress
    FORWARD = "forward"  # forward by any amount: progress
    AGAIN = "again"  # back to its start, or anywhere after its total (a new epoch, evaluation or pass): progress


def _order(reading: Reading) -> Tuple[Number, Number, Number]:
    return tuple(-1 if value is None else value for value in (reading.epoch, reading.batch, reading.step))  # type: ignore[return-value]


@dataclass
class Track:
    """One counter as it ran: where it started, its furthest reading, when it last moved and how long it ran."""

    key: str
    reading: Reading
    last_at: float
    ran_s: float = 0.0
    #: Its first reading: a reading at or before it, once the counter has moved on, is the counter starting again.
    first: Optional[Reading] = None
    #: Percentage-only bars: the longest seconds one percent took, None before one has passed.
    percent_s: Optional[float] = None
    #: Every reading so far was the main counter's place, past its start, in another form (see :meth:`Counters.take`).
    echo: bool = True

    def __post_init__(self) -> None:
        if self.first is None:
            self.first = self.reading

    def move(self, reading: Reading) -> Move:
        """What ``reading`` does to this counter (see the module docstring)."""
        new, old = _order(reading), _order(self.reading)
        if new == old:
            return Move.SAME
        if new > old:
            return Move.FORWARD
        return Move.AGAIN if self._starts_again(reading) else Move.BEHIND

    def _starts_again(self, reading: Reading) -> bool:
        """Whether a reading behind this counter's place is the counter starting again: back to 0 or 1 or to where it
        first stood (once it had moved on from there), or back from its total."""
        count, first = reading.count, self.first
        if self.reading.complete or (count is not None and count <= RESTART_COUNT):
            return True
        return first is not None and _order(self.reading) > _order(first) and _order(reading) <= _order(first)

    def take(self, reading: Reading, move: Move, now: float, consecutive: bool) -> None:
        """``reading`` moved this counter at ``now``; ``consecutive``: this counter made the last progress too."""
        if consecutive and move is Move.FORWARD:
            self.ran_s += max(0.0, now - self.last_at)
            step = _step(self.reading, reading)
            if reading.pattern == PERCENT_PATTERN and step:
                per_percent = max(0.0, now - self.last_at) / step
                self.percent_s = max(self.percent_s or 0.0, per_percent)
        self.reading, self.last_at = reading, now


def _step(before: Reading, after: Reading) -> Optional[int]:
    """How far ``after``'s count is past ``before``'s, in the same epoch; None when they are not comparable."""
    if after.count is None or before.count is None or after.epoch != before.epoch:
        return None
    return after.count - before.count


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
            if move in (Move.SAME, Move.BEHIND):
                return None
            track.take(reading, move, now, consecutive=self._last == track.key)
            self.tracks.move_to_end(track.key)
        if self._echoes(track):
            return None
        self._choose(track)
        self._last = track.key
        return self._beat(track)

    def _echoes(self, track: Track) -> bool:
        """Whether ``track`` only repeats the main counter: it has shown nothing but the main counter's place, past its
        start (DeepSpeed logs each step twice: ``step=20, skipped=0`` and ``epoch=0/micro_step=20/global_step=20``)."""
        main, reading = self.main, track.reading
        if main is None or main is track or not track.echo:
            return False
        epochs = {reading.epoch, main.reading.epoch} - {None}  # one form may name the epoch, the other not
        count = reading.count
        track.echo = count is not None and count > RESTART_COUNT and count == main.reading.count and len(epochs) <= 1
        return track.echo

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
        """A percentage-only bar's budget once a percent has passed; None before, and for any other counter."""
        if track.reading.pattern != PERCENT_PATTERN or track.percent_s is None:
            return None
        return min(MAX_DECLARED_S, max(self.floor_s, round(PERCENT_FACTOR * track.percent_s, 3)))
