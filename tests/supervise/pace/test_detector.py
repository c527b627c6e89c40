"""The fail-slow detector on scripted step streams: jitter is never a slowdown, slowdowns are found in time.

Each stream is simulated step by step with seeded jitter (uniform +-30 %, or log-normal with a one-sigma spread
of 30 %) and written as :mod:`trainbox.heartbeat` writes beats: at most one write per second, carrying the step
count. The detector sees only those beats, as the supervisor does.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.supervise.pace import detector as pace
from trainbox.supervise.pace.detector import PaceDetector, check_slow_ratio, measured_phase

T0 = 1_700_000_000.0
#: heartbeat.py's default write interval (TRAIN_HEARTBEAT_INTERVAL).
BEAT_S = 1.0

Jitter = Callable[[random.Random], float]
JITTERS: Dict[str, Jitter] = {
    "uniform": lambda rng: rng.uniform(0.7, 1.3),
    "lognormal": lambda rng: math.exp(rng.gauss(0.0, math.log(1.3))),
}
Beat = Tuple[float, int]


def beats(
    rate: float,
    seconds: float,
    seed: int,
    jitter: str = "uniform",
    start: float = T0,
    position: int = 0,
    slow: Optional[Tuple[float, float, float]] = None,
) -> List[Beat]:
    """The beats of ``seconds`` of stepping at ``rate`` steps/s; ``slow``: (from, to, factor) in seconds from start."""
    rng, draw = random.Random(seed), JITTERS[jitter]
    now, last_write, written = start, -math.inf, []
    while now < start + seconds:
        factor = slow[2] if slow and slow[0] <= now - start < slow[1] else 1.0
        now += factor / rate * draw(rng)
        position += 1
        if now - last_write >= BEAT_S:
            last_write = now
            written.append((now, position))
    return written


def feed(
    detector: PaceDetector, stream: List[Beat], phase: str = "train", rung: str = "fast", counter: Optional[str] = None
) -> List[Dict[str, Any]]:
    events = [detector.observe(ts, phase, rung, position, counter) for ts, position in stream]
    return [event for event in events if event is not None]


def kinds(events: List[Dict[str, Any]]) -> List[str]:
    return [event["event"] for event in events]


@pytest.mark.parametrize("jitter", sorted(JITTERS))
@pytest.mark.parametrize("rate", [1.0, 10.0])
def test_steady_jitter_is_never_slow(rate: float, jitter: str) -> None:
    """Three seeded hours per case of +-30 % per-step jitter: no event at all, and the gauge stays near 1."""
    for seed in range(3):
        detector = PaceDetector()
        assert feed(detector, beats(rate, 3600.0, seed, jitter)) == []
        assert detector.slow_seconds(T0 + 3600.0) == 0.0
        assert 0.8 < (detector.slow_ratio_now() or 0.0) < 1.25


#: (factor, the goal in seconds): the issue's goals for 3x and 2x; 1.5x is above the default 1.3 and must be
#: found too, within three minutes.
GOALS = [(3.0, 60.0), (2.0, 120.0), (1.5, 180.0)]


@pytest.mark.parametrize("jitter", sorted(JITTERS))
@pytest.mark.parametrize("rate", [1.0, 10.0])
@pytest.mark.parametrize(("factor", "goal_s"), GOALS)
def test_a_slowdown_is_found_within_the_goal(factor: float, goal_s: float, rate: float, jitter: str) -> None:
    change_s = 300.0
    for seed in range(3):
        detector = PaceDetector()
        events = feed(detector, beats(rate, change_s + goal_s, seed, jitter, slow=(change_s, math.inf, factor)))
        assert kinds(events) == ["slow"], f"seed {seed}"
        slow = events[0]
        assert slow["ts"] - (T0 + change_s) <= goal_s
        assert abs(slow["since_ts"] - (T0 + change_s)) <= 2 * pace.BLOCK_S + 1 / rate * factor * 1.3
        # Measured from the change on: a few blocks, the first of which may hold a step or two from before it.
        assert slow["ratio"] <= 1 / pace.DEFAULT_SLOW_RATIO and slow["ratio"] == pytest.approx(1 / factor, rel=0.3)
        assert slow["baseline_rate"] == pytest.approx(rate, rel=0.1)
        assert slow["rate"] == pytest.approx(slow["ratio"] * slow["baseline_rate"], rel=0.01)
        assert slow["phase"] == "train"
        assert detector.current == slow
        assert detector.slow_ratio_now() == pytest.approx(factor, rel=0.25)


def test_a_slowdown_below_the_ratio_is_not_flagged() -> None:
    """With --slow-ratio 2, a 1.5x slowdown is ordinary; a 3x one is not."""
    for factor, expected in [(1.5, []), (3.0, ["slow"])]:
        detector = PaceDetector(slow_ratio=2.0)
        assert kinds(feed(detector, beats(1.0, 900.0, 7, slow=(300.0, math.inf, factor)))) == expected


def test_recovery_ends_the_episode_and_counts_its_time() -> None:
    detector = PaceDetector()
    events = feed(detector, beats(10.0, 1200.0, 3, slow=(300.0, 600.0, 3.0)))
    assert kinds(events) == ["slow", "recovered"]
    slow, recovered = events
    assert recovered["reason"] == "pace"
    assert recovered["ratio"] == pytest.approx(1.0, abs=0.15)
    assert 0 < recovered["ts"] - (T0 + 600.0) <= 60.0
    assert recovered["slow_since_ts"] == slow["since_ts"]
    assert recovered["slow_s"] == pytest.approx(recovered["ts"] - slow["since_ts"], abs=0.01)
    assert detector.current is None
    assert detector.slow_seconds(T0 + 5000.0) == pytest.approx(recovered["slow_s"])


def test_slow_seconds_count_the_open_episode_to_now() -> None:
    detector = PaceDetector()
    (slow,) = feed(detector, beats(1.0, 500.0, 4, slow=(300.0, math.inf, 3.0)))
    assert detector.slow_seconds(slow["since_ts"] + 100.0) == pytest.approx(100.0)


def test_restart_warm_up_is_not_measured() -> None:
    """An attempt's first 25 s run 4x slower (workers starting, kernels compiling): not its pace, and no flag."""
    detector = PaceDetector()
    stream = beats(1.0, 900.0, 5, slow=(0.0, 25.0, 4.0))
    assert feed(detector, stream) == []
    assert detector.baselines[("train", "fast", "")].rate == pytest.approx(1.0, rel=0.1)


def test_each_restart_warms_up_again() -> None:
    """After restarted(), steps start again from a checkpoint (lower) and slowly: not a slowdown."""
    detector = PaceDetector()
    first = beats(1.0, 600.0, 6)
    assert feed(detector, first) == []
    detector.restarted()
    second = beats(1.0, 600.0, 7, start=first[-1][0] + 20.0, position=100, slow=(0.0, 25.0, 4.0))
    assert feed(detector, second) == []


def test_validation_and_saves_are_not_measured() -> None:
    """Epochs of 2 minutes of train, then a validation and a save that advance slowly: never a slowdown."""
    detector = PaceDetector()
    now, position, events = T0, 0, []
    for epoch in range(10):
        train = beats(1.0, 120.0, epoch, start=now, position=position)
        events += feed(detector, train)
        now, position = train[-1]
        for phase in ("val", "save"):
            slow_phase = beats(0.1, 60.0, 100 + epoch, start=now, position=position)
            events += feed(detector, slow_phase, phase=phase)
            now, position = slow_phase[-1]
    assert events == []
    assert set(detector.baselines) == {("train", "fast", "")}


def evaluation_after_training(train_counter: Optional[str], eval_counter: Optional[str]) -> List[Dict[str, Any]]:
    """Two bars with no label (Hugging Face Trainer's): 5 minutes of training at 5 steps/s, then 3 minutes of an
    evaluation bar, counted from 0, at a third of that."""
    detector = PaceDetector()
    train = beats(5.0, 300.0, 1)
    events = feed(detector, train, phase="", counter=train_counter)
    evaluation = beats(5.0 / 3, 180.0, 2, start=train[-1][0])
    return events + feed(detector, evaluation, phase="", counter=eval_counter)


def test_an_evaluation_bar_without_a_label_is_not_pooled_with_the_training_bar() -> None:
    assert evaluation_after_training("tqdm::1500", "tqdm::300") == []
    assert kinds(evaluation_after_training(None, None)) == ["slow"], "as one counter, the evaluation reads as slow"


def test_a_slowdown_across_validations_is_still_found() -> None:
    """Suspicion is kept while the run validates: a 3x slowdown spread over short epochs is found."""
    detector = PaceDetector()
    now, position, events = T0, 0, []
    for epoch in range(12):
        factor = 3.0 if epoch >= 6 else 1.0
        train = beats(1.0, 40.0 * factor, epoch, start=now, position=position, slow=(0.0, math.inf, factor))
        events += feed(detector, train)
        now, position = train[-1]
        events += feed(detector, [(now + 20.0, position)], phase="val")
        now += 20.0
    assert kinds(events) == ["slow"]


def test_a_stall_is_not_a_slowdown() -> None:
    """A 10-minute silence judged a stall, then the same pace: no event."""
    detector = PaceDetector()
    first = beats(1.0, 600.0, 8)
    feed(detector, first)
    detector.stalled()
    assert feed(detector, beats(1.0, 300.0, 9, start=first[-1][0] + 600.0, position=first[-1][1])) == []


def test_one_long_hiccup_is_not_a_slowdown() -> None:
    """A 60-second pause nobody reported (a GC, an unannounced save) among steady steps: no event."""
    detector = PaceDetector()
    first = beats(1.0, 600.0, 10)
    second = beats(1.0, 600.0, 11, start=first[-1][0] + 60.0, position=first[-1][1])
    assert feed(detector, first + second) == []


def test_a_new_rung_ends_the_episode_and_learns_its_own_pace() -> None:
    detector = PaceDetector()
    first = beats(1.0, 500.0, 12, slow=(300.0, math.inf, 3.0))
    assert kinds(feed(detector, first)) == ["slow"]
    detector.restarted()
    second = beats(0.5, 600.0, 13, start=first[-1][0] + 10.0)
    events = feed(detector, second, rung="safe")
    assert kinds(events) == ["recovered"]
    assert events[0]["reason"] == "rung" and events[0]["rate"] is None
    assert detector.baselines[("train", "safe", "")].rate == pytest.approx(0.5, rel=0.1)


def test_the_same_rung_after_a_restart_recovers_against_its_baseline() -> None:
    detector = PaceDetector()
    first = beats(1.0, 500.0, 14, slow=(300.0, math.inf, 3.0))
    assert kinds(feed(detector, first)) == ["slow"]
    detector.restarted()
    events = feed(detector, beats(1.0, 300.0, 15, start=first[-1][0] + 10.0, position=200))
    assert kinds(events) == ["recovered"] and events[0]["reason"] == "pace"


def test_nothing_is_judged_before_a_baseline() -> None:
    assert PaceDetector().slow_ratio_now() is None
    detector = PaceDetector()
    # Slow from the start: the slow pace is all this run has shown, so it is its pace.
    assert feed(detector, beats(1.0, 300.0, 16, slow=(0.0, math.inf, 3.0))) == []


@pytest.mark.parametrize(
    ("phase", "measured"),
    [("train", True), (None, True), ("finetune", True), ("interval", True), ("val", False), ("validation", False),
     ("eval_step", False), ("save", False), ("checkpoint", False), ("setup", False), ("workers", False),
     ("compile", False), ("startup", False), ("Warmup", False)],
)  # fmt: skip
def test_measured_phases(phase: Optional[str], measured: bool) -> None:
    assert measured_phase(phase) is measured


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), float("inf"), -2.0])
def test_a_slow_ratio_must_be_finite_and_above_one(value: float) -> None:
    with pytest.raises(ValueError, match="slow_ratio"):
        check_slow_ratio(value)
    assert check_slow_ratio(1.3) == 1.3


#: A detector that has learned its pace and is in a slow episode, for the fuzz to start from.
_SLOW = PaceDetector()
feed(_SLOW, beats(1.0, 500.0, 17, slow=(300.0, math.inf, 3.0)))


@settings(max_examples=200, deadline=None)
@given(
    st.booleans(),
    st.lists(
        st.tuples(
            st.one_of(st.floats(), st.integers(), st.sampled_from([1e12, -1e12, 10**400]), st.none(), st.text()),
            st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["train", "val"])),
            st.one_of(st.none(), st.text(max_size=6)),
            st.one_of(st.integers(), st.sampled_from([0, 1, 2**53, 10**400]), st.floats(), st.booleans(), st.text()),
            st.sampled_from(["observe", "stalled", "restarted"]),
        ),
        max_size=60,
    ),
)
def test_any_beat_values_never_raise(from_slow: bool, calls: List[Tuple[Any, Any, Any, Any, str]]) -> None:
    """Beats are untrusted: whatever their fields hold, the detector answers (fresh, or in a slow episode)."""
    detector = copy.deepcopy(_SLOW) if from_slow else PaceDetector()
    assert (detector.current is not None) is from_slow
    for ts, phase, rung, position, call in calls:
        if call == "observe":
            event = detector.observe(ts, phase, rung, position)
            assert event is None or event["event"] in ("slow", "recovered")
        else:
            getattr(detector, call)()
    detector.slow_ratio_now()
    assert detector.slow_seconds(T0) >= 0.0
