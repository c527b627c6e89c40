"""The bar of a run that does not beat: its count, total, rate and ETA, as the bar itself shows them.

A program that never heard of trainbox shows its progress in its output, and the supervisor publishes the counter it
read there (``state.json``'s ``heartbeat``: a ``step`` of ``steps``, or a ``batch`` of ``batches`` within an
``epoch`` of ``epochs``); ``progress.jsonl`` samples it every few seconds. Without this module ``status`` showed
``?/?``, "img/s unknown" and "ETA unknown" for a bar that tqdm itself showed as ``30/60 [00:15<00:15, 2.00it/s]``.

* The **rate** is the counter's advance over the newest samples of the same bar (same attempt, same epoch for a
  batch counter) within :data:`RATE_WINDOW_S`, the counter the supervisor published last being the newest sample
  (so a bar that moves has a rate before ``progress.jsonl`` holds two samples of it): tqdm's rate is a smoothed
  recent one too, and a window keeps a restart's or an evaluation's pause long ago out of it. It is measured up to
  *now*: a bar that stopped moving slows down with every second of its silence, so the ETA of a hung run grows
  instead of standing still at its last value.
* The **ETA** is what is left of the bar at that rate, plus, when the epochs are known (the bar's label,
  ``Epoch 3/10``, counted from 1; or Ultralytics' ``args.yaml``), the epochs after this one, each as long as this
  one's bar: the run's ETA. Without the epochs it is the bar's alone, and :meth:`Bar.eta_words` says which.

Pure functions of the beat and the samples (typed already: :mod:`trainbox.rundir.records`), tested in
milliseconds; the rate is per second of wall time, the counter's own unit ("it", as tqdm says).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

#: The samples the rate is taken over: the last minute, about 12 samples (progress.jsonl samples every 5 s).
RATE_WINDOW_S = 60.0
#: A counter unmoved this long is said to be silent beside its ETA: state.json's counter is a second or two old on a
#: healthy run, and a sample comes every 5 s.
SILENT_S = 15.0


@dataclass(frozen=True)
class Bar:
    """A counter as a bar: where it is, out of how many, how fast, and the epochs around it when known."""

    unit: str  # "step" or "batch"
    count: int
    total: Optional[int]
    rate: Optional[float]  # counts per second, None before two samples of it
    epoch: Optional[int] = None
    epochs: Optional[int] = None
    #: Seconds since the counter last moved (the published counter's age), when known.
    silent_s: Optional[float] = None

    @property
    def whole_run(self) -> bool:
        """Whether the ETA is the run's: the epochs around this bar are known."""
        return self.unit == "step" or bool(self.epochs and self.epoch)

    def eta_s(self) -> Optional[float]:
        """Seconds until the bar ends (and the epochs after it, when known); None without a total or a rate."""
        if not self.total or not self.rate:
            return None
        left = max(0, self.total - self.count)
        later = self.epochs - self.epoch if self.epochs and self.epoch and self.unit == "batch" else 0
        return (left + max(0, later) * self.total) / self.rate

    def position(self) -> str:
        """``step 30/60``, ``epoch 2/5, batch 30/60``, ``batch 30/60`` (no epoch shown); a total the output did not show
        is left out."""
        of = f"/{self.total}" if self.total else ""
        if self.unit == "step":
            return f"step {self.count}{of}"
        if self.epoch is None:
            return f"batch {self.count}{of}"
        epochs = f"/{self.epochs}" if self.epochs else ""
        return f"epoch {self.epoch}{epochs}, batch {self.count}{of}"

    def eta_words(self) -> str:
        """What :meth:`eta_s` is: ``the run's`` or ``this bar's`` (the epochs unknown), and the silence it has grown by."""
        whose = "the run's" if self.whole_run else "this bar's; the run's epochs are not known"
        silent = self.silent_s or 0.0
        grown = f", growing: no progress for {silent:.0f} s" if self.rate and silent >= SILENT_S else ""
        return whose + grown

    def speed(self) -> str:
        """``2.00 it/s`` or ``4.50 s/it`` as tqdm writes a rate; ``rate unknown`` before it is measured."""
        if not self.rate:
            return "rate unknown"
        return f"{self.rate:.2f} it/s" if self.rate >= 1 else f"{1 / self.rate:.2f} s/it"


def _count(record: Mapping[str, Any], unit: str) -> Optional[int]:
    value = record.get(unit)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unit(beat: Mapping[str, Any]) -> Optional[str]:
    """``step`` when the beat counts steps, ``batch`` when it counts batches (of an epoch), else None."""
    if _count(beat, "step") is not None and "batch" not in beat:
        return "step"
    return "batch" if _count(beat, "batch") is not None else None


def _same_bar(sample: Mapping[str, Any], newest: Mapping[str, Any], unit: str) -> bool:
    if sample.get("attempt") != newest.get("attempt") or _count(sample, unit) is None:
        return False
    return unit == "step" or sample.get("epoch") == newest.get("epoch")


def rate(samples: Sequence[Mapping[str, Any]], unit: str, now: Optional[float] = None) -> Optional[float]:
    """The counter's advance per second over the newest samples of one bar, up to ``now`` when given (see the module
    docstring); None."""
    bar = [s for s in samples if isinstance(s.get("ts"), (int, float)) and _count(s, unit) is not None]
    if not bar:
        return None
    newest = oldest = bar[-1]
    taken = 1
    for sample in reversed(bar[:-1]):
        if not _same_bar(sample, newest, unit) or newest["ts"] - sample["ts"] > RATE_WINDOW_S:
            break
        if (_count(sample, unit) or 0) > (_count(oldest, unit) or 0):
            break  # the counter went back: an earlier pass of the bar
        oldest, taken = sample, taken + 1
    if taken < 2:
        return None
    seconds = max(newest["ts"], now if now is not None else newest["ts"]) - oldest["ts"]
    advanced = (_count(newest, unit) or 0) - (_count(oldest, unit) or 0)
    return advanced / seconds if seconds > 0 and advanced > 0 else None


def bar_of(
    beat: Mapping[str, Any],
    samples: Sequence[Mapping[str, Any]],
    now: Optional[float] = None,
    attempt: Any = None,
    epochs: Optional[int] = None,
) -> Optional[Bar]:
    """The bar of ``beat`` (the counter the supervisor published in ``attempt``), its rate from ``samples`` and itself
    up to ``now``; ``epochs`` when the bar's label does not give them; None without a counter."""
    unit = _unit(beat)
    if unit is None:
        return None
    total = _count(beat, "steps" if unit == "step" else "batches")
    epoch, epochs = _count(beat, "epoch"), _count(beat, "epochs") or epochs
    ts = beat.get("ts")
    timed = isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts)
    newer = timed and not any(isinstance(s.get("ts"), (int, float)) and s["ts"] >= ts for s in samples[-1:])
    measured = [*samples, {**beat, "attempt": attempt}] if newer else samples
    silent = max(0.0, now - ts) if timed and now is not None else None
    count = _count(beat, unit) or 0
    # Measured up to now only from a counter whose time is known: unmoved since then, so slower with every second.
    measured_rate = rate(measured, unit, now if timed else None)
    return Bar(unit, count, total if total else None, measured_rate, epoch, epochs, silent)


def _reading(sample: Mapping[str, Any]) -> Optional[Tuple[str, Any, int]]:
    """(unit, epoch, count) of a sample: its step, else its batch within its epoch; None without a counter."""
    unit = _unit(sample)
    count = _count(sample, unit) if unit is not None else None
    if unit is None or count is None:
        return None
    return unit, sample.get("epoch") if unit == "batch" else None, count


def throughput(samples: Sequence[Mapping[str, Any]]) -> List[Tuple[float, float]]:
    """(ts, counts per second) between consecutive samples of one bar (the report's chart): a step counter, else a
    batch counter within one epoch; a pair across a new epoch, a new bar or a counter that went back is left out."""
    points = []
    for before, after in zip(samples, samples[1:]):
        seen, now = _reading(before), _reading(after)
        if seen is None or now is None or seen[:2] != now[:2] or now[2] < seen[2]:
            continue
        seconds = float(after["ts"]) - float(before["ts"])
        if seconds > 0:
            points.append((float(after["ts"]), (now[2] - seen[2]) / seconds))
    return points
