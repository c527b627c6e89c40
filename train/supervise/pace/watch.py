"""Fail-slow, watched: a run that keeps beating but has become much slower than its own pace, found and explained.

The :class:`~trainbox.supervise.monitor.Monitor` only calls a :class:`PaceWatch`: :meth:`~PaceWatch.begin` as an
attempt starts, :meth:`~PaceWatch.observe` for each progress record, :meth:`~PaceWatch.stalled` when a silence is
judged a stall, :meth:`~PaceWatch.poll` on every look (which may ask it to restart the attempt) and
:meth:`~PaceWatch.finish` as the attempt ends. The watch is the supervisor's, kept across attempts: a slowdown that
a restart cured is seen to recover in the next attempt.

**Finding it** is :class:`trainbox.supervise.pace.detector.PaceDetector`'s (CUSUM on the log step time per phase and rung,
confirmed by a shift of ``--slow-ratio``). What it is fed is a *progress record*: ``ts``, ``phase`` and a step
count, as ``beat()`` writes them, or as any other source of progress gives them (an uninstrumented command's
output counters): ``step`` when the record has one, else a count made from ``epoch``/``batch``
(:class:`Positions`). ``ts`` is the record's own time (when the child beat, not when the supervisor looked),
the current time where a record has none. Under torchrun only the lowest rank of the node is followed: ranks of
a job step together, and one rank's pace is the job's. The rung is the launch's profile (a new rung changes the
loader and batch settings, so its pace is learned afresh; so is the ``--slow-ratio`` its profile may set).

**Explaining it.** While the run is at its pace (:attr:`PaceDetector.steady`) the watch reads the run's conditions
every :data:`BASELINE_EVERY_S` (:class:`trainbox.diagnose.conditions.ConditionsProbe`; the training process's
stacks, for the loader share, every :data:`LOADER_EVERY_S`) and keeps the last :data:`KEPT_BASELINES`. When the
detector flags a slowdown, it reads now's conditions (5 s) and explains the change against the newest baseline
read before the slowdown began (``since_ts``: a reading taken during the slowdown's first seconds, before it
was confirmed, would show nothing changed): :func:`trainbox.diagnose.slowness.explain`. Then the ``slow`` event,
with its ``suspect`` and ``evidence``; ``recovered`` when the pace is back.

**Acting on it**, only with ``--on-slow restart``: an attempt that has been slow for ``--slow-restart-after``
seconds (counted within this attempt) is restarted when its suspect lies inside the run (``memory`` the run grew
itself, ``loader``). Before acting the conditions are read and explained again, so a slowdown whose cause moved
outside the run meanwhile is left alone. Never for contention or heat: a restart does not cure those. First the
watch asks for a checkpoint (``RUN_DIR/checkpoint.request``, which :func:`trainbox.heartbeat.checkpoint_requested`
reads in the child: trainbox's Ultralytics trainer writes its mid-epoch checkpoint at its next optimizer step) and
waits up to :data:`CHECKPOINT_WAIT_S` for the beat that says it was written (``checkpoint_ts``); a child that does
not know the request resumes from its last checkpoint of its own (the mid-epoch one is at most
``midepoch_checkpoint_s`` old, 300 s by default).

Cost, measured by ``bench/slow.py`` on the 2-core development machine: a reading takes 10 ms of CPU, 88 ms with its
five py-spy samples; at pace that is 26 ms of CPU a minute (0.04 % of a core). Feeding the detector a record costs
microseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Mapping, Optional, Sequence, Tuple

from trainbox.atomic import write_text_atomic
from trainbox.diagnose.conditions import ConditionsProbe
from trainbox.diagnose.slowness import Conditions, Explanation, explain
from trainbox.errors import say
from trainbox.supervise.pace import detector
from trainbox.supervise.pace.detector import PaceDetector
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.settings import SupervisorSettings

#: Seconds between two readings of the conditions while at pace: the baseline a slowdown is compared with is at
#: most this old when it begins (plus the 5 s of the reading). Each reading costs two /proc snapshots and a GPU query.
BASELINE_EVERY_S = 60.0
#: Seconds between two stack samplings of the training process at pace (py-spy briefly pauses the process it dumps).
LOADER_EVERY_S = 300.0
#: A baseline reading must have ended this long before a slowdown's ``since_ts`` to be compared with: since_ts is the
#: start of the first block the detector found slow, so the change itself may lie anywhere in the block before it. A
#: reading that overlapped the change (in the real-process tests, busy processes that started during its 5 s) shows
#: part of the cause as the baseline and hides it.
SINCE_MARGIN_S = detector.BLOCK_S
#: Baseline readings kept: ten minutes of them, so one from before a slowdown's start is at hand when it is flagged.
KEPT_BASELINES = 10
#: How long a checkpoint asked for before a restart may take: the child's next step at its slow pace (a 1 s step at a
#: tenth of it) and the save itself (yolov8n's mid-epoch checkpoint: 0.2 s; a large model's, tens of seconds).
CHECKPOINT_WAIT_S = 120.0
#: An attempt that follows a restart for slowness, while the slowdown is still open, is counted slow only from its
#: warm-up plus two windows in which the detector would have seen the pace return (a cured run recovers then).
RECOVERY_GRACE_S = detector.RESTART_WARMUP_S + 2 * detector.MIN_SLOW_S


class Positions:
    """A step count from progress records: their ``step``, or one made from ``epoch`` and ``batch``."""

    def __init__(self) -> None:
        self.epoch: Any = None
        self.batch = 0
        self.count = 0

    def of(self, record: Mapping[str, Any]) -> Optional[int]:
        step = record.get("step")
        if _whole(step):
            return step
        epoch, batch = record.get("epoch"), record.get("batch")
        if not _whole(batch):
            return None
        if epoch != self.epoch:
            self.count += batch  # a new epoch: its batches so far
        elif batch > self.batch:
            self.count += batch - self.batch
        self.epoch, self.batch = epoch, batch
        return self.count


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def clock_time(ts: float) -> str:
    """``14:02``: when a slowdown began, as the console and the events' readers say it."""
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M")


@dataclass(frozen=True)
class SlowRestart:
    """What the monitor ends the attempt for: the suspect, its evidence, and how long it was slow."""

    suspect: str
    evidence: Tuple[str, ...]
    slow_s: float
    #: Seconds the child took to write the checkpoint asked for, None when it wrote none within CHECKPOINT_WAIT_S.
    checkpoint_s: Optional[float] = None


@dataclass
class Episode:
    """The open slowdown: the detector's ``slow`` event, the attempt it was flagged in, and its explanation."""

    event: Dict[str, Any]
    attempt: int
    explanation: Optional[Explanation] = None


#: What a reading under way is for.
BASELINE, EXPLAIN, CONFIRM = "baseline", "explain", "confirm"


class PaceWatch:
    """Finds, explains and (when asked) acts on a run that became slow; see the module docstring."""

    def __init__(self, record: Record, settings: SupervisorSettings, probe: Optional[ConditionsProbe] = None) -> None:
        self.record = record
        self.settings = settings
        self.probe = probe or ConditionsProbe()
        self.detector: Optional[PaceDetector] = None
        self.launch: Optional[Launch] = None
        self.attempt = 0
        self.began_wall = 0.0
        self.positions = Positions()
        self.lowest_rank: Optional[int] = None
        self.main_pid: Optional[int] = None
        #: Readings while at pace: (began, unix s; ended; Conditions), oldest first.
        self.baselines: Deque[Tuple[float, float, Conditions]] = deque(maxlen=KEPT_BASELINES)
        self.last_reading = -float("inf")
        self.last_loader = -float("inf")
        self.episode: Optional[Episode] = None
        self.episodes = 0
        #: What the probe's reading under way is for (BASELINE, EXPLAIN, CONFIRM), None when it reads nothing.
        self.reading: Optional[str] = None
        #: The restart waiting for its checkpoint: (asked at, unix s; the restart; when the checkpoint came).
        self.asked: Optional[Tuple[float, SlowRestart, Optional[float]]] = None

    # -- what the monitor calls ---------------------------------------------------------------------------------
    def begin(self, number: int, launch: Launch, wall: float) -> None:
        """Attempt ``number`` starts with ``launch``: its first steps are warm-up, and its ranks are new."""
        if self.detector is None:
            self.detector = PaceDetector(launch.slow_ratio)
        elif launch.slow_ratio != self.detector.slow_ratio:
            self.detector.retune(launch.slow_ratio)
        self.detector.restarted()
        self._cancel()
        self.asked = None
        with contextlib.suppress(OSError):  # best-effort: a child only answers a request newer than its own start
            self.record.run_dir.checkpoint_request.unlink(missing_ok=True)
        self.launch, self.attempt, self.began_wall = launch, number, wall
        self.positions, self.lowest_rank = Positions(), None

    def observe(self, record: Mapping[str, Any], wall: float) -> None:
        """One progress record (a beat that made progress, or an output counter that moved)."""
        if self.detector is None or self.launch is None or not self._followed(record):
            return
        saved = record.get("checkpoint_ts")
        if self.asked is not None and isinstance(saved, (int, float)) and saved >= self.asked[0]:
            self.asked = (self.asked[0], self.asked[1], float(saved))
        position = self.positions.of(record)
        if position is None:
            return
        pid, ts = record.get("pid"), record.get("ts")
        self.main_pid = pid if _whole(pid) else self.main_pid
        when = ts if isinstance(ts, (int, float)) and not isinstance(ts, bool) else wall
        counter = record.get("counter")  # an output counter's (a bar): each is measured on its own
        event = self.detector.observe(
            when, record.get("phase"), self.launch.profile, position, counter if isinstance(counter, str) else None
        )
        if event is not None and event.pop("event") == "slow":
            self.episode = Episode(event, self.attempt)
            self.episodes += 1
            self._cancel()  # a baseline reading under way may have begun in the slowdown: the next poll explains
        elif event is not None:
            self._recovered(event)

    def stalled(self) -> None:
        """The silence going on was judged a stall: it is no measure of the pace."""
        if self.detector is not None:
            self.detector.stalled()

    def poll(self, tree: Sequence[int], root: Optional[int], wall: float) -> Optional[SlowRestart]:
        """Read the conditions a step further; a SlowRestart when ``--on-slow restart`` ends the attempt now."""
        if self.asked is not None:
            return self._checkpointed(wall)
        if self.reading is not None:
            done = self.probe.step(tree, root)
            if done is None:
                return None
            kind, self.reading = self.reading, None
            return self._read(kind, done[0], wall, done[1])
        kind = self._next_reading(wall)
        if kind is not None:
            loader = kind != BASELINE or wall - self.last_loader >= LOADER_EVERY_S
            if kind == BASELINE:
                self.last_reading, self.last_loader = wall, wall if loader else self.last_loader
            self.reading = kind
            self.probe.begin(tree, root, self.main_pid, loader=loader, wall=wall)
        return None

    def finish(self, wall: float) -> None:
        """The attempt ended: a slowdown flagged but not yet explained is recorded with what is known."""
        episode = self.episode
        self._cancel()
        if episode is not None and episode.explanation is None:
            self._flagged(episode, Explanation("unknown", ("the attempt ended before its conditions were read",), False))

    def summary(self, wall: float) -> Dict[str, Any]:
        """For the ``exit`` and ``give_up`` events and the final line: seconds spent slow, and in how many episodes."""
        slow_s = self.detector.slow_seconds(wall) if self.detector is not None else 0.0
        return {"slow_s": round(slow_s, 1), "slow_episodes": self.episodes}

    # -- inside -------------------------------------------------------------------------------------------------
    def _followed(self, record: Mapping[str, Any]) -> bool:
        """Under torchrun the node's lowest rank alone; without it, every record."""
        rank = record.get("rank")
        if _whole(rank):
            self.lowest_rank = rank if self.lowest_rank is None else min(self.lowest_rank, rank)
            return rank == self.lowest_rank
        return self.lowest_rank is None

    def _cancel(self) -> None:
        self.probe.cancel()
        self.reading = None

    def _next_reading(self, wall: float) -> Optional[str]:
        """The reading to begin now, if any: a flagged slowdown's explanation first."""
        if self.episode is not None and self.episode.explanation is None:
            return EXPLAIN
        if self._restart_due(wall):
            return CONFIRM
        if self.detector is not None and self.detector.steady and wall - self.last_reading >= BASELINE_EVERY_S:
            return BASELINE
        return None

    def _read(self, kind: str, began: float, wall: float, conditions: Conditions) -> Optional[SlowRestart]:
        """A reading came in: a baseline, a slowdown's explanation, or the confirmation before a restart."""
        episode = self.episode
        if kind == BASELINE or episode is None:
            self.baselines.append((began, wall, conditions))
            return None
        explanation = explain(self._baseline(float(episode.event["since_ts"])), conditions)
        if kind == EXPLAIN:
            self._flagged(episode, explanation)
            return None
        if not explanation.inside:
            say(f"attempt {self.attempt} stays slow, not restarted: its suspect is now {explanation.suspect} "
                f"({explanation.evidence[0]}), outside the run")  # fmt: skip
            episode.explanation = explanation
            return None
        self._ask_checkpoint(
            SlowRestart(explanation.suspect, explanation.evidence, round(wall - float(episode.event["since_ts"]), 1)), wall
        )
        return None

    def _ask_checkpoint(self, restart: SlowRestart, wall: float) -> None:
        """Ask the child for a checkpoint before the restart (a request it may not know: then it is not waited for long)."""
        self.asked = (wall, restart, None)
        try:
            write_text_atomic(self.record.run_dir.checkpoint_request, json.dumps({"ts": wall, "suspect": restart.suspect}))
        except OSError:
            self.asked = (wall, restart, wall)  # no request written (a full disk): nothing to wait for
        say(f"attempt {self.attempt}: asking for a checkpoint before the restart (up to {CHECKPOINT_WAIT_S:g} s)")

    def _checkpointed(self, wall: float) -> Optional[SlowRestart]:
        """The restart, once its checkpoint was written or CHECKPOINT_WAIT_S has passed."""
        assert self.asked is not None
        asked, restart, saved = self.asked
        if saved is None and wall - asked < CHECKPOINT_WAIT_S:
            return None
        self.asked = None
        return dataclasses.replace(restart, checkpoint_s=round(max(0.0, saved - asked), 1) if saved is not None else None)

    def _baseline(self, since_ts: float) -> Conditions:
        """The newest baseline read SINCE_MARGIN_S before ``since_ts`` (the oldest kept, if none), with the newest
        loader share read by then; empty Conditions when none was read."""
        by = since_ts - SINCE_MARGIN_S
        before = [entry for entry in self.baselines if entry[1] <= by] or list(self.baselines)[:1]
        if not before:
            return Conditions()
        shares = [c.loader_wait for _, ended, c in self.baselines if ended <= by and c.loader_wait is not None]
        chosen = before[-1][2]
        return dataclasses.replace(chosen, loader_wait=shares[-1] if shares else chosen.loader_wait)

    def _flagged(self, episode: Episode, explanation: Explanation) -> None:
        episode.explanation = explanation
        restart = self.settings.on_slow == "restart" and explanation.inside
        fields = dict(episode.event, suspect=explanation.suspect, evidence=list(explanation.evidence))
        fields.update(detected_ts=fields.pop("ts"), rung=self.launch.profile if self.launch else None)
        self.record.emit("slow", self.attempt, **fields, inside=explanation.inside, action="restart" if restart else "report")
        since = clock_time(float(episode.event["since_ts"]))
        say(
            f"attempt {self.attempt} is slow: {episode.event['ratio']:.2f}x of this run's pace since {since} "
            f"(suspect: {explanation.suspect}; {explanation.evidence[0]})"
            + (f"; --on-slow restart restarts it after {self.settings.slow_restart_after_s:g} s slow" if restart else "")
        )

    def _recovered(self, event: Dict[str, Any]) -> None:
        self.finish(float(event["ts"]))
        self.episode = None
        event["recovered_ts"] = event.pop("ts")
        self.record.emit("recovered", self.attempt, **event)
        back = f" ({event['ratio']:.2f}x of its pace)" if event.get("ratio") is not None else f" ({event['reason']})"
        say(f"attempt {self.attempt} is back at its pace{back} after {event['slow_s']:.0f} s slow")

    def _restart_due(self, wall: float) -> bool:
        """``--on-slow restart``, a suspect inside the run, slow long enough in this attempt (see RECOVERY_GRACE_S)."""
        episode = self.episode
        if self.settings.on_slow != "restart" or episode is None or episode.explanation is None:
            return False
        own = episode.attempt == self.attempt
        slow_since = float(episode.event["since_ts"]) if own else self.began_wall + RECOVERY_GRACE_S
        return episode.explanation.inside and wall - slow_since >= self.settings.slow_restart_after_s
