"""``invoke status``: where a run stands, from its run directory on the host.

Reads ``state.json`` (supervisor), ``events.jsonl`` (restarts, stalls and the last one's cause),
``heartbeat.json`` (epoch, batch, throughput; under torchrun the lowest rank's
``heartbeats/rank-<rank>.json``) and Ultralytics' ``args.yaml``
(epochs, batch size); the ETA counts training batches only. A child that does not beat has
no heartbeat file: its progress is the counter the supervisor read from its output, which
``state.json`` carries as ``heartbeat`` (with the ``pattern`` that read it).

A run whose last event is ``exit`` has ended: it has no phase, heartbeat age, ETA or container
health to report, only when it finished and with which status (``finished at ..., exit N``).

"The newest run" (``status`` without a run named) is the run directory under ``runs/`` whose last
event is the latest, whichever route made it: ``invoke train``'s ``runs/<profile>-<timestamp>``,
compose's ``runs/demo``, the native ``runs/trainbox``. A directory without events yet (made, not
started) counts from its own modification time. Whatever a directory holds is read as untrusted:
a torn or odd ``events.jsonl`` is a directory without events, never an error.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from trainbox.errors import UserError
from trainbox.rundir import state as state_file
from trainbox.rundir.events import read_events
from trainbox.rundir.layout import RunDir


@dataclass
class Progress:
    """Numbers derived from one run directory at one moment."""

    state: Dict[str, Any]
    beat: Dict[str, Any]
    events: List[Dict[str, Any]]
    epochs: Optional[int]
    batch_size: Optional[int]
    checkpoint_mtime: Optional[float]

    @property
    def batches_per_epoch(self) -> Optional[float]:
        epoch, step, batch = self.beat.get("epoch"), self.beat.get("step"), self.beat.get("batch")
        if not epoch or epoch < 2 or step is None or batch is None:
            return None
        return (step - batch) / (epoch - 1)

    def eta_s(self) -> Optional[float]:
        """Seconds of training left at the current throughput, when known."""
        per_epoch, rate = self.batches_per_epoch, self.beat.get("imgs_per_s")
        if per_epoch is None or not rate or not self.epochs or not self.batch_size:
            return None
        remaining = self.epochs * per_epoch - self.beat.get("step", 0)
        return max(remaining, 0) * self.batch_size / rate

    @property
    def finished(self) -> Optional[Dict[str, Any]]:
        """The ``exit`` event when it is the run's last event (the run has ended), else None."""
        last = self.events[-1] if self.events else None
        return last if isinstance(last, dict) and last.get("event") == "exit" else None

    def count(self, event: str) -> int:
        """Supervisor's own count (state.json ``restarts``, ...), else events.jsonl's."""
        counted = self.state.get(event + "s")
        if isinstance(counted, int):
            return counted
        return sum(1 for record in self.events if record.get("event") == event)

    def last_stall(self) -> Optional[str]:
        """The last stall's attempt, cause and first evidence line; None before any (or from an older supervisor)."""
        stalls = [record for record in self.events if record.get("event") == "stall" and record.get("cause")]
        if not stalls:
            return None
        last = stalls[-1]
        evidence = last.get("evidence") or ["no evidence"]
        first = evidence if isinstance(evidence, str) else evidence[0]
        observed = ", reported only (--on-stall report)" if last.get("action") == "report" else ""
        return f"attempt {last.get('attempt', '?')}: {last['cause']} ({first}){observed}"


def json_object(path: Path) -> Dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, torn or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _lowest_rank_beat(run: RunDir) -> Dict[str, Any]:
    """Under torchrun: the last beat of the lowest rank of this node (rank 0 on the first node); else empty."""
    directory = run.rank_heartbeat.directory
    beats = [json_object(path) for path in directory.iterdir()] if directory.is_dir() else []
    ranked = [beat for beat in beats if isinstance(beat.get("rank"), int)]
    return min(ranked, key=lambda beat: beat["rank"]) if ranked else {}


def read(run_dir: Path) -> Progress:
    """Collect a run directory's files; a directory that is not a run is a UserError."""
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} not found: pass --run-dir or start a run with `invoke train`")
    run = RunDir(run_dir)
    args: Dict[str, Any] = {}
    try:
        args = yaml.safe_load(run.train_args.read_text()) or {}
    except (OSError, yaml.YAMLError):
        pass
    checkpoint = run.last_checkpoint
    state = state_file.read(run.state)[0] or {}
    published = state.get("heartbeat")  # the supervisor's last progress: a counter read from the output, if no beat
    return Progress(
        state=state,
        beat=_lowest_rank_beat(run) or json_object(run.heartbeat) or (published if isinstance(published, dict) else {}),
        events=read_events(run.events),
        epochs=args.get("epochs"),
        batch_size=args.get("batch"),
        checkpoint_mtime=checkpoint.stat().st_mtime if checkpoint.exists() else None,
    )


def _ts(record: Any) -> Optional[float]:
    """A record's ``ts`` when it is a usable time (the file is untrusted), else None."""
    ts = record.get("ts") if isinstance(record, dict) else None
    return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else None


def last_activity(run_dir: Path) -> float:
    """When the run last did something: its last event's ``ts``, else the directory's modification time."""
    for record in reversed(read_events(RunDir(run_dir).events)):
        ts = _ts(record)
        if ts is not None:
            return ts
    return run_dir.stat().st_mtime


def newest_run(runs: Path) -> Path:
    """The run directory under ``runs`` with the latest :func:`last_activity`; a UserError when there is none."""
    found = sorted((last_activity(path), path.name, path) for path in runs.glob("*/") if path.is_dir()) if runs.is_dir() else []
    if not found:
        raise UserError(f"no run found under {runs}: pass --run-dir or start one (`invoke train`, `trainbox run`)")
    return found[-1][2]


def duration(seconds: float) -> str:
    """``1h05m`` or ``4m09s``."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


#: What ``--deadline`` takes, for its help and its error (``parse_deadline``).
DEADLINE_FORMATS = "HH:MM or YYYY-MM-DDTHH:MM[+01:00]"


def parse_deadline(text: str, now: datetime.datetime) -> datetime.datetime:
    """ISO date-time (``2026-11-21T07:00``, with or without a UTC offset) or ``HH:MM`` (the next such time)."""
    try:
        if len(text) <= 5 and ":" in text:
            clock = datetime.datetime.strptime(text, "%H:%M").time()
            moment = datetime.datetime.combine(now.date(), clock)
            return moment if moment > now else moment + datetime.timedelta(days=1)
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"--deadline {text!r}: use {DEADLINE_FORMATS}") from None
    # With a UTC offset (2026-11-22T07:00+01:00): the same moment on this machine's clock, which ETAs use.
    return moment.astimezone().replace(tzinfo=None) if moment.tzinfo else moment


def deadline_verdict(deadline: datetime.datetime, finish_ts: Optional[float], finished: bool = False) -> str:
    """``2026-11-22 07:00: expected finish 06:12, makes it with 48m00s to spare`` (or ``late by``, or cannot tell)."""
    if finish_ts is None:
        return f"{deadline:%Y-%m-%d %H:%M}: cannot tell yet (no ETA)"
    finish = datetime.datetime.fromtimestamp(finish_ts)
    margin = (deadline - finish).total_seconds()
    made = "made it" if finished else "makes it"
    verdict = f"{made} with {duration(margin)} to spare" if margin >= 0 else f"late by {duration(-margin)}"
    return f"{deadline:%Y-%m-%d %H:%M}: {'finished' if finished else 'expected finish'} {finish:%H:%M}, {verdict}"


def _clock(ts: Optional[float]) -> str:
    """``2026-11-24 23:41:07``, or ``?`` for a time that is not one."""
    try:
        return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts is not None else "?"
    except (ValueError, OverflowError, OSError):
        return "?"


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _place(beat: Dict[str, Any], progress: Progress, batch: bool = True) -> str:
    """``epoch 3/10, batch 5/10`` (totals from args.yaml, else from the beat; ``epoch 3/10`` without ``batch``), or
    ``step 1200``."""
    if "epoch" not in beat and "batch" not in beat and "step" in beat:
        return f"step {beat['step']}"
    epochs = progress.epochs or beat.get("epochs")
    place = f"epoch {beat.get('epoch', '?')}{f'/{epochs}' if epochs else ''}"
    if not batch:
        return place
    per_epoch = progress.batches_per_epoch or _number(beat.get("batches"), 0)
    return f"{place}, batch {beat.get('batch', '?')}{f'/{per_epoch:.0f}' if per_epoch else ''}"


def render(
    run_dir: Path,
    progress: Progress,
    health: Optional[str] = None,
    deadline: Optional[datetime.datetime] = None,
    now: Optional[float] = None,
) -> List[str]:
    """Human-readable status lines: where a live run stands, or how an ended one finished."""
    now = time.time() if now is None else now
    attempt = [f"attempt {progress.state['attempt']}"] if "attempt" in progress.state else []
    rung = [f"profile {progress.state['profile']}"] if progress.state.get("profile") else []  # a profile or a ladder's rung
    said = f" ({', '.join(attempt + rung)})" if attempt else ""
    lines = [f"run       {run_dir}", f"state     {progress.state.get('state', 'unknown')}{said}"]
    finished = progress.finished
    if finished is not None:
        lines[-1] += f", finished at {_clock(_ts(finished))}, exit {finished.get('code', '?')}"
        lines.append(f"trained   {_place(progress.beat, progress, batch=False)}")
    else:
        lines += _live_lines(progress, now, health)
    lines.append(f"restarts  {progress.count('restart')}, stalls {progress.count('stall')}, crashes {progress.count('crash')}")
    stall = progress.last_stall()
    if stall:
        lines.append(f"stall     {stall}")
    checkpoint = progress.checkpoint_mtime
    lines.append(f"checkpoint {'last.pt ' + duration(now - checkpoint) + ' old' if checkpoint else 'none yet'}")
    if deadline is not None:
        if finished is not None:
            lines.append(f"deadline  {deadline_verdict(deadline, _ts(finished), finished=True)}")
        else:
            eta = progress.eta_s()
            lines.append(f"deadline  {deadline_verdict(deadline, None if eta is None else now + eta)}")
    return lines


def _live_lines(progress: Progress, now: float, health: Optional[str]) -> List[str]:
    """A run under way: its progress, speed, ETA and (in a container) health."""
    beat = progress.beat
    lines = []
    if beat:
        source = f" (read from its output: {beat['pattern']})" if beat.get("pattern") else ""
        lines.append(
            f"progress  {_place(beat, progress)}, phase {beat.get('phase', '?')}, "
            f"last beat {duration(now - _number(beat.get('ts'), now))} ago{source}"
        )
        if beat.get("imgs_per_s"):
            lines.append(f"speed     {beat['imgs_per_s']} img/s")
    else:
        lines.append("progress  no heartbeat yet")
    eta = progress.eta_s()
    lines.append(f"eta       {duration(eta) if eta is not None else 'unknown (needs a finished epoch)'}")
    if health:
        lines.append(f"health    {health}")
    return lines
