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

Every file may be missing, half-written, from an older trainbox or hostile
(issue 33): a view is made of whatever is there, and each reader says "unknown"
(``None``) rather than fail. Files are read through :mod:`trainbox.rundir.safe` and
typed by their parsers (:mod:`trainbox.rundir.records`), so every field used here
has its kind or is absent; what was left out is counted in :attr:`RunView.notes`.
A stall's ``cause`` and ``evidence`` (written by newer supervisors, on the event
or in the incident's ``summary.json``) are shown when present; an ``incident``
that names no report folder (``..``, an absolute path elsewhere) names none.

Standard library and PyYAML only: the supervisor imports it in the container.
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import math
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainbox.rundir.layout import RunDir
from trainbox.rundir.progress import read_samples
from trainbox.rundir.records import Records, read_summary
from trainbox.rundir.safe import RunFiles
from trainbox.view import slow, status
from trainbox.view.slow import SlowPeriod

#: Ultralytics' results.csv: a row of about 300 bytes per epoch (10,000 epochs are 3 MiB); more is not its file.
MAX_RESULTS_BYTES = 4 << 20
#: The name Ultralytics gives its per-epoch metrics, in its save dir beside ``weights/`` (as in the run's own layout).
RESULTS_NAME = Path(RunDir.results.path).name
#: The longest checkpoint path followed to its results.csv (Linux' PATH_MAX): a longer one is no file's.
MAX_PATH_CHARS = 4096
#: The most epochs a row may name.
MAX_EPOCHS = 1_000_000
#: The phases of a sample that trains: a beat's ``train``, or none when the output named none (an unlabelled bar).
TRAINING = ("train", None)


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


@dataclass(frozen=True)
class Loss:
    """What one stall cost: the work trained again and the wall time until the run was back where it stopped."""

    steps: Optional[int]  # the work done again, in ``unit``s; None when it was not measured
    seconds: float
    regained: bool  # False: the run never got back to the stalled place (it ended, or has not yet)
    unit: str = "step"


def _at_or_past(sample: Dict[str, Any], beat: Dict[str, Any]) -> bool:
    """Whether ``sample`` is at or past the place of ``beat``: by step, else by epoch and batch."""
    if isinstance(beat.get("step"), int):
        return isinstance(sample.get("step"), int) and sample["step"] >= beat["step"]
    place = [beat.get("epoch"), beat.get("batch")]
    if not all(isinstance(value, (int, float)) for value in place):
        return False
    there = [sample.get("epoch"), sample.get("batch")]
    return all(isinstance(value, (int, float)) for value in there) and there >= place


def _first(lines: Any) -> Optional[str]:
    """A typed ``evidence`` (a list of lines) as its first line; a ``cause`` as it is."""
    if isinstance(lines, list):
        return lines[0] if lines else None
    return lines or None


@dataclass
class RunView:
    """A run directory at one moment (``now``)."""

    run: RunDir
    snapshot: status.Progress
    now: float

    # -- the run's history, read when first asked for (the live view, once a second, needs neither) -------
    @functools.cached_property
    def progress(self) -> Records:
        """progress.jsonl, typed (:func:`trainbox.rundir.progress.read_samples`; read once: the snapshot's, if it read it)."""
        return self.snapshot.samples if self.snapshot.samples is not None else read_samples(self.run.progress)

    @property
    def samples(self) -> List[Dict[str, Any]]:
        """The usable progress samples: each has a ``ts``."""
        return self.progress.records

    @functools.cached_property
    def results(self) -> List[Dict[str, float]]:
        """results.csv, one row per epoch (see :func:`_results`): the run's own (``run``, ``demo``), else the one beside
        the ``weights/`` folder of the checkpoint the supervised command wrote (``yolo train``: its own save dir)."""
        own = _results(self.run.files, self.run.results)
        beside = _results_beside(self.state.get("checkpoint"))
        return own or (_results(RunFiles(beside.parent), beside) if beside is not None else [])

    @property
    def notes(self) -> List[str]:
        """What could not be used, one line per file (events, state, progress: this reads progress.jsonl)."""
        return list(self.snapshot.notes) + [note for note in [self.progress.note(self.run.progress.name)] if note]

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
                        number=current.get("attempt", len(found)),
                        started_ts=current["ts"],
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
                ended_by, ended_ts = str(kind), event.get("killed_ts", event["ts"])
            elif kind == "restart" and event.get("after") == "slow" and current is not None and ended_by == "running":
                ended_by, ended_ts = "slow", event["ts"]  # --on-slow restart ended it
        close()
        return found

    @functools.cached_property
    def stalls(self) -> List[Stall]:
        found = []
        for event in self.of("stall"):
            report = self.run.incident_named(event["incident"]) if event.get("incident") else None
            summary = (read_summary(self.run.files, report.summary) or {}) if report else {}
            there = self.run.files.stat(report.root).value if report else None
            found.append(
                Stall(
                    attempt=event.get("attempt", 0),
                    killed_ts=event.get("killed_ts", event["ts"]),
                    budget=event.get("budget", "?"),
                    budget_s=event.get("budget_s", 0.0),
                    silent_s=event.get("silent_s", 0.0),
                    incident_s=event.get("incident_s", 0.0),
                    kill_s=event.get("kill_s", 0.0),
                    phase=event.get("phase"),
                    profile=event.get("profile"),
                    incident=report.root if report and there is not None and stat.S_ISDIR(there.st_mode) else None,
                    last_beat=event.get("last_beat", {}),
                    cause=event.get("cause", summary.get("cause")),
                    evidence=_first(event.get("evidence", summary.get("evidence"))),
                )
            )
        return found

    def samples_by_attempt(self) -> Dict[int, List[Dict[str, Any]]]:
        """The progress samples by the :attr:`Attempt.index` they were taken in (the last start before each)."""
        starts = [a.started_ts for a in self.attempts]
        grouped: Dict[int, List[Dict[str, Any]]] = {}
        for sample in self.samples:
            index = bisect.bisect_right(starts, sample["ts"]) - 1
            grouped.setdefault(max(index, 0), []).append(sample)
        return grouped

    def loss(self, stall: Stall) -> Loss:
        """The work done again and the wall time lost to ``stall``.

        The work is what the supervisor measured as the next attempt showed where it began (its ``redone`` event:
        :mod:`trainbox.supervise.resume.redone`). The time is the silence before the kill, the kill, the restart up
        to the next attempt's first progress, and the work done again until it was back at the stalled place. When
        it never got back there (the run ended, or has not yet), only the silence, the kill and the restart are
        counted: never the whole next attempt.
        """
        redone = next((e for e in self.of("redone") if e["ts"] > stall.killed_ts), None)  # the next attempt's
        later = [s for s in self.samples if s["ts"] > stall.killed_ts]
        # Regained: working again (training, or a phase the output did not name) at or past the stalled place.
        back = next((s for s in later if s.get("phase") in TRAINING and _at_or_past(s, stall.last_beat)), None)
        restarted = later[0]["ts"] if later else stall.killed_ts
        until = back["ts"] if back else restarted
        steps, unit = (redone.get("redone"), redone.get("unit")) if redone else (None, None)
        return Loss(
            steps=steps if isinstance(steps, int) else None,
            seconds=max(0.0, until - stall.last_progress_ts),
            regained=back is not None,
            unit=unit if isinstance(unit, str) else "step",
        )

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
        """``restart`` and ``probe`` events that change the profile (the ladder after a stall, or a probe back up)."""
        moves = [e for e in self.events if e.get("event") in ("restart", "probe")]
        return [e for e in moves if e.get("profile") != e.get("previous_profile")]

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
        return starts[0]["ts"] if starts else None

    @property
    def ended_ts(self) -> Optional[float]:
        """When the last supervisor ended the run (its ``exit`` event), unless a later start followed."""
        ended = None
        for event in self.events:
            if event.get("event") == "exit":
                ended = event["ts"]
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
        if self.finished or budget is None or silent is None:
            return None
        # state.json is written about once a second: add the time since.
        grown = max(0.0, self.now - self.state.get("updated_ts", self.now))
        return {"s": silent + grown, "budget": budget.get("name"), "budget_s": budget.get("seconds", 0.0)}

    def eta_s(self) -> Optional[float]:
        return None if self.finished else self.snapshot.eta_s()

    def deadline_verdict(self, deadline: Any) -> str:
        """:func:`trainbox.view.status.deadline_verdict` for this run, finished or not."""
        if self.ended_ts is not None:
            return status.deadline_verdict(deadline, self.ended_ts, finished=True)
        eta = self.eta_s()
        return status.deadline_verdict(deadline, None if eta is None else self.now + eta)


def _rows(text: str) -> List[Dict[Any, Any]]:
    """The rows of a CSV text up to the first that the csv module refuses (a field over its 128 KiB limit)."""
    rows: List[Dict[Any, Any]] = []
    try:
        rows.extend(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error:
        pass  # the rows before it were kept by extend
    return rows


def _results_beside(checkpoint: Any) -> Optional[Path]:
    """``<save_dir>/results.csv`` for state.json's ``checkpoint`` at ``<save_dir>/weights/<name>.pt`` (Ultralytics'
    layout), an absolute path; None for any other (the record is untrusted: only that file name is ever read)."""
    path = checkpoint.get("path") if isinstance(checkpoint, dict) else None
    if not isinstance(path, str) or "\0" in path or len(path) > MAX_PATH_CHARS:
        return None
    found = Path(path)
    if not found.is_absolute() or found.suffix != ".pt" or found.parent.name != "weights" or ".." in found.parts:
        return None
    return found.parent.parent / RESULTS_NAME


def _results(files: RunFiles, path: Path) -> List[Dict[str, float]]:
    """Ultralytics' ``results.csv`` at ``path``, one row per epoch (the last row of an epoch written twice wins), by
    epoch.

    Read through :mod:`trainbox.rundir.safe` (none over MAX_RESULTS_BYTES), undecodable bytes replaced; only
    finite numbers are kept, and an epoch must be a whole number from 0 to the epochs a run may have.
    """
    got = files.read_bytes(path, MAX_RESULTS_BYTES)
    if got.value is None:
        return []
    text = got.value.decode("utf-8", "replace").replace("\0", "")  # csv refuses NUL
    by_epoch: Dict[int, Dict[str, float]] = {}
    for row in _rows(text):
        values: Dict[str, float] = {}
        for key, cell in row.items():
            try:
                number = float(cell)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                values[str(key).strip()] = number
        epoch = values.get("epoch")
        if epoch is not None and epoch.is_integer() and 0 <= epoch <= MAX_EPOCHS:
            by_epoch[int(epoch)] = values
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def read(run_dir: Path, now: Optional[float] = None) -> RunView:
    """The run directory's view; a directory that does not exist is a UserError (one line)."""
    now = time.time() if now is None else now
    return RunView(run=RunDir(Path(run_dir)), snapshot=status.read(run_dir, now), now=now)
