"""The lines a supervised run ends with: what the person reads last, and the history of attempts in it.

Pure functions of what the supervisor counted (:class:`~trainbox.supervise.policy.Counters`, the pace's summary,
the outcomes): the supervisor decides *how* the run ends (:meth:`~trainbox.supervise.supervisor.Supervisor._end`),
this module says it. Each names where to look next (the incident reports, the history) so that the last line
of a run is enough to start from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from trainbox.errors import ExitCode
from trainbox.interrupt import signal_name
from trainbox.rundir.layout import RunDir
from trainbox.supervise.output.progress import HOW_TO_GIVE_PROGRESS
from trainbox.supervise.output.source import Source
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import NO_PROGRESS_READ, REPEATED_CRASH, Counters, Outcome, OutcomeKind, position


def slow_part(slow: Mapping[str, Any]) -> str:
    """``, slow for 12.5 min in 2 episode(s)`` when the run was ever slower than its own pace, else ''."""
    if not slow.get("slow_episodes"):
        return ""
    return f", slow for {slow['slow_s'] / 60:.1f} min in {slow['slow_episodes']} episode(s)"


def completed_line(attempts: int, counts: Counters, slow: Mapping[str, Any]) -> str:
    return f"completed after {attempts} attempt(s) ({counts.stalls} stall(s), {counts.crashes} crash(es){slow_part(slow)})"


def stopped_line(
    signum: int, attempt: int, beat: Optional[Mapping[str, Any]], run_dir: RunDir, resume: str, grace_s: Optional[float]
) -> str:
    """What a stop signal stopped, where the run is, and the command that goes on with it (one line).

    ``grace_s``: the training tree of ``attempt`` is being ended with that much time to exit; None when no tree
    was running (the stop came while waiting to restart).
    """
    if grace_s is not None:
        what = f"stopping the training tree of attempt {attempt} (up to {grace_s:.0f} s to exit)"
    else:
        what = f"stopped before attempt {attempt} started"
    place = position(beat)
    where = f"at {place}" if place else "before any progress"
    go_on = f"; to go on with it: {resume}" if resume else ""
    return f"{signal_name(signum)}: {what}; the run in {run_dir.root} is {where}{go_on}"


def gave_up_code(last: Outcome, reason: str) -> ExitCode:
    """The status of a run that gave up after ``last``: :attr:`ExitCode.HUNG` when it was a stall (or a slowdown) that
    came back, which another machine may not have; :attr:`ExitCode.GAVE_UP` for the program's own failure (a crash,
    no progress to read), which follows it anywhere."""
    hang = last.kind in (OutcomeKind.STALLED, OutcomeKind.SLOW) and reason != NO_PROGRESS_READ
    return ExitCode.HUNG if hang else ExitCode.GAVE_UP


def hung_too_often_line(hangs: int, run_dir: RunDir) -> str:
    return (
        f"giving up: the supervisor of this run hung {hangs} times in a row, each time ended by "
        f"`health --act`; its stacks are in {run_dir.incident_dir.directory}/*-supervisor.txt, the history in "
        f"{run_dir.events}. Find out why before running again (the run resumes from its last checkpoint)."
    )


def gave_up_line(
    attempts: int,
    counts: Counters,
    max_restarts: int,
    history: List[str],
    reason: str,
    last: Outcome,
    run_dir: RunDir,
    slow: Mapping[str, Any],
) -> str:
    """Why the run gave up, each attempt in order (:func:`describe`), where to look (only files that are there), how to
    give progress when none was read, and the error of a crash that repeated, quoted last."""
    line = (
        f"giving up after {attempts} attempts and {counts.restarts} restart(s) "
        f"({reason}; --max-restarts {max_restarts}): {counts.stalls} stall(s), "
        f"{counts.crashes} crash(es){slow_part(slow)}. In order: " + "; ".join(history) + ". " + _where_to_look(run_dir)
    )
    if reason.startswith(REPEATED_CRASH):
        log = Path(last.detail.get("log") or "")
        held = f" (in {log})" if log.name and _there(run_dir, log) else ""
        line += f" Both ended with: {last.detail.get('exception')}{held}"
    elif reason == NO_PROGRESS_READ:
        line += (
            " Their output shows they ran, but neither beat nor printed a progress counter trainbox reads, so "
            f"each was stopped by its budget. {HOW_TO_GIVE_PROGRESS}" + last_output(last)
        )
    elif last.detail.get("progress_source") == Source.NONE.value and last.kind is OutcomeKind.STALLED:
        line += f" The last attempt showed no progress at all. {HOW_TO_GIVE_PROGRESS}"
    return line


def _there(run_dir: RunDir, path: Path) -> bool:
    return run_dir.files.stat(path).value is not None


def _where_to_look(run_dir: RunDir) -> str:
    """``Incident reports are in ..., the history in ...``, naming only what the run directory holds."""
    reports = run_dir.incident_dir.directory
    places = [f"incident reports are in {reports}"] if _there(run_dir, reports) else []
    places += [f"the history is in {run_dir.events}"] if _there(run_dir, run_dir.events) else []
    said = ", ".join(places)
    return f"{said[:1].upper()}{said[1:]}." if places else ""


def last_output(outcome: Outcome) -> str:
    """The child's last display lines (a progress bar's last state included), indented under a message."""
    lines = outcome.detail.get("last_output") or ["(no output)"]
    return " The child's last output:\n    " + "\n    ".join(lines)


def misconfigured_line(outcome: Outcome) -> str:
    """What a run that never started is told: not a stall, a configuration error, with the child's last output
    (and how to give progress when it was stopped for showing none)."""
    stalled = outcome.kind is OutcomeKind.STALLED
    return (
        "two attempts in a row ended before their first heartbeat or progress counter: this is a configuration "
        "error, not a stall; fix it and run again." + (f" {HOW_TO_GIVE_PROGRESS}" if stalled else "") + last_output(outcome)
    )


def describe(outcome: Outcome, launch: Launch) -> str:
    """One failed attempt in the give-up message's history."""
    profile = f" with profile {launch.profile}" if launch.profile else ""
    if outcome.kind is OutcomeKind.SLOW:
        first = (outcome.detail.get("evidence") or ["no evidence"])[0]
        return f"slow{profile} for {outcome.detail.get('slow_s', 0):.0f} s ({outcome.detail.get('suspect')}: {first}), restarted"
    if outcome.kind is OutcomeKind.STALLED:
        d: Dict[str, Any] = outcome.detail
        phase = f" in phase {d['phase']!r}" if d.get("phase") else ""
        budget = f"{d['budget']} budget {d['budget_s']:.0f} s, silent {d['silent_s']:.0f} s"
        cause = f"cause {d['cause']}: {(d['evidence'] or ['no evidence'])[0]}; "
        return f"stall{phase}{profile} ({cause}{budget}, report {d['incident'] or 'not written'})"
    exception = outcome.detail.get("exception")
    said = f" ({exception})" if isinstance(exception, str) else ""
    return f"exit status {outcome.code}{profile} after {outcome.beats} beat(s){said}"
