"""The work a restarted attempt did again: where the attempt before it got to, minus where this one began.

Why it exists. A restart costs the silence, the kill, the start-up, and the work done again, and the last is the one
a person cannot see: a resume from a checkpoint 50 steps back trains those 50 again, and a restart from nothing
trains everything again. The report, ``status`` and the run's total say it, so it must be true.

Where the attempt before got to (``reached``) is its last beat. Where this one began is read from the first places
of the same counter in this attempt (the ``counter`` a beat names; :mod:`trainbox.supervise.output.starts` keeps
the first two, as printed), by what that counter's numbers mean:

* **a bar** (tqdm, rich, Keras, Ultralytics: :data:`BARS`) shows the work done; drawn at 0 before any, its next
  reading is the first work (a Trainer resumed at step 50 draws ``0/200`` and then ``51/200``); it began one unit
  before its first reading past 0;
* **a log line** (``step 12``, ``iter 12:``) or a training beat is printed after the work it counts (nanoGPT's
  ``iter 0`` after its first iteration): it began one unit before its first line; a beat of another phase (a
  ``setup`` beat saying where it resumes) is a place before any work: it began there;
* **pytorch/examples' lines** (``Train Epoch: 2 [640/60000]``, :data:`SAMPLES_BEFORE`) count the samples *before*
  the batch just done: it began at its first line, and a batch is the step between two lines.

The count is in steps when both beats have a step, else in batches (across epochs too when the epoch's batches are
known), else in epochs; a restart from nothing counts everything done before it, since its counters begin at
the start. None when the two cannot be compared (no beat, another counter, a stride not yet seen). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

#: Patterns of bars, drawn before the work they count (a count of 0: nothing done yet).
BARS = frozenset({"ultralytics", "tqdm", "rich", "rich-percent", "keras"})
#: pytorch/examples' log lines: the samples before the batch just done.
SAMPLES_BEFORE = frozenset({"pytorch-examples"})
#: Phases whose beat or line comes after a unit of work (None: the output did not name one).
TRAINING = ("train", None)
#: The units work done again is counted in.
UNITS = ("step", "batch", "epoch")


@dataclass(frozen=True)
class Redone:
    """Work done again: ``count`` of ``unit`` (``step``, ``batch``, ``epoch``), from ``began`` (a place) to ``reached``."""

    count: int
    unit: str
    began: Mapping[str, Any]

    def words(self) -> str:
        """``5 steps``, ``1 batch``."""
        return amount(self.count, self.unit)


def amount(count: int, unit: str) -> str:
    """``5 steps``, ``1 batch``, ``2 epochs``: a count of work in its unit."""
    return f"{count} {unit}" + ("" if count == 1 else "es" if unit == "batch" else "s")


def _whole(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 2**53:
        return None
    return int(value)


def _key(beat: Mapping[str, Any]) -> Optional[str]:
    return "step" if _whole(beat.get("step")) is not None else "batch" if _whole(beat.get("batch")) is not None else None


def counter_of(reached: Optional[Mapping[str, Any]], counters: Sequence[str]) -> Optional[str]:
    """Which of this attempt's ``counters`` (their tracks, first read first) gave ``reached`` its place: its
    ``counter`` when that counter is the place's own; else (a beat of a counter inside the place, an evaluation bar's
    or a log dict's, keeps the main counter's place) the first one of the place's pattern and total. None: none
    is (a heartbeat's beats have no counter)."""
    pattern = (reached or {}).get("pattern")
    if not reached or not isinstance(pattern, str):
        return None
    named = reached.get("counter")
    if named in counters and str(named).startswith(f"{pattern}:") and "side_step" not in reached:
        return named  # type: ignore[return-value]
    total = next((reached[key] for key in ("steps", "batches") if _whole(reached.get(key)) is not None), "?")
    return next((key for key in counters if key.startswith(f"{pattern}:") and key.endswith(f":{total}")), None)


def began(starts: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """Where an attempt began on a counter, from its first places ``starts`` (one or two beats, as read): a beat with
    ``epoch``, the count (``step`` or ``batch``, as work done) and ``stride`` (one unit in that count); None while
    it cannot be told yet (a bar at 0 alone, a pytorch/examples line alone)."""
    if not starts:
        return None
    first, key = starts[0], _key(starts[0])
    if key is None:
        return None
    second = starts[1] if len(starts) > 1 and _key(starts[1]) == key else None
    pattern, count = first.get("pattern"), _whole(first[key])
    if pattern in SAMPLES_BEFORE:
        if second is None or second.get("epoch") != first.get("epoch"):
            return None
        stride = _whole(second[key]) - count  # type: ignore[operator]
        return dict(first, **{key: count, "stride": stride}) if stride > 0 else None
    if pattern in BARS and count == 0:
        if second is None:
            return None
        first, count = second, _whole(second[key])
    elif first.get("phase") not in TRAINING:
        return dict(first, **{key: count, "stride": 1})  # a place before work (a setup beat saying where it resumes)
    return dict(first, **{key: count - 1, "stride": 1})  # type: ignore[operator]


def _done(beat: Mapping[str, Any], key: str, stride: int, samples: bool) -> int:
    """Units of ``key`` done at ``beat`` (a samples-before line has done one batch more than it says)."""
    count = _whole(beat.get(key)) or 0
    return count // stride + 1 if samples else count // stride


def measure(reached: Optional[Mapping[str, Any]], starts: Sequence[Mapping[str, Any]]) -> Optional[Redone]:
    """The work done again by an attempt whose counter started as ``starts`` after one that got to ``reached``
    (the caller gives the starts of the counter that gave ``reached`` its place: :func:`counter_of`)."""
    if not reached or not starts:
        return None
    key = _key(reached)
    if key is None:  # a counter of epochs only
        return _epochs((_whole(reached.get("epoch")), _whole(starts[0].get("epoch"))), starts[0])
    start = began(starts)
    if start is None or _key(start) != key:
        return None
    stride, samples = start["stride"], start.get("pattern") in SAMPLES_BEFORE
    before, after = _done(reached, key, stride, samples), _whole(start[key]) // stride  # type: ignore[operator]
    epochs = (_whole(reached.get("epoch")), _whole(start.get("epoch")))
    if key == "batch" and epochs[0] != epochs[1]:
        per_epoch = _whole(reached.get("batches"))
        if None in epochs or per_epoch is None:
            return _epochs(epochs, start)
        before += epochs[0] * (per_epoch // stride)  # type: ignore[operator]
        after += epochs[1] * (per_epoch // stride)  # type: ignore[operator]
    return Redone(max(0, before - after), key, start)


def _epochs(epochs: Sequence[Optional[int]], start: Mapping[str, Any]) -> Optional[Redone]:
    if None in epochs:
        return None
    return Redone(max(0, epochs[0] - epochs[1]), "epoch", start)  # type: ignore[operator]
