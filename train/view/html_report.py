"""``trainbox report RUN_DIR``: the whole run in one self-contained HTML file.

Ultralytics' ``results.png`` covers epochs; this covers the run: what the
supervisor saw and did, across every attempt. Five parts, each from
:mod:`trainbox.view.runview` (the run directory alone):

1. throughput against time over all attempts, with the stalls (their
   silence shaded), the periods the run was slower than its own pace (shaded,
   and listed below the chart with their suspect and evidence), restarts,
   profile changes and checkpoints marked; the time axis counts from the run's
   start in the unit its span reads best in (seconds, minutes or hours:
   :func:`time_axis`), its label naming the start's clock time;
2. loss and mAP from Ultralytics' ``results.csv`` (the run's own, or the one in the save dir of the checkpoints
   ``yolo train`` wrote), by epoch, so continuous across restarts, with the epochs where an attempt resumed
   marked; without it, the training loss the output showed (a bar's ``loss=``, a log's ``loss`` field) over time;
3. per phase, the silences actually seen against the budget in force
   (startup, setup, train, val, save ...: whatever phases the child declared; a silence of no phase, as an
   unlabelled bar's, has no row);
4. each incident: cause and evidence (when the supervisor recorded them),
   silent time, time to kill, lost work, and relative links to its files;
5. a summary: total time, time lost to stalls, time spent slow, restarts, final
   profile and the deadline verdict; then the history, every event.

Charts are drawn by matplotlib (Agg, through ``Figure`` directly: no pyplot
state, no display) and embedded as base64 PNG, so the file can be mailed or
copied off a workstation alone; links to incident files are relative, so they
work wherever the run directory is copied with it. The file is written
atomically, into the run directory through :mod:`trainbox.rundir.safe` (a
``report.html`` that is a link is replaced, never written through), to an
``--out`` path of the user's own with :mod:`trainbox.atomic`. matplotlib is imported only here, on
demand: the supervisor's :func:`refresh` says in one line when it is missing.
The report is a host-side feature: the ``host`` extra installs matplotlib
(and nothing of the ``yolo`` extra is needed to draw it).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

from trainbox.atomic import atomic_writer
from trainbox.errors import UserError, say
from trainbox.rundir.layout import IncidentDir, RunDir
from trainbox.rundir.progress import STARTUP_PHASE
from trainbox.supervise.resume.redone import amount
from trainbox.view import counter
from trainbox.view.runview import RunView, Stall
from trainbox.view.runview import read as read_view
from trainbox.view.status import checkpoint_line, duration, ladder_line, resumed_line

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Chart size in inches at DPI: readable on a laptop screen, about 40-80 KB per PNG.
WIDTH_IN, HEIGHT_IN, DPI = 10.0, 3.4, 100
#: results.csv columns drawn as curves (Ultralytics' detection names); any other column is left out.
LOSS_PREFIXES = ("train/", "val/")
METRIC_PREFIX = "metrics/mAP"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
STALL_COLOR, CHECKPOINT_COLOR, RESTART_COLOR, SLOW_COLOR = "#d62728", "#2ca02c", "#555555", "#ff7f0e"
#: The time axis' units, smallest first, and the span (in seconds) up to which each reads best: up to 3 minutes
#: in seconds, up to 3 hours in minutes, beyond in hours (a few to a few dozen ticks of whole numbers each).
TIME_UNITS = (("seconds", 1.0, 180.0), ("minutes", 60.0, 3 * 3600.0), ("hours", 3600.0, float("inf")))


# -- the charts ------------------------------------------------------------------
def _import_matplotlib() -> None:
    """Import matplotlib quietly: where its config directory is read-only (the container's root) it warns in two
    lines that it uses a temporary one, which is fine for a report and would end the supervisor's output."""
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    import matplotlib  # noqa: F401


def _figure(height: float = HEIGHT_IN) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class TimeAxis:
    """Time as the report draws it: from ``origin`` (unix seconds) in ``unit`` (seconds, minutes or hours)."""

    origin: float
    unit: str
    unit_s: float

    def x(self, ts: float) -> float:
        return (ts - self.origin) / self.unit_s

    @property
    def label(self) -> str:
        return f"{self.unit} since {datetime.datetime.fromtimestamp(self.origin):%Y-%m-%d %H:%M:%S}"


def time_axis(start: float, end: float) -> TimeAxis:
    """The axis for times from ``start`` to ``end``: the largest unit whose range the span fits in."""
    span = max(end - start, 0.0)
    unit, unit_s = next((name, seconds) for name, seconds, up_to in TIME_UNITS if span <= up_to)
    return TimeAxis(start, unit, unit_s)


def _time_axis_of(view: RunView) -> TimeAxis:
    """From the run's first start (or first sample) to its end (or now)."""
    first = [ts for ts in (view.started_ts, *(s.get("ts") for s in view.samples[:1])) if isinstance(ts, (int, float))]
    start = min(first) if first else view.now
    return time_axis(start, view.ended_ts or view.now)


def _throughput(view: RunView) -> Tuple[str, Dict[int, List[Tuple[float, float]]]]:
    """(what is measured, {attempt index: [(ts, value)]}): img/s when the child reports it, else the counter's rate
    (steps, else batches within an epoch: :func:`trainbox.view.counter.throughput`)."""
    grouped = view.samples_by_attempt()
    reported = any(isinstance(s.get("imgs_per_s"), (int, float)) for s in view.samples)
    series: Dict[int, List[Tuple[float, float]]] = {}
    for index, samples in grouped.items():
        if reported:
            # A beat keeps the fields it left out: img/s is this epoch's in train and save, a stale one elsewhere.
            points = [(s["ts"], s["imgs_per_s"]) for s in samples if s.get("phase") in ("train", "save") and s.get("imgs_per_s")]
        else:
            points = counter.throughput(samples)
        if points:
            series[index] = [(float(t), float(v)) for t, v in points]
    return ("images/s" if reported else "batches/s"), series


def timeline_chart(view: RunView) -> str:
    """Part 1: throughput against time, every attempt, stalls, restarts, profile changes and checkpoints marked."""
    return _png(timeline_figure(view))


def timeline_figure(view: RunView) -> Figure:
    """Part 1's figure (see :func:`timeline_chart`)."""
    figure = _figure()
    axes = figure.add_subplot()
    measured, series = _throughput(view)
    when = _time_axis_of(view)
    for index, points in sorted(series.items()):
        label = view.attempts[index].label if index < len(view.attempts) else None
        axes.plot(
            [when.x(t) for t, _ in points], [v for _, v in points], marker=".", color=COLORS[index % len(COLORS)], label=label
        )
    for n, stall in enumerate(view.stalls):
        axes.axvspan(when.x(stall.last_progress_ts), when.x(stall.killed_ts), color=STALL_COLOR, alpha=0.18, lw=0)
        axes.axvline(when.x(stall.detected_ts), color=STALL_COLOR, lw=1.5, label="stall (silence shaded)" if n == 0 else None)
    for n, period in enumerate(view.slow_periods):
        label = "slow (below its own pace)" if n == 0 else None
        axes.axvspan(
            when.x(period.since_ts), when.x(period.ended_ts or view.now), color=SLOW_COLOR, alpha=0.15, lw=0, label=label
        )
    for n, restarted in enumerate(view.attempts[1:]):
        axes.axvline(when.x(restarted.started_ts), color=RESTART_COLOR, ls="--", lw=1, label="restart" if n == 0 else None)
    for change in view.profile_changes:
        axes.annotate(
            f"profile {change.get('previous_profile')} → {change.get('profile')}",
            (when.x(float(change["ts"])), 1.0),
            xycoords=axes.get_xaxis_transform(),  # x: a time, y: the top of the axes
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=8,
            color=RESTART_COLOR,
        )
    saves = [when.x(float(s["ts"])) for s in view.samples if s.get("phase") == "save"]
    mtime = view.snapshot.checkpoint_mtime
    saves += [when.x(mtime)] if mtime else []
    if saves:
        axes.plot(saves, [0] * len(saves), ls="", marker="^", ms=9, color=CHECKPOINT_COLOR, label="checkpoint", clip_on=False)
    _finish_timeline(axes, when, measured, bool(series))
    return figure


def _finish_timeline(axes: Any, when: TimeAxis, measured: str, has_samples: bool) -> None:
    """Labels, limits, grid and legend of part 1."""
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(nbins=10, steps=[1, 2, 5, 10]))  # whole, round numbers of the unit
    axes.set_xlabel(when.label)
    axes.set_ylabel(measured)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    if not has_samples:
        axes.text(0.5, 0.5, "no progress samples (progress.jsonl) in this run", transform=axes.transAxes, ha="center")
    if axes.get_legend_handles_labels()[0]:  # nothing labelled in a run without samples: no (warning about an) empty legend
        axes.legend(loc="lower left", bbox_to_anchor=(0, 1.01), fontsize=8, ncol=6, frameon=False)


def output_loss_chart(view: RunView) -> Optional[str]:
    """Part 2 without results.csv: the training loss the output showed (a bar's ``loss=`` postfix, a log's ``loss``
    field: progress.jsonl's samples) over the run's time, one line per attempt; None when it showed none."""
    by_attempt = {
        index: [(s["ts"], s["loss"]) for s in samples if isinstance(s.get("loss"), (int, float))]
        for index, samples in view.samples_by_attempt().items()
    }
    if not any(by_attempt.values()):
        return None
    when = _time_axis_of(view)
    figure = _figure()
    axes = figure.subplots()
    for index, points in sorted(by_attempt.items()):
        if points:
            xs, ys = zip(*points)
            axes.plot([when.x(x) for x in xs], ys, marker=".", color=COLORS[index % len(COLORS)], label=f"attempt {index}")
    axes.set_title("loss (read from the output)")
    axes.set_xlabel(when.label)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    return _png(figure)


def curves_chart(view: RunView) -> Optional[str]:
    """Part 2: loss and mAP by epoch from results.csv (one row per epoch across attempts); without it, the loss the
    output showed (:func:`output_loss_chart`); None without either."""
    if not view.results:
        return output_loss_chart(view)
    figure = _figure()
    losses, metrics = figure.subplots(1, 2)
    epochs = [row["epoch"] for row in view.results]
    columns = [key for key in view.results[-1] if key.startswith(LOSS_PREFIXES) and "loss" in key]
    for n, key in enumerate(columns):
        losses.plot(epochs, [row.get(key) for row in view.results], marker=".", color=COLORS[n % len(COLORS)], label=key)
    for n, key in enumerate(k for k in view.results[-1] if k.startswith(METRIC_PREFIX)):
        metrics.plot(epochs, [row.get(key) for row in view.results], marker="o", color=COLORS[n % len(COLORS)], label=key)
    from matplotlib.ticker import MaxNLocator

    for axes, title in ((losses, "loss"), (metrics, "mAP")):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        for n, epoch in enumerate(_resumed_epochs(view)):
            axes.axvline(epoch - 0.5, color=RESTART_COLOR, ls="--", lw=1, label="resumed here" if n == 0 else None)
        axes.set_title(title)
        axes.set_xlabel("epoch")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    return _png(figure)


def _resumed_epochs(view: RunView) -> List[int]:
    """The first epoch each attempt after the first trained (from its progress samples)."""
    first = []
    for index, samples in view.samples_by_attempt().items():
        epochs = [s["epoch"] for s in samples if isinstance(s.get("epoch"), int) and s["epoch"] > 0]
        if index > 0 and epochs:
            first.append(min(epochs))
    return sorted(set(first))


def phase_silences(view: RunView) -> Dict[str, Dict[str, Any]]:
    """Per phase: the silences seen (each sample's longest), the budgets in force, and the stalls' silences."""
    phases: Dict[str, Dict[str, Any]] = {}

    def entry(phase: str) -> Dict[str, Any]:
        return phases.setdefault(phase, {"seen": [], "budgets": [], "stalls": []})

    for s in view.samples:
        for phase, seen in s.get("silences", {}).items():
            if not phase.strip():
                continue  # a silence of no phase (an unlabelled bar): no row without a name
            entry(phase)["seen"].append(seen["s"])
            entry(phase)["budgets"].append((seen.get("budget", "?"), seen.get("budget_s", 0.0)))
    for stall in view.stalls:
        # Before the first beat the budget is startup's (trainbox.supervise.stalls.budgets) and the phase is none yet.
        phase = STARTUP_PHASE if stall.budget == STARTUP_PHASE else stall.phase or "?"
        entry(phase)["stalls"].append(stall.silent_s)
        entry(phase)["budgets"].append((stall.budget, stall.budget_s))
    return phases


def silences_chart(view: RunView) -> Optional[str]:
    """Part 3: per phase, every silence seen (dots), the budgets in force (bars) and the stalls (crosses), log seconds."""
    phases = phase_silences(view)
    if not phases:
        return None
    from matplotlib.ticker import FuncFormatter

    figure = _figure(max(2.0, 0.55 * len(phases) + 1.2))
    axes = figure.add_subplot()
    names = sorted(phases)
    for row, phase in enumerate(names):
        data = phases[phase]
        seen = [max(s, 1e-3) for s in data["seen"]]  # a log axis has no 0: a millisecond stands for "at once"
        # Spread the dots of a row over a quarter of its height (golden-ratio steps: even, and the same every time).
        jitter = [row + 0.25 * ((n * 0.618) % 1 - 0.5) for n in range(len(seen))]
        axes.plot(seen, jitter, ls="", marker="o", ms=4, alpha=0.5, color=COLORS[0], label="silence seen" if row == 0 else None)
        budgets = sorted({seconds for _, seconds in data["budgets"] if seconds > 0})
        axes.plot(budgets, [row] * len(budgets), ls="", marker="|", ms=22, mew=2.5, color="black")
        axes.plot(data["stalls"], [row] * len(data["stalls"]), ls="", marker="X", ms=10, color=STALL_COLOR)
    axes.plot([], [], ls="", marker="|", ms=12, mew=2.5, color="black", label="budget in force")
    axes.plot([], [], ls="", marker="X", ms=8, color=STALL_COLOR, label="stall (budget ran out)")
    axes.set_yticks(range(len(names)), names)
    axes.set_ylim(-0.6, len(names) - 0.4)
    axes.set_xscale("log")
    # Plain numbers (0.1, 1, 10) rather than matplotlib's default 10^n, which goes through its math-text parser.
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_xlabel("seconds without progress (log scale)")
    axes.grid(alpha=0.3, axis="x")
    axes.legend(loc="lower right", fontsize=8)
    return _png(figure)


# -- the page ----------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(header: Optional[Sequence[str]], rows: Iterable[Sequence[Any]], raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (then the caller escaped them)."""
    cell = (lambda v: str(v)) if raw else _e
    head = "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table>{head}<tbody>{body}</tbody></table>"


def _clock(ts: Optional[float]) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "—"


def _link(target: Path, base: Path, text: str) -> str:
    return f'<a href="{_e(os.path.relpath(target, base))}">{_e(text)}</a>'


def incident_rows(view: RunView, base: Path) -> List[List[str]]:
    """Part 4's table rows (already escaped): one per stall."""
    rows = []
    for n, stall in enumerate(view.stalls, 1):
        loss = view.loss(stall)
        lost = (f"{amount(loss.steps, loss.unit)} done again, " if loss.steps is not None else "") + duration(loss.seconds)
        lost += "" if loss.regained else " (never back at that place: the silence and the restart only)"
        rows.append(
            [
                str(n),
                _e(stall.attempt),
                _e(_clock(stall.detected_ts)),
                _e(stall.phase or "—"),
                _e(f"{stall.budget} {stall.budget_s:g} s"),
                _e(f"{stall.silent_s:.1f} s"),
                _e(f"{stall.incident_s + stall.kill_s:.2f} s (report {stall.incident_s:.2f} s, kill {stall.kill_s:.2f} s)"),
                _e(lost),
                _e(stall.cause or ""),
                f"<code>{_e(stall.evidence)}</code>" if stall.evidence else "",
                _files(view, stall, base),
            ]
        )
    return rows


#: Stack files linked per incident (a tree has tens of processes; a folder of thousands is not a report's).
MAX_STACK_LINKS = 200


def _files(view: RunView, stall: Stall, base: Path) -> str:
    if stall.incident is None:
        return "not written"
    report = IncidentDir(stall.incident)
    files = view.run.files
    links = [_link(stall.incident, base, stall.incident.name + "/")]
    links += [
        _link(path, base, path.name)
        for path in (report.summary, report.output_tail, report.processes_txt)
        if files.stat(path).value is not None
    ]
    stacks = [n for n in files.list_dir(report.stack.directory, MAX_STACK_LINKS).value or [] if report.stack.number_of(n)]
    links += [_link(report.stack.directory / name, base, f"stacks/{name}") for name in stacks]
    return "<br>".join(links)


def slow_rows(view: RunView) -> List[List[str]]:
    """The slow periods' table rows (already escaped): when, how slow, why, and what was done."""
    rows = []
    for n, period in enumerate(view.slow_periods, 1):
        ended = _clock(period.ended_ts) if period.ended_ts is not None else "going on"
        ended += "" if period.recovered or period.ended_ts is None else " (the run ended)"
        ratio = f"{period.ratio:.2f}× of its pace" if period.ratio is not None else "—"
        rows.append(
            [
                str(n),
                _e(period.attempt),
                _e(_clock(period.since_ts)),
                _e(_clock(period.flagged_ts)),
                _e(ended),
                _e(duration(period.seconds(view.ended_ts or view.now))),
                _e(ratio),
                _e(period.phase or "—"),
                _e(period.suspect),
                "<br>".join(f"<code>{_e(line)}</code>" for line in period.evidence),
                _e(period.action),
            ]
        )
    return rows


#: Past this many times the longest silence, a budget's room is only "more than" it (the figure says nothing more).
ROOM_SHOWN = 100


def _room(budget_s: float, longest_s: float) -> str:
    """How many of the longest silence seen the budget holds (``3.2×``, ``more than 100×``); ``—`` without both."""
    if longest_s <= 0 or budget_s <= 0:
        return "—"
    room = budget_s / longest_s
    return f"{room:.1f}×" if room < ROOM_SHOWN else f"more than {ROOM_SHOWN}×"


def summary_rows(view: RunView, deadline: Optional[datetime.datetime]) -> List[Tuple[str, str]]:
    """Part 5: (what, value) pairs."""
    started, ended = view.started_ts, view.ended_ts
    total = ((ended or view.now) - started) if started else None
    lost = sum(view.loss(stall).seconds for stall in view.stalls)
    exits = view.of("exit")
    last = view.results[-1] if view.results else {}
    epochs = view.snapshot.epochs
    rows = [
        ("run directory", str(view.run.root)),
        ("state", str(view.state.get("state", "unknown")) + (f", exit status {exits[-1].get('code')}" if exits else "")),
        ("started / ended", f"{_clock(started)} / {_clock(ended) if ended else 'still running'}"),
        ("total time", duration(total) if total is not None else "—"),
        ("time lost to stalls", f"{duration(lost)}" + (f" ({100 * lost / total:.0f} %)" if total else "")),
        ("time spent slow", _slow_summary(view, total)),
        ("attempts", str(len(view.attempts))),
        ("restarts, stalls, crashes", ", ".join(str(view.count(k)) for k in ("restart", "stall", "crash"))),
        ("newest checkpoint", checkpoint_line(view.snapshot, view.now)),
        ("resumed", resumed_line(view.state) or "no restart resumed from a checkpoint"),
    ]
    # Rows that would only say "none" for a run without profiles, a ladder or Ultralytics' results are left out.
    ladder = ladder_line(view.events)
    rows += [("final profile", view.final_profile)] if view.final_profile else []
    rows += [("last ladder decision", ladder)] if ladder else []
    rows += [("epochs in results.csv", f"{len(view.results)}" + (f" of {epochs}" if epochs else ""))] if view.results else []
    for key in sorted(k for k in last if k.startswith(METRIC_PREFIX)):
        rows.append((f"last {key}", f"{last[key]:.4f}"))
    verdict = view.deadline_verdict(deadline) if deadline else "no deadline given (trainbox report --deadline HH:MM)"
    rows.append(("deadline", verdict))
    rows += [("left out (unusable)", note) for note in view.notes]
    return rows


def _slow_summary(view: RunView, total: Optional[float]) -> str:
    """``4m10s (12 %) in 2 period(s)``: the time the run spent slower than its own pace."""
    if not view.slow_periods:
        return "never slower than its own pace"
    spent = view.slow_s()
    share = f" ({100 * spent / total:.0f} %)" if total else ""
    return f"{duration(spent)}{share} in {len(view.slow_periods)} period(s)"


def attempt_rows(view: RunView) -> List[Tuple[str, str, str, str, str, str]]:
    """One row per attempt: its profile, when it ran and what ended it."""
    rows = []
    for attempt in view.attempts:
        ended = attempt.ended_ts
        lasted = duration((ended or view.now) - attempt.started_ts)
        rows.append(
            (str(attempt.number), attempt.profile or "—", _clock(attempt.started_ts), _clock(ended), lasted, attempt.ended_by)
        )
    return rows


def _event_detail(event: Dict[str, Any]) -> str:
    keys = EVENT_DETAILS.get(str(event.get("event")), ())
    return ", ".join(f"{k} {event[k]}" for k in keys if event.get(k) is not None)


#: The fields the history table shows for each event (every event in trainbox.rundir.events.EVENTS has a row here).
EVENT_DETAILS: Dict[str, Tuple[str, ...]] = {
    "start": ("profile", "pid"),
    "device": ("description", "amp", "workers", "pin_memory"),
    "stall": ("phase", "budget", "budget_s", "silent_s", "cause"),
    "extend": ("cause", "budget_s"),
    "crash": ("code", "beats"),
    "restart": ("after", "delay_s", "profile"),
    "probe": ("previous_profile", "profile", "reason"),
    "exit": ("code", "reason"),
    "give_up": ("reason",),
    "supervisor_hung": ("age_s", "incident"),
    "notify_failed": ("kind", "line"),
    "slow": ("ratio", "phase", "suspect", "action"),
    "recovered": ("reason", "ratio", "slow_s"),
    "redone": ("redone", "unit", "from"),
}


CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:2em auto;max-width:1060px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;
vertical-align:top}th{background:#f4f4f4}img{max-width:100%}code{font-size:.9em;word-break:break-word}.note{color:#666}
"""


def render(view: RunView, out: Path, deadline: Optional[datetime.datetime] = None) -> str:
    """The whole page; links are relative to ``out``'s folder."""
    base = out.resolve().parent
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainbox report: {_e(view.run.root.name)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>trainbox report: {_e(view.run.root.resolve().name)}</h1>",
        f"<p class='note'>Written {_clock(view.now)} from {_e(view.run.root)}.</p>",
        "<h2 id='summary'>Summary</h2>",
        _table(None, summary_rows(view, deadline)),
        _table(("attempt", "profile", "started", "ended", "lasted", "ended by"), attempt_rows(view)),
        "<h2 id='throughput'>Throughput over the run</h2>",
        f"<img alt='throughput against wall time' src='data:image/png;base64,{timeline_chart(view)}'>",
    ]
    slow_periods = slow_rows(view)
    if slow_periods:
        parts.append("<h3 id='slow'>Slower than its own pace</h3>")
        header = ("#", "attempt", "began", "flagged", "ended", "lasted", "pace", "phase", "suspect", "evidence", "action")
        parts.append(_table(header, slow_periods, raw=True))
    curves = curves_chart(view)
    parts.append("<h2 id='curves'>Loss and mAP</h2>")
    parts.append(f"<img alt='loss and mAP' src='data:image/png;base64,{curves}'>" if curves else "<p>No results.</p>")
    parts.append("<h2 id='silences'>Silences against their budgets, per phase</h2>")
    silences = silences_chart(view)
    if silences:
        parts.append(f"<img alt='silences per phase' src='data:image/png;base64,{silences}'>")
        rows = []
        for phase, data in sorted(phase_silences(view).items()):
            name, seconds = data["budgets"][-1] if data["budgets"] else ("—", 0.0)
            longest = max(data["seen"], default=0.0)
            headroom = _room(seconds, longest)
            rows.append((phase, len(data["seen"]), f"{longest:.2f} s", f"{name} {seconds:g} s", headroom, len(data["stalls"])))
        header = ("phase", "silences seen", "longest", "budget in force (last)", "budget, in longest silences", "stalls")
        parts.append(_table(header, rows))
    else:
        parts.append("<p>No progress samples.</p>")
    parts.append("<h2 id='incidents'>Incidents</h2>")
    incidents = incident_rows(view, base)
    header = ("#", "attempt", "noticed", "phase", "budget", "silent", "time to kill", "lost work", "cause", "evidence", "files")
    parts.append(_table(header, incidents, raw=True) if incidents else "<p>No stalls.</p>")
    parts.append("<h2 id='history'>History (events.jsonl)</h2>")
    events = [(_clock(e.get("ts")), e.get("attempt"), e.get("event"), _event_detail(e)) for e in view.events]
    parts.append(_table(("time", "attempt", "event", "details"), events))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(run_dir: Path, out: Optional[Path] = None, deadline: Optional[datetime.datetime] = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``) atomically; return its path."""
    _import_matplotlib()
    view = read_view(run_dir)
    run = RunDir(Path(run_dir))
    target = Path(out) if out is not None else run.report
    page = render(view, target, deadline).encode("utf-8", "replace")
    if out is not None:
        with atomic_writer(target) as handle:  # not the run directory: the user's own --out path
            handle.write(page)
        return target
    refused = run.files.replace(target, page)
    if refused is not None:
        raise UserError(f"{refused.line(target)}: no report written there; give another place with --out")
    return target


def refresh(run: RunDir, rewrite: str) -> None:
    """The supervisor's call as the run ends: write the report, and say where it is, after the run's outcome: the
    run's last line names its report and ``rewrite``, the command that writes it again.

    A failure is one line and changes nothing else.
    """
    try:
        _import_matplotlib()
    except ImportError:
        say("no report written: matplotlib is not installed (`pip install matplotlib`; the host and yolo extras have it)")
        return
    try:
        written = write(run.root)
    except Exception as exc:  # best-effort by design: a report must never change how the run ended
        say(f"no report written: {type(exc).__name__}: {exc}")
        return
    say(f"report: {written} (written again by: {rewrite})")
