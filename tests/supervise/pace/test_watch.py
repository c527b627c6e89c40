"""The pace watch in-process: beats on a scripted clock, the conditions from a stand-in probe, its events read back.

What the real probe reads and what explain() makes of it are tested in tests/diagnose/; the real thing, with real
processes slowed by real faults, is tests/supervise/pace/test_watch_runs.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from trainbox.diagnose.slowness import Conditions
from trainbox.rundir.events import read_events
from trainbox.rundir.layout import RunDir
from trainbox.supervise.pace import watch as pace_watch
from trainbox.supervise.pace.watch import PaceWatch, Positions, SlowRestart
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.settings import SupervisorSettings
from trainbox.system.memcg import MemoryLimit
from trainbox.system.pressure import OutsideProcess, Pressure

MIB = 2**20
AT_PACE = Pressure(5.0, (), 10.0, 100.0, {}, 0.0, 1.0, 300 * MIB, 0.0, 0.0, 40 * MIB, None, None, 5.0)
HOG = OutsideProcess(4121, "python", 97.0, 777)
CONTENDED = dataclasses.replace(AT_PACE, outside=(HOG,), outside_cpu_pct=107.0, tree_wait_pct=60.0)
LEAKED = dataclasses.replace(
    AT_PACE,
    tree_anon_bytes=900 * MIB,
    memory_limit=MemoryLimit("/g", 1020 * MIB, 1024 * MIB, 5000),
    limit_hits_per_s=400.0,
)
LAUNCH = Launch(argv=["train.py"], startup_timeout=60.0, stall_timeout=60.0, profile="fast")


class Probe:
    """Stands in for ConditionsProbe: a reading is done at the next step, with ``conditions(wall)`` of its start."""

    def __init__(self, conditions: Callable[[float], Pressure]) -> None:
        self.conditions = conditions
        self.reading: Optional[Tuple[float, bool]] = None
        self.readings: List[Tuple[float, bool]] = []

    @property
    def busy(self) -> bool:
        return self.reading is not None

    def begin(self, tree: Sequence[int], root: Optional[int], main_pid: Optional[int], loader: bool, wall: float) -> None:
        assert tree == [1, 2] and root == 1 and main_pid == 1
        self.reading = (wall, loader)
        self.readings.append(self.reading)

    def cancel(self) -> None:
        self.reading = None

    def step(self, tree: Sequence[int], root: Optional[int]) -> Optional[Tuple[float, Conditions]]:
        assert self.reading is not None
        wall, loader = self.reading
        self.reading = None
        return wall, Conditions(self.conditions(wall), loader_wait=0.05 if loader else None)


class Watched:
    """A PaceWatch fed one beat a second (as heartbeat.py writes them) from ``rate(ts)`` steps per second."""

    def __init__(self, tmp_path: Path, conditions: Callable[[float], Pressure], **settings: Any) -> None:
        (tmp_path / "run").mkdir()
        self.record = Record(RunDir(tmp_path / "run"))
        self.probe = Probe(conditions)
        self.watch = PaceWatch(self.record, SupervisorSettings(**settings), self.probe)  # type: ignore[arg-type]
        self.ts, self.step, self.attempt = 1_000_000.0, 0, 0
        self.restarts: List[SlowRestart] = []
        self.watch.begin(0, LAUNCH, self.ts)

    def run(self, seconds: float, rate: Callable[[float], float], checkpoints: bool = False, **extra: Any) -> None:
        """``checkpoints``: the child answers a checkpoint request at its next beat (trainbox.heartbeat.checkpointed)."""
        carry = 0.0
        for _ in range(int(seconds)):
            self.ts += 1.0
            carry += rate(self.ts)
            self.step += int(carry)
            carry -= int(carry)
            if checkpoints and self.record.run_dir.checkpoint_request.exists():
                extra["checkpoint_ts"] = self.ts
            self.watch.observe({"ts": self.ts, "phase": "train", "step": self.step, "pid": 1, **extra}, self.ts)
            restart = self.watch.poll([1, 2], 1, self.ts)
            if restart is not None:
                self.restarts.append(restart)
                self.restart()

    def restart(self) -> None:
        self.watch.finish(self.ts)
        self.attempt += 1
        self.step = 0
        self.ts += 2.0
        self.watch.begin(self.attempt, LAUNCH, self.ts)

    def events(self, kind: Optional[str] = None) -> List[Dict[str, Any]]:
        return [e for e in read_events(self.record.run_dir.events) if kind is None or e["event"] == kind]


def steady(rate: float) -> Callable[[float], float]:
    return lambda ts: rate


def slower_from(at: float, rate: float, factor: float, until: float = float("inf")) -> Callable[[float], float]:
    return lambda ts: rate / factor if at <= ts < until else rate


START = 1_000_000.0


def test_at_pace_nothing_is_said_and_the_conditions_are_read_every_minute(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: AT_PACE)
    run.run(600, steady(5.0))
    assert run.events() == []
    starts = [wall - START for wall, _ in run.probe.readings]
    assert starts and starts[0] < 120  # once the baseline is known (30 s warm-up, a minute of blocks)
    assert all(b - a >= pace_watch.BASELINE_EVERY_S for a, b in zip(starts, starts[1:]))
    assert [loader for _, loader in run.probe.readings][:6] == [True, False, False, False, False, True]
    assert run.watch.summary(run.ts) == {"slow_s": 0.0, "slow_episodes": 0}


def test_a_slowdown_is_flagged_explained_against_the_pace_before_it_and_recovers(tmp_path: Path) -> None:
    """Busy from 300 s to 500 s: the readings from then show the hog; the baseline compared with is from before."""
    run = Watched(tmp_path, lambda wall: CONTENDED if START + 300 <= wall < START + 500 else AT_PACE)
    run.run(800, slower_from(START + 300, 5.0, 3.0, until=START + 500))
    slow, recovered = run.events("slow"), run.events("recovered")
    assert len(slow) == 1 and len(recovered) == 1
    event = slow[0]
    assert event["suspect"] == "contention" and not event["inside"] and event["action"] == "report"
    assert event["evidence"][0] == "pid 4121 (python) outside the run: 97 % CPU (baseline 0 %)"
    assert START + 290 <= event["since_ts"] <= START + 310
    assert event["detected_ts"] - START - 300 < 60 and event["ratio"] == pytest.approx(1 / 3, abs=0.05)
    assert event["rung"] == "fast" and event["phase"] == "train" and event["attempt"] == 0
    assert recovered[0]["reason"] == "pace" and recovered[0]["recovered_ts"] - START - 500 < 60
    assert run.watch.summary(run.ts)["slow_episodes"] == 1 and run.watch.summary(run.ts)["slow_s"] >= 200
    assert run.restarts == []


def test_the_baseline_compared_with_ended_a_block_before_the_change_was_estimated(tmp_path: Path) -> None:
    """since_ts is the first block found slow: a reading that ended in the block before may have seen the change
    begin (in the real-process tests, busy processes that started during its 5 s hid themselves as the baseline)."""
    watch = PaceWatch(Record(RunDir(tmp_path)), SupervisorSettings(), probe=Probe(lambda wall: AT_PACE))
    early, overlapping = Conditions(AT_PACE, loader_wait=0.1), Conditions(CONTENDED, loader_wait=0.5)
    watch.baselines.extend([(START + 235.0, START + 240.0, early), (START + 292.0, START + 297.0, overlapping)])
    assert watch._baseline(START + 300.0) == early
    assert watch._baseline(START + 302.0) == overlapping
    assert watch._baseline(START + 100.0) == early, "none old enough: the oldest kept"


def test_on_slow_restart_restarts_a_leak_once_it_lasted_long_enough_and_sees_it_cured(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: LEAKED if wall >= START + 300 and run.attempt == 0 else AT_PACE,
                  on_slow="restart", slow_restart_after_s=120.0)  # fmt: skip
    run.run(700, lambda ts: 5.0 / 3 if run.attempt == 0 and ts >= START + 300 else 5.0, checkpoints=True)
    (slow,) = run.events("slow")
    assert slow["suspect"] == "memory" and slow["inside"] and slow["action"] == "restart"
    (restart,) = run.restarts
    assert restart.suspect == "memory" and restart.slow_s >= 120
    assert restart.checkpoint_s is not None and restart.checkpoint_s <= 2.0  # asked, and written at the next beat
    assert not run.record.run_dir.checkpoint_request.exists(), "the next attempt starts without a request"
    assert run.events("recovered")[0]["attempt"] == 1  # the restarted attempt is back at the pace
    assert len(run.events("slow")) == 1


def test_a_child_that_does_not_checkpoint_on_request_is_restarted_after_the_wait(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: LEAKED if wall >= START + 300 and run.attempt == 0 else AT_PACE,
                  on_slow="restart", slow_restart_after_s=60.0)  # fmt: skip
    run.run(600, lambda ts: 5.0 / 3 if run.attempt == 0 and ts >= START + 300 else 5.0)
    (restart,) = run.restarts
    assert restart.checkpoint_s is None and restart.slow_s >= 60
    (flagged,) = run.events("slow")
    restarted = next(e for e in run.events() if e["event"] == "recovered")["slow_since_ts"]
    assert restarted == flagged["since_ts"]


@pytest.mark.parametrize("conditions", [CONTENDED, dataclasses.replace(AT_PACE, tree_cpu_pct=5.0)])
def test_on_slow_restart_never_restarts_for_what_a_restart_does_not_cure(tmp_path: Path, conditions: Pressure) -> None:
    run = Watched(tmp_path, lambda wall: conditions if wall >= START + 300 else AT_PACE,
                  on_slow="restart", slow_restart_after_s=30.0)  # fmt: skip
    run.run(700, slower_from(START + 300, 5.0, 3.0))
    assert run.restarts == [] and run.events("slow")[0]["action"] == "report"


def test_a_suspect_that_moved_outside_the_run_is_not_restarted(tmp_path: Path) -> None:
    """Inside when flagged, contention when the restart came due: the confirmation reads again and holds off."""
    run = Watched(tmp_path, lambda wall: CONTENDED if wall >= START + 400 else LEAKED if wall >= START + 300 else AT_PACE,
                  on_slow="restart", slow_restart_after_s=150.0)  # fmt: skip
    run.run(700, slower_from(START + 300, 5.0, 3.0))
    assert run.events("slow")[0]["suspect"] == "memory" and run.restarts == []


def test_only_the_lowest_rank_is_followed(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: AT_PACE)
    run.run(200, steady(5.0), rank=0)
    for n in range(100):  # rank 1 at a third of the pace: not the one followed
        run.watch.observe({"ts": run.ts + n, "phase": "train", "step": n, "rank": 1, "pid": 1}, run.ts + n)
    run.run(200, steady(5.0), rank=0)
    assert run.events() == []


def test_a_count_is_made_from_epochs_and_batches() -> None:
    positions = Positions()
    records = [{"epoch": 1, "batch": 3}, {"epoch": 1, "batch": 9}, {"epoch": 2, "batch": 2}, {"epoch": 2, "batch": 7}]
    assert [positions.of(r) for r in records] == [3, 9, 11, 16]
    assert positions.of({"step": 40, "epoch": 9, "batch": 1}) == 40
    assert positions.of({"phase": "setup"}) is None and positions.of({"batch": True}) is None


def test_a_slowdown_flagged_as_the_attempt_ends_is_recorded_as_unexplained(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: AT_PACE)
    run.run(300, steady(5.0))
    run.watch.episode = pace_watch.Episode({"ratio": 0.5, "since_ts": run.ts - 40, "ts": run.ts, "phase": "train"}, 0)
    run.watch.finish(run.ts)
    (slow,) = run.events("slow")
    assert slow["suspect"] == "unknown" and slow["evidence"] == ["the attempt ended before its conditions were read"]


def test_untrusted_records_are_ignored(tmp_path: Path) -> None:
    run = Watched(tmp_path, lambda wall: AT_PACE)
    for record in ({"ts": "soon", "step": 5}, {"step": -3}, {"step": 2**60, "ts": 1e300}, {"rank": "x", "step": 1}, {}):
        run.watch.observe(record, run.ts)
        assert run.watch.poll([1, 2], 1, run.ts) is None
    run.run(300, steady(5.0))
    assert run.events() == []
