"""A job of several nodes at a glance: every node in one table, and the rank the others wait for.

``trainbox status --run-dir JOB`` on a job's directory (:class:`trainbox.rundir.layout.JobDir`: ``job.json`` and a
run directory per node) prints the job (its scheduler id, how often it was requeued), then one row per node: its
state, its attempts, its ranks, its place, how long it has been silent and its stalls, each read from that node's
own run directory exactly as ``status`` reads one run (:func:`trainbox.view.status.snapshot`). Below the table, the
newest job-level incident (:mod:`trainbox.job.incident`): which rank on which node went silent first, in its own
words. ``trainbox report JOB`` writes the same table as a page that links to each node's report.

A node whose run directory holds nothing yet is a row that says so; every file is untrusted input, read as status
reads it, so nothing a node wrote makes this raise.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from trainbox.atomic import atomic_writer
from trainbox.errors import UserError
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.rundir.records import rank_files
from trainbox.view import status

#: job.json and incident.json are a few KiB; more is not ours.
MAX_JOB_BYTES = 1 << 20
#: The table's columns, in order.
COLUMNS = ("node", "state", "attempts", "ranks", "place", "silent", "stalls")


def is_job(directory: Path) -> bool:
    """Whether ``directory`` is a job's directory (it holds ``job.json``)."""
    job = JobDir(directory)
    return job.files.stat(job.job).value is not None


@dataclass(frozen=True)
class NodeRow:
    """One node as its own run directory shows it."""

    node: int
    state: str
    attempts: int
    ranks: str
    place: str
    silent: str
    stalls: int

    def cells(self) -> List[str]:
        return [str(self.node), self.state, str(self.attempts), self.ranks, self.place, self.silent, str(self.stalls)]


def _text(value: Any) -> str:
    """A value from a node's files as one printable line (untrusted: no control characters)."""
    return "".join(c if c.isprintable() else "?" for c in str(value))[:80]


def _place(progress: status.Progress) -> str:
    """Where the node is, as ``status`` says it (its bar's place, else its beat's), or ``-`` before any progress."""
    if progress.bar is not None:
        return progress.bar.position()
    beat = progress.beat
    return status.place_of(beat, progress) if any(key in beat for key in ("epoch", "batch", "step")) else "-"


def node_row(job: JobDir, node: int, now: float) -> NodeRow:
    """Node ``node``'s row, from its run directory."""
    run = RunDir(job.node(node))
    progress = status.snapshot(run)
    state = _text(progress.state.get("state", "not started"))
    finished = progress.finished
    if finished is not None:
        state += f" (exit {_text(finished.get('code', '?'))})"
    ranks = rank_files(run)
    silent = progress.state.get("silent_s")
    return NodeRow(
        node=node,
        state=state,
        attempts=sum(1 for record in progress.events if record.get("event") == "start"),
        ranks=",".join(map(str, sorted(ranks))) or "-",
        place=_text(_place(progress)),
        silent="-" if finished is not None or not isinstance(silent, (int, float)) else status.duration(float(silent)),
        stalls=progress.count("stall"),
    )


def header(job: JobDir) -> str:
    """``job 4242: 2 nodes (n[1-2]), requeued 1 time(s)``, from job.json (what it lacks is left out)."""
    found = job.files.read_object(job.job, MAX_JOB_BYTES).value or {}
    words = [f"job {_text(found.get('job_id', '?'))}:"]
    if isinstance(found.get("nnodes"), int):
        words.append(f"{found['nnodes']} nodes")
    if found.get("nodelist"):
        words.append(f"({_text(found['nodelist'])})")
    if isinstance(found.get("restart_count"), int) and found["restart_count"]:
        words.append(f"requeued {found['restart_count']} time(s)")
    return " ".join(words)


def incident_line(job: JobDir) -> Optional[str]:
    """The newest job-level incident in one line, or None when there was none."""
    found = job.files.read_object(job.incident, MAX_JOB_BYTES).value
    if not found or not isinstance(found.get("why"), str):
        return None
    when = found.get("ts")
    at = time.strftime("%H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) and 0 < when < 1e11 else "?"
    return f"incident  {_text(found['why'])} (at {at}; {job.incident})"


def table(rows: List[List[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def render(directory: Path, now: Optional[float] = None) -> List[str]:
    """The status lines of a job: its header, a row per node, its newest incident."""
    job = JobDir(directory)
    now = time.time() if now is None else now
    rows = [node_row(job, node, now) for node in job.nodes()]
    lines = [f"job       {directory}", header(job)]
    lines += table([list(COLUMNS)] + [row.cells() for row in rows]) if rows else ["no node has started yet"]
    found = incident_line(job)
    return lines + ([found] if found else [])


def html_page(directory: Path, now: Optional[float] = None) -> str:
    """The job as one page: the same table, each node linking to its own report."""
    job = JobDir(directory)
    now = time.time() if now is None else now
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = []
    for row in (node_row(job, node, now) for node in job.nodes()):
        cells = [html.escape(c) for c in row.cells()]
        report = RunDir(job.node(row.node)).report.relative_to(directory)
        cells[0] = f'<a href="{html.escape(str(report))}">{cells[0]}</a>'
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    found = incident_line(job)
    return (
        f"<!doctype html><meta charset=utf-8><title>{html.escape(header(job))}</title>"
        f"<h1>{html.escape(header(job))}</h1><table><tr>{head}</tr>{''.join(body)}</table>"
        + (f"<p>{html.escape(found)}</p>" if found else "")
    )


def write(directory: Path, out: Optional[Path] = None) -> Path:
    """Write the job's page to ``out`` (default ``JOB/report.html``) atomically; return its path."""
    job = JobDir(directory)
    page = html_page(directory).encode("utf-8", "replace")
    if out is not None:
        with atomic_writer(out) as handle:  # not the run directory: the user's own --out path
            handle.write(page)
        return Path(out)
    refused = job.files.replace(job.report, page)
    if refused is not None:
        raise UserError(f"{refused.line(job.report)}: no report written there; give another place with --out")
    return job.report
