"""``invoke status``: where a run stands, from its run directory on the host.

Reads ``state.json`` (supervisor), ``events.jsonl`` (restarts, stalls and the last one's cause),
``heartbeat.json`` (epoch, batch, throughput; under torchrun the lowest rank's
``heartbeats/rank-<rank>.json``) and Ultralytics' ``args.yaml``
(epochs, batch size); the ETA counts training batches only. A child that does not beat has
no heartbeat file: its progress is the counter the supervisor read from its output, which
``state.json`` carries as ``heartbeat`` (with the ``pattern`` that read it).

Every file comes through :mod:`trainbox.rundir.safe` and typed (:mod:`trainbox.rundir.records`): what cannot be
used is left out and said on a ``note`` line (``events.jsonl: 2 unusable line(s) skipped``), never a traceback.

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
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from trainbox.errors import UserError
from trainbox.rundir import events as events_file
from trainbox.rundir import state as state_file
from trainbox.rundir.layout import RunDir
from trainbox.rundir.progress import read_samples
from trainbox.rundir.records import Records, rank_files, read_beat, whole
from trainbox.supervise import settings
from trainbox.supervise.resume.redone import UNITS, amount
from trainbox.supervise.settings import DEADLINE_FORMATS  # noqa: F401  (status' and report's --help name it)
from trainbox.view import counter, slow
from trainbox.view.counter import Bar

#: Ultralytics' args.yaml is about 2 KiB; more is not its file (and PyYAML parses about a MiB a second).
MAX_ARGS_BYTES = 64 * 1024


@dataclass
class Progress:
    """Numbers derived from one run directory at one moment."""

    state: Dict[str, Any]
    beat: Dict[str, Any]
    events: List[Dict[str, Any]]
    epochs: Optional[int]
    batch_size: Optional[int]
    checkpoint_mtime: Optional[float]
    #: What could not be used, one line per file (see the module's docstring).
    notes: List[str] = field(default_factory=list)
    #: The newest checkpoint's path (``last.pt`` for trainbox's own runs) and step, when known.
    checkpoint_path: Optional[str] = None
    checkpoint_step: Optional[int] = None
    #: A child that does not beat: the counter its output showed, as a bar with a total, a rate and an ETA.
    bar: Optional[Bar] = None
    #: progress.jsonl as read for the bar (None: not read), for a caller that needs it too.
    samples: Optional[Records] = None

    @property
    def batches_per_epoch(self) -> Optional[float]:
        epoch, step, batch = self.beat.get("epoch"), self.beat.get("step"), self.beat.get("batch")
        if not epoch or epoch < 2 or step is None or batch is None:
            return None
        return (step - batch) / (epoch - 1)

    def eta_s(self) -> Optional[float]:
        """Seconds of training left at the current throughput, when known (a bar's own, for a child that does not beat)."""
        per_epoch, rate = self.batches_per_epoch, self.beat.get("imgs_per_s")
        if per_epoch is None or not rate or not self.epochs or not self.batch_size:
            return self.bar.eta_s() if self.bar is not None else None
        remaining = self.epochs * per_epoch - (self.beat.get("step") or 0)
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
        first = (last.get("evidence") or ["no evidence"])[0]
        observed = ", reported only (--on-stall report)" if last.get("action") == "report" else ""
        return f"attempt {last.get('attempt', '?')}: {last['cause']} ({first}){observed}"


def ladder_line(events: List[Dict[str, Any]]) -> Optional[str]:
    """The ladder policy's last word (a ``restart`` or ``probe`` event's ``ladder``): the rung, the kind of move, why,
    and the time stalls cost against what the safest rung would have cost; None before any."""
    decided = [e["ladder"] for e in events if e.get("event") in ("restart", "probe") and isinstance(e.get("ladder"), dict)]
    if not decided:
        return None
    last = decided[-1]
    lost, safety = _number(last.get("lost_to_stalls_s"), 0.0), _number(last.get("safety_would_cost_s"), 0.0)
    tally = f"stalls cost {duration(lost)}, the safest rung would have cost {duration(safety)} more"
    rule = f"--ladder-policy {last.get('policy', '?')}"
    return f"{last.get('rung', '?')} ({last.get('kind', '?')}, {rule}): {tally}; {last.get('reason', '')}"


def _lowest_rank_beat(run: RunDir) -> Dict[str, Any]:
    """Under torchrun: the last beat of the lowest rank of this node (rank 0 on the first node); else empty."""
    beats = [read_beat(run.files, run.rank_heartbeat(rank)) for rank in rank_files(run)]
    ranked = [beat for beat in beats if beat is not None and "rank" in beat]
    return min(ranked, key=lambda beat: beat["rank"]) if ranked else {}


def _positive(value: Any) -> Optional[int]:
    number = whole(value)
    return number if isinstance(number, int) and number > 0 else None


def _train_args(run: RunDir) -> Dict[str, Optional[int]]:
    """``epochs`` and ``batch`` from Ultralytics' args.yaml, when it holds them as positive whole numbers."""
    got = run.files.read_bytes(run.train_args, MAX_ARGS_BYTES)
    try:
        args = yaml.safe_load(got.value) if got.value is not None else None
    except (yaml.YAMLError, RecursionError, ValueError):  # not YAML, nested too deep, an integer too long
        args = None
    args = args if isinstance(args, dict) else {}
    return {"epochs": _positive(args.get("epochs")), "batch": _positive(args.get("batch"))}


def read(run_dir: Path, now: Optional[float] = None) -> Progress:
    """Collect a run directory's files; a directory that is not a run is a UserError."""
    if not run_dir.is_dir():  # not the run directory: its root, the user's own path (a link there is the user's)
        raise UserError(f"run directory {run_dir} not found: pass --run-dir or start a run with `invoke train`")
    return snapshot(RunDir(run_dir), now)


def snapshot(run: RunDir, now: Optional[float] = None) -> Progress:
    """The run directory's files as they are at ``now`` (default: now), typed; whatever is missing or refused is
    simply not there."""
    args = _train_args(run)
    state, why = state_file.read(run.state)
    history = events_file.history(run.events)
    checkpoint = run.files.stat(run.last_checkpoint).value
    found = _found_checkpoint(state)
    notes = [note for note in [history.note(run.events.name)] if note]
    if state is None and "unreadable" in why:
        notes.append(why)
    state = state or {}
    published = state.get("heartbeat") or {}  # the supervisor's last progress: a counter read from the output, if no beat
    beat = _lowest_rank_beat(run) or read_beat(run.files, run.heartbeat) or published
    samples = read_samples(run.progress) if beat is published and published else None
    return Progress(
        state=state,
        beat=beat,
        events=history.records,
        epochs=args["epochs"],
        batch_size=args["batch"],
        checkpoint_mtime=checkpoint.st_mtime if checkpoint is not None else found.get("mtime"),
        notes=notes,
        bar=_bar(beat, samples, state, args["epochs"], time.time() if now is None else now),
        samples=samples,
        checkpoint_path=run.last_checkpoint.name if checkpoint is not None else found.get("path"),
        checkpoint_step=None if checkpoint is not None else found.get("step"),
    )


def _bar(
    beat: Dict[str, Any], samples: Optional[Records], state: Dict[str, Any], epochs: Optional[int], now: float
) -> Optional[Bar]:
    """The counter the supervisor read from the output, as a bar (:mod:`trainbox.view.counter`); None for a beat."""
    if samples is None:
        return None
    return counter.bar_of(beat, samples.records, now, whole(state.get("attempt")), epochs)


def _found_checkpoint(state: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The newest checkpoint the supervisor found the command wrote (state.json ``checkpoint``), its fields checked."""
    found = (state or {}).get("checkpoint")
    found = found if isinstance(found, dict) else {}
    path, mtime, step = found.get("path"), _number(found.get("mtime"), math.nan), whole(found.get("step"))
    if not isinstance(path, str) or not math.isfinite(mtime):
        return {}
    return {"path": path, "mtime": mtime, "step": step if isinstance(step, int) else None}


def checkpoint_line(progress: Progress, now: float) -> str:
    """``ck/step-40.pt, 3m05s old, step 40`` (``last.pt 1m00s old`` for trainbox's own runs), or ``none yet``."""
    if progress.checkpoint_mtime is None:
        return "none yet"
    step = f", step {progress.checkpoint_step}" if progress.checkpoint_step is not None else ""
    return f"{progress.checkpoint_path or 'a checkpoint'}, {duration(max(0.0, now - progress.checkpoint_mtime))} old{step}"


def resumed_line(state: Dict[str, Any]) -> Optional[str]:
    """``attempt 1 from ck/step-20.pt (step 20): 6 steps done again, 6 in the run``; None before a restart resumed."""
    resumed = state.get("resumed")
    if not isinstance(resumed, dict):
        return None
    source, step, again = resumed.get("from"), whole(resumed.get("step")), whole(resumed.get("redone_steps"))
    where = (
        f"from {source}" + (f" (step {step})" if isinstance(step, int) else "") if isinstance(source, str) else "from the start"
    )
    written = resumed.get("written") if isinstance(resumed.get("written"), dict) else {}
    if not isinstance(source, str) and isinstance(written.get("path"), str):
        options = resumed.get("options") if isinstance(resumed.get("options"), str) else "--resume-args"
        where += f" (checkpoints written, not used on restart: {written['path']}; {options})"
    total = whole(state.get("redone_steps"))
    unit = resumed.get("redone_unit") if resumed.get("redone_unit") in UNITS else "step"
    said = f": {amount(again, unit)} done again" if isinstance(again, int) else ": work done again unknown"
    attempt = whole(resumed.get("attempt"))
    return f"attempt {attempt if isinstance(attempt, int) else '?'} {where}{said}" + (
        f", {total} in the run" if isinstance(total, int) else ""
    )


def _ts(record: Any) -> Optional[float]:
    """A record's ``ts`` when it is a usable time (the file is untrusted), else None."""
    ts = record.get("ts") if isinstance(record, dict) else None
    return float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else None


def last_activity(run_dir: Path) -> float:
    """When the run last did something: its last event's ``ts``, else the directory's modification time."""
    for record in reversed(events_file.history(RunDir(run_dir).events).records):
        ts = _ts(record)
        if ts is not None:
            return ts
    return run_dir.stat().st_mtime  # run directory, checked: its folder's own time (nothing in it is opened)


def newest_run(runs: Path) -> Path:
    """The run directory under ``runs`` with the latest :func:`last_activity`; a UserError when there is none."""
    listed = runs.glob("*/") if runs.is_dir() else ()  # not the run directory: the runs folder, listed
    found = sorted((last_activity(path), path.name, path) for path in listed if path.is_dir())  # run directory, checked: a folder
    if not found:
        raise UserError(f"no run found under {runs}: pass --run-dir or start one (`invoke train`, `trainbox run`)")
    return found[-1][2]


def duration(seconds: float) -> str:
    """``1h05m`` or ``4m09s``."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def parse_deadline(text: str, now: datetime.datetime) -> datetime.datetime:
    """:func:`trainbox.supervise.settings.parse_deadline` (the one rule), its error a UserError (exit 2)."""
    try:
        return settings.parse_deadline(text, now)
    except ValueError as exc:
        raise UserError(f"--deadline {exc}") from None


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


def _clock(ts: Optional[float]) -> str:
    """``2026-11-24 23:41:07``, or ``?`` for a time that is not one."""
    try:
        return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts is not None else "?"
    except (ValueError, OverflowError, OSError):
        return "?"


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def place_of(beat: Dict[str, Any], progress: Progress, batch: bool = True) -> str:
    """``epoch 3/10, batch 5/10`` (totals from args.yaml, else from the beat; ``epoch 3/10`` without ``batch``), or
    ``step 1200``, or ``batch 5`` (no ``epoch ?`` where no epoch was ever shown or known)."""
    if "epoch" not in beat and "batch" not in beat and "step" in beat:
        return f"step {beat['step']}"
    epochs = progress.epochs or beat.get("epochs")
    if "epoch" not in beat and "batch" in beat and not epochs:
        return f"batch {beat['batch']}"
    place = f"epoch {beat.get('epoch', '?')}{f'/{epochs}' if epochs else ''}"
    if not batch:
        return place
    per_epoch = progress.batches_per_epoch or _number(beat.get("batches"), 0)
    return f"{place}, batch {beat.get('batch', '?')}{f'/{per_epoch:.0f}' if per_epoch else ''}"


def _trained(progress: Progress) -> str:
    """Where an ended run got to: its bar's place (``step 40/40``), its beat's epoch, or that none was read."""
    beat = progress.beat
    if progress.bar is not None:
        return progress.bar.position()
    if "epoch" in beat:
        return place_of(beat, progress, batch=False)
    return place_of(beat, progress) if "batch" in beat or "step" in beat else "nothing: no progress was read"


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
        lines.append(f"trained   {_trained(progress)}")
    else:
        lines += _live_lines(progress, now, health)
    lines.append(f"restarts  {progress.count('restart')}, stalls {progress.count('stall')}, crashes {progress.count('crash')}")
    stall = progress.last_stall()
    if stall:
        lines.append(f"stall     {stall}")
    lines += _slow_lines(progress, now)
    lines.append(f"checkpoint {checkpoint_line(progress, now)}")
    resumed = resumed_line(progress.state)
    if resumed:
        lines.append(f"resumed   {resumed}")
    ladder = ladder_line(progress.events)
    if ladder:
        lines.append(f"ladder    {ladder}")
    lines += [f"note      {note}" for note in progress.notes]
    if deadline is not None:
        if finished is not None:
            lines.append(f"deadline  {deadline_verdict(deadline, _ts(finished), finished=True)}")
        else:
            eta = progress.eta_s()
            lines.append(f"deadline  {deadline_verdict(deadline, None if eta is None else now + eta)}")
    return lines


def busy_line(state: Dict[str, Any]) -> Optional[str]:
    """A busy silence allowed past its learned or declared budget: ``silent 75 s, busy (evaluation?), judged at 300 s``
    (state.json's ``busy``, trainbox.supervise.stalls.silence); None when there is none."""
    busy = state.get("busy")
    if not busy or not busy.get("busy") or "silent_s" not in state:
        return None
    judged = f", judged at {busy['judged_at_s']:.0f} s" if "judged_at_s" in busy else ""
    return f"silent {state['silent_s']:.0f} s, busy ({busy.get('guess') or 'working'}){judged}"


def eta_line(progress: Progress) -> str:
    """``4m10s``, for a bar ``4m10s (the run's)`` or ``0m04s (this bar's; ...)``, growing while it is silent; or why
    it is unknown."""
    eta, bar = progress.eta_s(), progress.bar
    if eta is None:
        return "unknown (needs a total and a rate)" if bar is not None else "unknown (needs a finished epoch)"
    return f"{duration(eta)} ({bar.eta_words()})" if bar is not None else duration(eta)


def _live_lines(progress: Progress, now: float, health: Optional[str]) -> List[str]:
    """A run under way: its progress, speed, ETA and (in a container) health."""
    beat = progress.beat
    lines = []
    if beat:
        source = f" (read from its output: {beat['pattern']})" if beat.get("pattern") else ""
        place = progress.bar.position() if progress.bar is not None else place_of(beat, progress)
        phase = f", phase {beat.get('phase', '?')}" if beat.get("phase") or progress.bar is None else ""
        lines.append(f"progress  {place}{phase}, last beat {duration(now - _number(beat.get('ts'), now))} ago{source}")
        if beat.get("imgs_per_s"):
            lines.append(f"speed     {beat['imgs_per_s']} img/s")
        elif progress.bar is not None:
            lines.append(f"speed     {progress.bar.speed()}")
    else:
        lines.append("progress  no heartbeat yet")
    silence = busy_line(progress.state)
    if silence:
        lines.append(f"silence   {silence}")
    lines.append(f"eta       {eta_line(progress)}")
    if health:
        lines.append(f"health    {health}")
    return lines
