"""Fail-slow: a run that still beats but has become much slower than its own pace.

A stall is a run that stops; a fail-slow is a run that goes on at a fraction of
its speed (a GPU throttling when hot, memory leaking into swap, another program
taking the CPU that feeds the DataLoader). Alibaba's Falcon/Greyhound (USENIX
ATC'25, arXiv 2410.12588) found them in 16 of 27 large jobs, lasting from tens of
seconds to hours. :class:`PaceDetector` finds them in the beats the supervisor
already reads, with no extra instrumentation.

What it is fed: ``observe(ts, phase, rung, position, counter)`` for each beat
that made progress, where ``position`` is the beat's step count (``step``),
``ts`` the beat's own time and ``counter`` the output counter that moved (a
command's bar, read from its output: None for a beat). It returns a ``slow`` or
``recovered`` event, or None.

The rule:

1. **Only steady stepping counts.** Phases that are not (set-up, worker start,
   compiles, validation, checkpoint saves: :func:`measured_phase`) are skipped,
   and so is the interval that spans a phase change. After each (re)start the
   first :data:`RESTART_WARMUP_S` seconds and :data:`RESTART_WARMUP_STEPS` steps
   are skipped, after each entry into a phase the first :data:`PHASE_WARMUP_S`
   and :data:`PHASE_WARMUP_STEPS`. A silence the supervisor judged a stall
   (:meth:`PaceDetector.stalled`) is skipped too. Each counter is measured on
   its own: a new bar (another total or label: an evaluation bar without a label
   beside the training bar without one) starts a segment of its own and is never
   pooled with the training pace, and a counter that starts again is a new
   segment.
2. **Blocks.** Consecutive intervals are pooled into blocks of at least
   :data:`BLOCK_S` seconds and :data:`BLOCK_STEPS` steps; a block's value is the
   log of its mean step time (seconds / steps). Pooling averages out per-step
   jitter and the beat's write throttle (one write per second at most).
3. **Baseline per (phase, rung, counter).** The median of the last :data:`BASELINE_BLOCKS`
   steady blocks of this run in that phase on that rung (a rung, or profile,
   changes the loader and batch settings and with them the pace), and their
   spread: the larger of the standard deviation and 1.4826 x the median absolute
   deviation (the MAD alone underrates heavy-tailed jitter, and the spread only
   ever makes a flag harder to reach). Detection
   starts once :data:`MIN_BASELINE_BLOCKS` are in. Blocks under suspicion are
   held back and join the baseline only when the suspicion clears, so a
   slowdown never teaches the baseline that it is normal.
4. **Change point: CUSUM** (E. S. Page, "Continuous inspection schemes",
   Biometrika 41, 1954). On each block's deviation ``x`` from the baseline,
   ``S = max(0, S + x - k)`` with ``k = log(slow_ratio) / 2``, half the smallest
   shift that matters (the classic choice for a known minimum shift); each ``x``
   is clipped to :data:`X_CLIP`, so one long hiccup cannot carry the statistic.
   The blocks since ``S`` was last 0 are the suspects (Page's change-time
   estimate, Basseville & Nikiforov, "Detection of Abrupt Changes", 1993,
   sec. 2.2); an alarm needs ``S >= H_SIGMAS x sigma``. Among the suspects the
   change time is then estimated by maximum likelihood for a shift of unknown
   size (Hinkley, "Inference about the change-point in a sequence of random
   variables", Biometrika 57, 1970), so a noisy block that began the run of
   ``S > 0`` before the change is not taken for its start. CUSUM rather than
   Bayesian online change-point detection (Adams & MacKay 2007, Falcon's
   choice): it costs O(1) per block, its two parameters follow from
   ``slow_ratio`` and the baseline's spread, and Falcon needed a mean-shift
   confirmation after BOCD anyway.
5. **Confirmation** (Falcon confirms BOCD's change with a >= 10 % mean shift;
   NVIDIA's straggler detection flags a 30 % drop). The blocks since the change,
   at least :data:`MIN_SLOW_S` seconds and :data:`MIN_SLOW_BLOCKS` blocks of
   them, must be at least ``log(slow_ratio)`` slower than the baseline by both
   their *median* deviation (most of that time ran that slow, not one long
   hiccup) and their pooled mean step time (steadier than a median of a few
   blocks), and by :data:`Z_CONFIRM` standard errors (which binds only for slow
   runs, whose blocks hold few steps, and young baselines). Then the ``slow``
   event, whose ``since_ts`` and ``rate`` are those of the blocks since the change.
6. **Recovery, with hysteresis.** While slow, the last :data:`MIN_SLOW_S`
   seconds of blocks (at least :data:`MIN_SLOW_BLOCKS`) must be within
   ``RECOVER_SHARE x log(slow_ratio)`` of the baseline (1.14x its step time at
   the default) by both measures: then ``recovered``. A run that moves to another
   rung ends its episode too (``reason: rung``): its pace there is learned afresh.

The convention of ``slow_ratio`` (``--slow-ratio``): how many times as long as
the baseline a step takes. 1.3 (default) flags steps that take 30 % longer, i.e.
a step rate at or below 1/1.3 = 0.77 of this run's own pace. It is a step-time
ratio because slowdowns are said that way ("2x slower": steps take twice as
long) and because it bounds the per-step spread of a loaded machine (+-30 %)
that must never be flagged. The events' ``ratio`` is the other way round, the
share of the pace that is left (0.41 = 0.41x of this run's pace), as ``status``
shows it; :meth:`PaceDetector.slow_ratio_now` is in ``slow_ratio``'s unit.

Measured in simulation (beats as heartbeat.py writes them, one per second at
most, polled every second; +-30 % per-step jitter, uniform and log-normal; the
slowdown 5 minutes into the run, 50 seeds): a 3x slowdown is flagged after
32-34 s (median; 41 s at most) at 1 and 10 steps/s, 2x after 30-33 s (40 s at
most), 1.5x after 30-34 s (57 s at most); recovery is seen 30-33 s after the
pace returns (39 s at most). No false flag in 560 simulated hours of steady runs at 0.2 to 10
steps/s, jitter up to log-normal sigma 0.35 and bursts of +-20 % load included.

Measured with real supervised processes (``bench/slow.py``: 20 runs at once on a shared 2-core machine, load
average 10): 1.5x, 2x and 3x slowdowns flagged 32-43 s after they began at 1 and 10 steps/s, the ``slow`` event
written with its explanation; no false flag in 40 minutes of steady runs with +-30 % jitter.

Limits: a slowdown that creeps in more slowly than the baseline window moves
(:data:`BASELINE_BLOCKS`) is learned as the pace, and one that is there from
the start is the pace; slow runs (under one step per :data:`BLOCK_S` /
:data:`BLOCK_STEPS`) are judged on longer blocks and wait for :data:`Z_CONFIRM`
(at 0.2 steps/s a 3x slowdown took 2.5-3.5 minutes, and a 1.5x one on a
5-minute-old baseline with log-normal jitter was found within 10 minutes in 8
of 20 runs); a phase shorter than its warm-up is never measured; a rung's
first :data:`MIN_BASELINE_BLOCKS` blocks only teach.

Pure and standard library only: it reads no clock, only the ``ts`` it is given.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from trainbox.supervise.settings import DEFAULT_SLOW_RATIO

#: A block pools at least this many seconds of steps: five of the heartbeat's one-second writes, enough to average
#: out per-step jitter at 1 step/s and short enough that a 3x slowdown is confirmed within a minute.
BLOCK_S = 5.0
#: ... and at least this many steps: a slow run's block (one step per 10 s) still averages a few steps.
BLOCK_STEPS = 3
#: Skipped after each (re)start: data loader workers start and fill their prefetch queues, cuDNN/MIOpen pick and
#: compile kernels for each new shape (MIOpen compiles on first use: ROCm/MIOpen #1709), caches are cold.
RESTART_WARMUP_S = 30.0
RESTART_WARMUP_STEPS = 20
#: Skipped after each entry into a phase (a new epoch's loader refills its queue after validation or a save).
PHASE_WARMUP_S = 5.0
PHASE_WARMUP_STEPS = 3
#: Steady blocks in a baseline: 30 minutes at BLOCK_S, long enough to span epochs, recent enough to follow a pace
#: that legitimately drifts (a page cache warming up over the first epoch).
BASELINE_BLOCKS = 360
#: Blocks needed before a baseline is trusted: a minute of steady beats at BLOCK_S, enough for a median and a MAD.
MIN_BASELINE_BLOCKS = 12
#: Normal-consistent scale of the median absolute deviation (1 / Phi^-1(3/4)).
MAD_SIGMA = 1.4826
#: The least spread assumed for a block, in log units (5 %): at 10 steps/s a block averages 50 steps and its
#: spread can be tiny; a machine's slower seconds (a cron job, a page-cache flush) must not look like a change.
SIGMA_FLOOR = 0.05
#: The CUSUM alarm threshold, in baseline sigmas (4 to 5 is the usual range; 5: rare alarms on noise, which the
#: confirmation would reject anyway).
H_SIGMAS = 5.0
#: The most one block moves the CUSUM statistic, in log units (a block 4x slower): a single long hiccup (a GC
#: pause, an unreported save) must not carry the statistic; a sustained change accumulates over blocks.
X_CLIP = math.log(4.0)
#: A slowdown is confirmed only after it has lasted this long: Falcon's shortest fail-slows last tens of seconds,
#: and 30 s keeps a 3x slowdown's detection within a minute at 1 step/s.
MIN_SLOW_S = 30.0
#: ... over at least this many blocks, so that a median of them means "most of the time".
MIN_SLOW_BLOCKS = 4
#: ... and standing this many standard errors above the baseline (:meth:`Baseline.error`). A slow run's blocks hold
#: only a few steps each, and a young baseline's median is itself uncertain: then heavy-tailed jitter reaches
#: log(1.3) now and then. Simulated with log-normal jitter of sigma 0.35 per step (heavier than the +-30 % that
#: must pass) at 0.2, 0.5 and 1 step/s, 10 x 2 h each: 8 false flags without this bound, 2 at 5, none at 6. At
#: 1 step/s and faster with +-30 % jitter it binds rarely and costs a few seconds at most.
Z_CONFIRM = 6.0
#: The variance of a sample median over that of a mean, for normal data (pi / 2): the baseline center's uncertainty.
MEDIAN_VARIANCE = math.pi / 2
#: Recovered when the recent median is back within this share of log(slow_ratio) of the baseline (hysteresis:
#: 1.14x at the default 1.3x, so a run hovering at the threshold does not flap).
RECOVER_SHARE = 0.5
#: Blocks under suspicion kept for the confirmation (an hour at BLOCK_S): a suspicion that lasts longer is judged
#: on its last hour.
MAX_PENDING_BLOCKS = 720
#: Recent blocks kept for the recovery and the gauge: enough for MIN_SLOW_S of the shortest blocks.
RECENT_BLOCKS = MIN_SLOW_BLOCKS + int(MIN_SLOW_S / BLOCK_S)

#: Phases that are not steady stepping, by the first letters of any word in the phase's name: trainbox's own
#: ``setup``, ``workers`` and ``startup``, warm-ups and compiles, validation (``val``, ``eval``, ``test``), and
#: checkpoint saves (``save``, ``checkpoint``, ``ckpt``).
UNMEASURED_WORDS = ("setup", "start", "worker", "warm", "compil", "val", "eval", "test", "save", "checkpoint", "ckpt")
_WORD = re.compile(r"[a-z]+")

#: Beats are untrusted: a time beyond this (unix seconds: the year 33658) or a step count beyond what a float
#: holds exactly is garbage, not a beat (and would overflow the arithmetic).
MAX_TS = 1e12
MAX_POSITION = 2**53

#: (phase, rung, counter): what one baseline measures.
Key = Tuple[str, str, str]


def measured_phase(phase: Optional[str]) -> bool:
    """Whether a beat's phase is steady stepping (None, a beat without a phase, is)."""
    words = _WORD.findall(str(phase or "").lower())
    return not any(word.startswith(UNMEASURED_WORDS) for word in words)


def check_slow_ratio(value: float) -> float:
    """``value`` when it is a usable ``slow_ratio`` (finite, > 1), else ValueError."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 1.0):
        raise ValueError(f"slow_ratio must be a finite number > 1, got {value!r}")
    return float(value)


@dataclass
class Block:
    """Steps pooled over at least BLOCK_S seconds: from ``start_ts`` to ``end_ts``, ``steps`` steps in ``seconds``."""

    start_ts: float
    end_ts: float = 0.0
    steps: int = 0
    seconds: float = 0.0

    @property
    def full(self) -> bool:
        return self.seconds >= BLOCK_S and self.steps >= BLOCK_STEPS

    @property
    def log_step(self) -> float:
        return math.log(self.seconds / self.steps)


def _usable(ts: object, position: object) -> bool:
    """A beat's time and step as the detector needs them: numbers within MAX_TS and MAX_POSITION."""
    time_ok = isinstance(ts, (int, float)) and not isinstance(ts, bool) and abs(ts) <= MAX_TS
    return time_ok and isinstance(position, int) and not isinstance(position, bool) and 0 <= position <= MAX_POSITION


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def _deviation(values: Sequence[float]) -> float:
    """The standard deviation, in floats (statistics.pstdev computes in exact fractions: 10x slower here)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _trailing(blocks: Sequence[Tuple[Block, float]], seconds: float, count: int) -> List[Tuple[Block, float]]:
    """The newest blocks that together last at least ``seconds`` and number ``count``; [] if there are too few."""
    taken: List[Tuple[Block, float]] = []
    total = 0.0
    for item in reversed(blocks):
        taken.append(item)
        total += item[0].seconds
        if total >= seconds and len(taken) >= count:
            return taken
    return []


def _rate(blocks: Sequence[Tuple[Block, float]]) -> float:
    """Steps per second over ``blocks``."""
    return sum(b.steps for b, _ in blocks) / sum(b.seconds for b, _ in blocks)


def _since_change(blocks: Sequence[Tuple[Block, float]]) -> List[Tuple[Block, float]]:
    """The blocks after the most likely change among ``blocks``: for a mean shift of unknown size from a known
    baseline, the split whose suffix maximises (sum of deviations)^2 / count, positive sums only (Hinkley 1970)."""
    best, total, split = -math.inf, 0.0, len(blocks) - 1
    for index in range(len(blocks) - 1, -1, -1):
        total += blocks[index][1]
        score = total * total / (len(blocks) - index) if total > 0 else -math.inf
        if score > best:
            best, split = score, index
    return list(blocks)[split:]


def _shifts(window: Sequence[Tuple[Block, float]], baseline: Baseline) -> Tuple[float, float]:
    """How far ``window`` is from the baseline, in log step time: its blocks' median, and its pooled mean.

    Both must agree: the median alone ignores one long hiccup but is noisy over a few blocks; the pooled mean
    (all steps over all seconds) is steadier but moved by a hiccup.
    """
    return _median([x for _, x in window]), -math.log(_rate(window)) - baseline.center


@dataclass
class Baseline:
    """One (phase, rung, counter)'s steady blocks: their median log step time and robust spread."""

    values: Deque[float] = field(default_factory=lambda: deque(maxlen=BASELINE_BLOCKS))
    center: float = 0.0
    sigma: float = SIGMA_FLOOR

    @property
    def ready(self) -> bool:
        return len(self.values) >= MIN_BASELINE_BLOCKS

    @property
    def rate(self) -> float:
        """The baseline's steps per second."""
        return math.exp(-self.center)

    def error(self, blocks: int) -> float:
        """The standard error of a mean of ``blocks`` blocks' deviations from this baseline's median."""
        return self.sigma * math.sqrt(1.0 / blocks + MEDIAN_VARIANCE / len(self.values))

    def add(self, values: Sequence[float]) -> None:
        self.values.extend(values)
        self.center = _median(self.values)
        robust = MAD_SIGMA * _median([abs(v - self.center) for v in self.values])
        self.sigma = max(robust, _deviation(self.values), SIGMA_FLOOR)


@dataclass
class Segment:
    """The stretch being measured: one (phase, rung, counter), from the last position seen, past its warm-up."""

    key: Key
    ts: float
    position: int
    warm_until_ts: float
    warm_until_position: int
    block: Optional[Block] = None

    def warm(self, ts: float, position: int) -> bool:
        return ts >= self.warm_until_ts and position >= self.warm_until_position


class PaceDetector:
    """Finds a sustained slowdown against this run's own pace (see the module docstring); pure, stateful."""

    def __init__(self, slow_ratio: float = DEFAULT_SLOW_RATIO) -> None:
        self.slow_ratio = check_slow_ratio(slow_ratio)
        self.shift = math.log(self.slow_ratio)
        self.baselines: Dict[Key, Baseline] = {}
        self.segment: Optional[Segment] = None
        #: The (phase, rung) measured last: a return to it after validation or a save keeps what was seen.
        self.last_key: Optional[Key] = None
        self.fresh_attempt = True
        # CUSUM: the statistic, and the blocks since it last was 0 (with their deviations).
        self.cusum = 0.0
        self.pending: Deque[Tuple[Block, float]] = deque(maxlen=MAX_PENDING_BLOCKS)
        # The open slow episode: its key, its event, the blocks measured since it was flagged.
        self.slow_key: Optional[Key] = None
        self.slow_event: Optional[Dict[str, Any]] = None
        self.since_flag: Deque[Tuple[Block, float]] = deque(maxlen=RECENT_BLOCKS)
        self.recent: Deque[Tuple[Block, float]] = deque(maxlen=RECENT_BLOCKS)
        self.slow_total_s = 0.0

    # --- what the supervisor calls --------------------------------------------------------------

    def observe(
        self, ts: float, phase: Optional[str], rung: Optional[str], position: int, counter: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        """A progress beat at ``ts`` in ``phase`` on ``rung``, at step ``position``, ``counter`` the output counter
        that moved (None: a beat): a ``slow``/``recovered`` event or None."""
        if not measured_phase(phase) or not _usable(ts, position):
            self.segment = None
            return None
        key = (str(phase or ""), str(rung or ""), str(counter or ""))
        segment = self.segment
        went_back = segment is not None and position < segment.position  # a new attempt nobody told us of
        if segment is None or segment.key != key or went_back:
            self._start_segment(key, ts, position, restart=self.fresh_attempt or went_back)
            return self._leave_rung(ts, key)
        if not segment.warm(ts, position):
            segment.ts, segment.position = ts, position
            return None
        return self._advance(segment, ts, position)

    def retune(self, slow_ratio: float) -> None:
        """Judge from now on with ``slow_ratio`` (a new rung's own ``--slow-ratio``; its pace is learned afresh)."""
        self.slow_ratio = check_slow_ratio(slow_ratio)
        self.shift = math.log(self.slow_ratio)

    def stalled(self) -> None:
        """The silence that is going on was judged a stall: the interval it ends is no measure of the pace."""
        self.segment = None

    def restarted(self) -> None:
        """A new attempt starts: its steps restart, and its warm-up is skipped."""
        self.segment = None
        self.fresh_attempt = True
        self._clear_suspicion()

    # --- what summaries and gauges read ---------------------------------------------------------

    @property
    def current(self) -> Optional[Dict[str, Any]]:
        """The open episode's ``slow`` event (for ``status``), or None while at pace."""
        return dict(self.slow_event) if self.slow_event is not None else None

    @property
    def steady(self) -> bool:
        """At pace: a warmed-up stretch is being measured against a known baseline, and no episode is open."""
        segment = self.segment
        if segment is None or self.slow_event is not None or not segment.warm(segment.ts, segment.position):
            return False
        baseline = self.baselines.get(segment.key)
        return baseline is not None and baseline.ready

    def slow_seconds(self, now: float) -> float:
        """Seconds spent slow so far: closed episodes, and the open one up to ``now``."""
        open_s = max(0.0, now - self.slow_event["since_ts"]) if self.slow_event is not None else 0.0
        return self.slow_total_s + open_s

    def slow_ratio_now(self) -> Optional[float]:
        """The recent step time over the baseline's, in ``slow_ratio``'s unit (1.0 at pace; None until known)."""
        recent = _trailing(self.recent, MIN_SLOW_S, MIN_SLOW_BLOCKS)
        if not recent:
            return None
        return math.exp(_median([x for _, x in recent]))

    # --- inside ---------------------------------------------------------------------------------

    def _start_segment(self, key: Key, ts: float, position: int, restart: bool) -> None:
        warm_s, warm_steps = (RESTART_WARMUP_S, RESTART_WARMUP_STEPS) if restart else (PHASE_WARMUP_S, PHASE_WARMUP_STEPS)
        if key != self.last_key:
            self._clear_suspicion()
            self.recent.clear()
        self.segment = Segment(key, ts, position, ts + warm_s, position + warm_steps)
        self.last_key = key
        self.fresh_attempt = False

    def _advance(self, segment: Segment, ts: float, position: int) -> Optional[Dict[str, Any]]:
        """Pool the interval since the last beat into the open block; judge the block once it is full."""
        steps, seconds = position - segment.position, ts - segment.ts
        if steps == 0:
            return None  # the step in progress goes on: its time counts when it ends
        segment.ts, segment.position = ts, position
        if seconds <= 0:
            return None  # a clock that did not move (or went back) measures nothing
        block = segment.block or Block(start_ts=ts - seconds)
        block.steps += steps
        block.seconds += seconds
        block.end_ts = ts
        segment.block = None if block.full else block
        return self._judge(segment.key, block) if block.full else None

    def _judge(self, key: Key, block: Block) -> Optional[Dict[str, Any]]:
        baseline = self.baselines.setdefault(key, Baseline())
        if not baseline.ready:
            baseline.add([block.log_step])
            return None
        deviation = block.log_step - baseline.center
        self.recent.append((block, deviation))
        if self.slow_event is not None and self.slow_key == key:
            return self._check_recovery(block, deviation, baseline)
        if self.slow_event is not None:
            return None  # slow in another phase of this rung: that phase's blocks decide the recovery
        return self._check_change(key, block, deviation, baseline)

    def _check_change(self, key: Key, block: Block, deviation: float, baseline: Baseline) -> Optional[Dict[str, Any]]:
        """One CUSUM step; the ``slow`` event when it alarms and the blocks since the change confirm it."""
        self.cusum = max(0.0, self.cusum + max(-X_CLIP, min(X_CLIP, deviation)) - self.shift / 2)
        if self.cusum == 0.0:
            baseline.add([x + baseline.center for _, x in self.pending] + [block.log_step])
            self._clear_suspicion()
            return None
        self.pending.append((block, deviation))
        if self.cusum < H_SIGMAS * baseline.sigma:
            return None
        suspects = self.pending  # every block since S was last 0: no choosing among them, which would flatter noise
        if sum(b.seconds for b, _ in suspects) < MIN_SLOW_S or len(suspects) < MIN_SLOW_BLOCKS:
            return None
        if min(_shifts(suspects, baseline)) < max(self.shift, Z_CONFIRM * baseline.error(len(suspects))):
            return None
        return self._flag(key, block, _since_change(suspects), baseline)

    def _flag(self, key: Key, block: Block, changed: List[Tuple[Block, float]], baseline: Baseline) -> Dict[str, Any]:
        """The ``slow`` event: the rate since the change (``changed``: the blocks after it) against the baseline's."""
        rate = _rate(changed)
        self.slow_key = key
        self.slow_event = {
            "event": "slow",
            "ts": block.end_ts,
            "rate": round(rate, 4),
            "baseline_rate": round(baseline.rate, 4),
            "ratio": round(rate / baseline.rate, 3),
            "since_ts": changed[0][0].start_ts,
            "phase": key[0],
        }
        self.since_flag.clear()
        self._clear_suspicion()
        return dict(self.slow_event)

    def _check_recovery(self, block: Block, deviation: float, baseline: Baseline) -> Optional[Dict[str, Any]]:
        self.since_flag.append((block, deviation))
        window = _trailing(self.since_flag, MIN_SLOW_S, MIN_SLOW_BLOCKS)
        if self.slow_event is None or not window or max(_shifts(window, baseline)) > RECOVER_SHARE * self.shift:
            return None
        rate = _rate(window)
        return self._close(self.slow_event, block.end_ts, "pace", rate=round(rate, 4), ratio=round(rate / baseline.rate, 3))

    def _leave_rung(self, ts: float, key: Key) -> Optional[Dict[str, Any]]:
        """A segment began on ``key``: an episode on another rung ends, its pace there no longer applies."""
        if self.slow_event is None or self.slow_key is None or self.slow_key[1] == key[1]:
            return None
        return self._close(self.slow_event, ts, "rung", rate=None, ratio=None)

    def _close(self, slow: Dict[str, Any], ts: float, reason: str, **measured: Any) -> Dict[str, Any]:
        """End the open episode (its ``slow`` event) at ``ts``: the ``recovered`` event."""
        since = slow["since_ts"]
        event = {
            "event": "recovered",
            "ts": ts,
            "reason": reason,
            **measured,
            "baseline_rate": slow["baseline_rate"],
            "slow_since_ts": since,
            "slow_s": round(max(0.0, ts - since), 3),
            "phase": slow["phase"],
        }
        self.slow_total_s += event["slow_s"]
        self.slow_event = self.slow_key = None
        self.since_flag.clear()
        return event

    def _clear_suspicion(self) -> None:
        self.cusum = 0.0
        self.pending.clear()
