"""One run directory read into one typed model, for ``status --watch`` and ``trainbox report``.

Everything comes from the run directory alone (named by
:class:`trainbox.rundir.layout.RunDir`), so the view works from another terminal,
against a run in a container, or over ssh: ``events.jsonl`` (attempts, stalls,
restarts, profile changes), ``state.json`` (the phase's silence against its
budget), ``heartbeat.json`` (epoch, batch, img/s), ``progress.jsonl`` (the
beats over time, :mod:`trainbox.rundir.progress`), Ultralytics' ``args.yaml`` and
``results.csv``, the incidents' ``summary.json`` and the mtime of ``last.pt``. The periods the run spent
slower than its own pace come from its ``slow`` and ``recovered`` events (:mod:`trainbox.view.slow`).
The snapshot numbers (ETA, counts) are :mod:`trainbox.view.status`'s.

Every file may be missing, half-written or from an older trainbox: a view is
made of whatever is there, and each reader says "unknown" (``None``) rather
than fail. A stall's ``cause`` and ``evidence`` (written by newer supervisors,
on the event or in the incident's ``summary.json``) are shown when present.

Standard library and PyYAML only: the supervisor imports it in the container.
"""

from __future__ import annotations

import bisect
import csv
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainbox.rundir.events import read_events
from trainbox.rundir.layout import IncidentDir, RunDir
from trainbox.view import slow, status
from trainbox.view.slow import SlowPeriod


@dataclass(frozen=True)
class Attempt:
    """One launch of the child, from its ``start`` event to the next ``start`` or the ``exit``.

    ``index`` counts every attempt of the directory in order; ``number`` is the event's own
    ``attempt``, which starts from 0 again each time the directory is supervised anew.
    """

    index: int
    number: int
    started_ts: float
    ended_ts: Optional[float]
    profile: Optional[str]
    ended_by: str  # "stall", "crash", "exit", "slow" (--on-slow restart) or "running"

    @property
    def label(self) -> str:
        return f"attempt {self.number}" + (f" ({self.profile})" if self.profile else "")


@dataclass(frozen=True)
class Stall:
    """A ``stall`` event, with its incident report's folder resolved under this run directory."""

    attempt: int
    killed_ts: float
    budget: str
    budget_s: float
    silent_s: float
    incident_s: float
    kill_s: float
    phase: Optional[str]
    profile: Optional[str]
    incident: Optional[Path]
    last_beat: Dict[str, Any]
    cause: Optional[str]
    evidence: Optional[str]

    @property
    def last_progress_ts(self) -> float:
        """When the child last made progress before it went silent."""
        return self.killed_ts - self.kill_s - self.incident_s - self.silent_s

    @property
    def detected_ts(self) -> float:
        """When its budget ran out."""
        return self.last_progress_ts + self.silent_s

    @property
    def last_step(self) -> Optional[int]:
        step = self.last_beat.get("step")
        return step if isinstance(step, int) else None


@dataclass(frozen=True)
class Loss:
    """What one stall cost: the batches trained again and the wall time until the run was back where it stopped."""

    steps: Optional[int]
    seconds: float
    regained: bool  # False: the run never got back to the stalled step (it ended, or has not yet)


def _text(value: Any) -> Optional[str]:
    """A cause or evidence as one line (a list gives its first item, a mapping its JSON)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, list):
        value = value[0]
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True, default=str)
    return " ".join(value.split())


def _number(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


@dataclass
class RunView:
    """A run directory at one moment (``now``)."""

    run: RunDir
    snapshot: status.Progress
    now: float

    # -- the run's history, read when first asked for (the live view, once a second, needs neither) -------
    @functools.cached_property
    def samples(self) -> List[Dict[str, Any]]:
        """progress.jsonl (:mod:`trainbox.rundir.progress`)."""
        return [s for s in read_events(self.run.progress) if isinstance(s, dict)]

    @functools.cached_property
    def results(self) -> List[Dict[str, float]]:
        """results.csv, one row per epoch (see :func:`_results`)."""
        return _results(self.run.results)

    # -- what happened --------------------------------------------------------
    @property
    def events(self) -> List[Dict[str, Any]]:
        return self.snapshot.events

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    def count(self, kind: str) -> int:
        """Events of ``kind`` in the whole directory (state.json counts only its own supervisor's)."""
        return len(self.of(kind))

    @functools.cached_property
    def attempts(self) -> List[Attempt]:
        found: List[Attempt] = []
        current: Optional[Dict[str, Any]] = None
        ended_by = "running"
        ended_ts: Optional[float] = None

        def close() -> None:
            if current is not None:
                found.append(
                    Attempt(
                        index=len(found),
                        number=int(current.get("attempt", len(found))),
                        started_ts=_number(current.get("ts")),
                        ended_ts=ended_ts,
                        profile=current.get("profile"),
                        ended_by=ended_by,
                    )
                )

        for event in self.events:
            kind = event.get("event")
            if kind == "start":
                close()
                current, ended_by, ended_ts = event, "running", None
            elif kind in ("stall", "crash", "exit") and current is not None and ended_by == "running":
                ended_by, ended_ts = str(kind), _number(event.get("killed_ts", event.get("ts")))
            elif kind == "restart" and event.get("after") == "slow" and current is not None and ended_by == "running":
                ended_by, ended_ts = "slow", _number(event.get("ts"))  # --on-slow restart ended it
        close()
        return found

    @functools.cached_property
    def stalls(self) -> List[Stall]:
        found = []
        for event in self.of("stall"):
            incident = Path(event["incident"]) if event.get("incident") else None
            # The event names the folder as the supervisor saw it (in a container: /runs/...): find it here by name.
            where = self.run.incident_dir.directory / incident.name if incident else None
            summary = status.json_object(IncidentDir(where).summary) if where else {}
            found.append(
                Stall(
                    attempt=int(event.get("attempt", 0)),
                    killed_ts=_number(event.get("killed_ts", event.get("ts"))),
                    budget=str(event.get("budget", "?")),
                    budget_s=_number(event.get("budget_s")),
                    silent_s=_number(event.get("silent_s")),
                    incident_s=_number(event.get("incident_s")),
                    kill_s=_number(event.get("kill_s")),
                    phase=event.get("phase"),
                    profile=event.get("profile"),
                    incident=where if where and where.is_dir() else None,
                    last_beat=event.get("last_beat") or {},
                    cause=_text(event.get("cause", summary.get("cause"))),
                    evidence=_text(event.get("evidence", summary.get("evidence"))),
                )
            )
        return found

    def samples_by_attempt(self) -> Dict[int, List[Dict[str, Any]]]:
        """The progress samples by the :attr:`Attempt.index` they were taken in (the last start before each)."""
        starts = [a.started_ts for a in self.attempts]
        grouped: Dict[int, List[Dict[str, Any]]] = {}
        for sample in self.samples:
            index = bisect.bisect_right(starts, _number(sample.get("ts"))) - 1
            grouped.setdefault(max(index, 0), []).append(sample)
        return grouped

    def loss(self, stall: Stall) -> Loss:
        """Batches redone and wall time lost to ``stall``, from the progress samples taken after it."""
        later = [s for s in self.samples if _number(s.get("ts")) > stall.killed_ts and isinstance(s.get("step"), int)]
        first = later[0] if later else None
        # A train beat comes after its batch: that attempt resumed one step before it (setup beats say where it starts).
        resumed = None if first is None else first["step"] - (1 if first.get("phase") == "train" else 0)
        steps = None if stall.last_step is None or resumed is None else max(0, stall.last_step - resumed)
        # Regained: training again (not setting up) at or past the step the stall stopped at.
        back = next(
            (s for s in later if stall.last_step is not None and s["step"] >= stall.last_step and s.get("phase") == "train"), None
        )
        until = _number(back["ts"]) if back else (self.ended_ts or self.now)
        return Loss(steps=steps, seconds=max(0.0, until - stall.last_progress_ts), regained=back is not None)

    @functools.cached_property
    def slow_periods(self) -> List[SlowPeriod]:
        """The periods the run spent slower than its own pace (:mod:`trainbox.view.slow`)."""
        return slow.periods(self.events)

    def slow_now(self) -> Optional[SlowPeriod]:
        """The slowdown under way, None at pace or once the run is over (its ``exit`` closes it)."""
        going = self.slow_periods[-1] if self.slow_periods else None
        return going if going is not None and going.ended_ts is None else None

    def slow_s(self) -> float:
        """Seconds the run spent slow, up to its end (or now)."""
        return slow.total_s(self.slow_periods, self.ended_ts or self.now)

    @property
    def profile_changes(self) -> List[Dict[str, Any]]:
        """``restart`` events that change the profile (a fallback after a stall)."""
        return [e for e in self.of("restart") if e.get("profile") != e.get("previous_profile")]

    # -- where it stands --------------------------------------------------------
    @property
    def state(self) -> Dict[str, Any]:
        return self.snapshot.state

    @property
    def beat(self) -> Dict[str, Any]:
        return self.snapshot.beat

    @property
    def started_ts(self) -> Optional[float]:
        starts = self.of("start")
        return _number(starts[0].get("ts")) if starts else None

    @property
    def ended_ts(self) -> Optional[float]:
        """When the last supervisor ended the run (its ``exit`` event), unless a later start followed."""
        ended = None
        for event in self.events:
            if event.get("event") == "exit":
                ended = _number(event.get("ts"))
            elif event.get("event") == "start":
                ended = None
        return ended

    @property
    def finished(self) -> bool:
        """The supervisor ended the run: every ending writes an ``exit`` event (a killed supervisor cannot)."""
        return self.ended_ts is not None

    @property
    def final_profile(self) -> Optional[str]:
        starts = self.of("start")
        return starts[-1].get("profile") if starts else None

    def silence(self) -> Optional[Dict[str, Any]]:
        """The current phase's silence against its budget: ``{"s", "budget", "budget_s"}``; None when none runs."""
        budget, silent = self.state.get("budget"), self.state.get("silent_s")
        if self.finished or not isinstance(budget, dict) or not isinstance(silent, (int, float)):
            return None
        # state.json is written about once a second: add the time since.
        grown = max(0.0, self.now - _number(self.state.get("updated_ts"), self.now))
        return {"s": silent + grown, "budget": budget.get("name"), "budget_s": _number(budget.get("seconds"))}

    def checkpoint_age_s(self) -> Optional[float]:
        mtime = self.snapshot.checkpoint_mtime
        return None if mtime is None else max(0.0, self.now - mtime)

    def eta_s(self) -> Optional[float]:
        return None if self.finished else self.snapshot.eta_s()

    def deadline_verdict(self, deadline: Any) -> str:
        """:func:`trainbox.view.status.deadline_verdict` for this run, finished or not."""
        if self.ended_ts is not None:
            return status.deadline_verdict(deadline, self.ended_ts, finished=True)
        eta = self.eta_s()
        return status.deadline_verdict(deadline, None if eta is None else self.now + eta)


def _results(path: Path) -> List[Dict[str, float]]:
    """Ultralytics' ``results.csv``, one row per epoch (the last row of an epoch written twice wins), by epoch."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        return []
    by_epoch: Dict[int, Dict[str, float]] = {}
    for row in rows:
        values: Dict[str, float] = {}
        for key, text in row.items():
            try:
                values[str(key).strip()] = float(text)
            except (TypeError, ValueError):
                continue
        if "epoch" in values:
            by_epoch[int(values["epoch"])] = values
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def read(run_dir: Path, now: Optional[float] = None) -> RunView:
    """The run directory's view; a directory that does not exist is a UserError (one line)."""
    return RunView(run=RunDir(Path(run_dir)), snapshot=status.read(run_dir), now=time.time() if now is None else now)
