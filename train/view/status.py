"""``invoke status``: where a run stands, from its run directory on the host.

Reads ``state.json`` (supervisor), ``events.jsonl`` (restarts, stalls and the last one's cause),
``heartbeat.json`` (epoch, batch, throughput; under torchrun the lowest rank's
``heartbeats/rank-<rank>.json``) and Ultralytics' ``args.yaml``
(epochs, batch size); the ETA counts training batches only. A child that does not beat has
no heartbeat file: its progress is the counter the supervisor read from its output, which
``state.json`` carries as ``heartbeat`` (with the ``pattern`` that read it).
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from trainbox.errors import UserError
from trainbox.rundir import state as state_file
from trainbox.rundir.events import read_events
from trainbox.rundir.layout import RunDir
from trainbox.view import slow


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


def _slow_lines(progress: Progress, now: float) -> List[str]:
    """The slowdown under way, and the time spent slow so far (nothing for a run that never was)."""
    found = slow.periods(progress.events)
    if not found:
        return []
    going = found[-1] if found[-1].ended_ts is None else None
    lines = [f"pace      {going.line()}; {going.evidence[0] if going.evidence else 'no evidence'}"] if going else []
    lines.append(f"pace      slow for {duration(slow.total_s(found, now))} in {len(found)} episode(s)")
    return lines


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _place(beat: Dict[str, Any], progress: Progress) -> str:
    """``epoch 3/10, batch 5/10`` (totals from args.yaml, else from the beat), or ``step 1200``."""
    if "epoch" not in beat and "batch" not in beat and "step" in beat:
        return f"step {beat['step']}"
    epochs = progress.epochs or beat.get("epochs")
    per_epoch = progress.batches_per_epoch or _number(beat.get("batches"), 0)
    return (
        f"epoch {beat.get('epoch', '?')}{f'/{epochs}' if epochs else ''}, "
        f"batch {beat.get('batch', '?')}{f'/{per_epoch:.0f}' if per_epoch else ''}"
    )


def render(
    run_dir: Path,
    progress: Progress,
    health: Optional[str] = None,
    deadline: Optional[datetime.datetime] = None,
    now: Optional[float] = None,
) -> List[str]:
    """Human-readable status lines."""
    now = time.time() if now is None else now
    beat = progress.beat
    lines = [f"run       {run_dir}"]
    attempt = [f"attempt {progress.state['attempt']}"] if "attempt" in progress.state else []
    rung = [f"profile {progress.state['profile']}"] if progress.state.get("profile") else []  # a profile or a ladder's rung
    lines.append(f"state     {progress.state.get('state', 'unknown')}" + (f" ({', '.join(attempt + rung)})" if attempt else ""))
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
    lines.append(f"restarts  {progress.count('restart')}, stalls {progress.count('stall')}, crashes {progress.count('crash')}")
    stall = progress.last_stall()
    if stall:
        lines.append(f"stall     {stall}")
    lines += _slow_lines(progress, now)
    if health:
        lines.append(f"health    {health}")
    checkpoint = progress.checkpoint_mtime
    lines.append(f"checkpoint {'last.pt ' + duration(now - checkpoint) + ' old' if checkpoint else 'none yet'}")
    if deadline is not None:
        lines.append(f"deadline  {deadline_verdict(deadline, None if eta is None else now + eta)}")
    return lines
