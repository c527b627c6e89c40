"""``trainbox status --watch``: a live view of a run, from its run directory alone.

About once a second (``REFRESH_S``) the run directory is read again into a
:class:`trainbox.view.runview.RunView`: nothing talks to the supervisor or to
Docker, so the view works from another terminal, against a run in a
container (its ``runs/<name>`` on the host), or over ssh. On a terminal it is a
rich live display: epoch and batch bars, img/s, ETA and the deadline verdict,
the current phase's silence against its budget, a slowdown under way (how much of
its own pace the run keeps, since when, and the suspect), attempts and stalls with
the last stall's cause and one line of evidence, and the checkpoint's age.
Without a terminal (a pipe, a log file) it prints one plain line whenever what
it says changes, and at least every ``PLAIN_EVERY_S`` seconds.

It runs until Ctrl-C (or SIGTERM, SIGHUP), which is how a watch ends: exit 0.
The signals come through :mod:`trainbox.interrupt`, so a watch started where
SIGINT is ignored (a background job of a script) still stops on ``kill -INT``.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional

from trainbox import interrupt
from trainbox.errors import UserError
from trainbox.rundir.progress import STARTUP_PHASE
from trainbox.view import runview
from trainbox.view.runview import RunView
from trainbox.view.status import checkpoint_line, eta_line

if TYPE_CHECKING:
    from rich.console import RenderableType

#: Seconds between two reads of the run directory.
REFRESH_S = 1.0
#: Without a terminal, a line at least this often even when nothing changed (the silence grows meanwhile).
PLAIN_EVERY_S = 5.0
#: The events counted in the view, and how they are named.
COUNTED = (("restart", "restarts"), ("stall", "stalls"), ("crash", "crashes"))
#: Share of its budget a silence may reach before it is shown as a warning (then as an alarm at 1.0).
WARN_AT = 0.5


# -- what the view says, as text (shared by both modes) ---------------------------
def position(view: RunView) -> str:
    """``epoch 2/4, batch 3/4``: the bars' numbers (``?`` where unknown)."""
    beat, snapshot = view.beat, view.snapshot
    if not beat:
        return "no heartbeat yet"
    if snapshot.bar is not None:
        return snapshot.bar.position()
    per_epoch = snapshot.batches_per_epoch
    epochs = f"/{snapshot.epochs}" if snapshot.epochs else ""
    batches = f"/{per_epoch:.0f}" if per_epoch else ""
    text = f"epoch {beat.get('epoch', '?')}{epochs}, batch {beat.get('batch', '?')}{batches}"
    return text if "epoch" in beat or "batch" in beat else f"step {beat.get('step', '?')}"


def speed(view: RunView, deadline: Optional[datetime.datetime]) -> str:
    rate = view.beat.get("imgs_per_s")
    until = "finished" if view.finished else "ETA " + eta_line(view.snapshot)
    bar = view.snapshot.bar
    told = f"{rate} img/s" if rate else bar.speed() if bar is not None and not view.finished else "img/s unknown"
    text = told + ", " + until
    return text + (f", deadline {view.deadline_verdict(deadline)}" if deadline else "")


def phase(view: RunView) -> str:
    """``phase train: silent 0.4 s of 10 s (stall)``, or the supervisor's state when no budget runs."""
    state = str(view.state.get("state", "unknown"))
    silence = view.silence()
    if silence is None:
        return f"state {state}"
    # The phase of the beat the supervisor judged (state.json's, written with the budget), not the newest one.
    judged = view.state.get("heartbeat") if silence["budget"] != STARTUP_PHASE else {"phase": STARTUP_PHASE}
    name = judged.get("phase", "?") if isinstance(judged, dict) else "?"
    return f"phase {name}: silent {silence['s']:.1f} s of {silence['budget_s']:g} s ({silence['budget']}), state {state}"


def attempts(view: RunView) -> str:
    counts = ", ".join(f"{plural} {view.count(kind)}" for kind, plural in COUNTED)
    profile = f", profile {view.final_profile}" if view.final_profile else ""
    return f"attempt {len(view.attempts) - 1 if view.attempts else 0}{profile}: {counts}"


def last_stall(view: RunView) -> Optional[str]:
    """The last stall in one line: where, how long, and its cause and evidence when recorded."""
    if not view.stalls:
        return None
    stall = view.stalls[-1]
    text = f"last stall: attempt {stall.attempt}, phase {stall.phase or '?'}, "
    text += f"silent {stall.silent_s:.0f} s > {stall.budget} {stall.budget_s:g} s"
    text += f"; cause: {stall.cause}" if stall.cause else ""
    return text + (f"; evidence: {stall.evidence}" if stall.evidence else "")


def slow(view: RunView) -> Optional[str]:
    """``slow: 0.41x of this run's pace since 14:02 (suspect: contention)`` while the run is slower than its pace."""
    going = view.slow_now()
    return going.line() if going is not None else None


def checkpoint(view: RunView) -> str:
    return f"checkpoint: {checkpoint_line(view.snapshot, view.now)}"


def plain_line(view: RunView, deadline: Optional[datetime.datetime]) -> str:
    parts = [position(view), speed(view, deadline), slow(view), phase(view), attempts(view), last_stall(view), checkpoint(view)]
    return " | ".join(p for p in parts if p)


# -- the rich frame -----------------------------------------------------------------
def frame(view: RunView, deadline: Optional[datetime.datetime], health: Optional[str] = None) -> RenderableType:
    """One frame of the live view."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    beat, snapshot = view.beat, view.snapshot
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(width=40)
    grid.add_column()
    epoch, batch, per_epoch = beat.get("epoch"), beat.get("batch"), snapshot.batches_per_epoch
    grid.add_row(
        "epoch",
        ProgressBar(total=snapshot.epochs, completed=max(0, (epoch or 1) - 1)),
        f"{epoch or '?'}/{snapshot.epochs or '?'}",
    )
    bar = snapshot.bar  # a child that does not beat: the bar its output showed
    if bar is not None:
        grid.add_row(bar.unit, ProgressBar(total=bar.total, completed=bar.count), position(view))
    else:
        grid.add_row("batch", ProgressBar(total=per_epoch, completed=batch or 0), position(view))
    silence = view.silence()
    if silence is not None:
        ratio = silence["s"] / silence["budget_s"] if silence["budget_s"] else 0.0
        style = "red" if ratio >= 1 else "yellow" if ratio >= WARN_AT else "green"
        bar = ProgressBar(total=silence["budget_s"] or None, completed=silence["s"], complete_style=style, finished_style="red")
        grid.add_row("silence", bar, phase(view))
    else:
        grid.add_row("state", "", phase(view))
    lines: List[RenderableType] = [
        Text(f"trainbox · {view.run.root}" + (f" · {health}" if health else ""), style="bold"),
        grid,
        Text(speed(view, deadline)),
    ]
    pace = slow(view)
    if pace:
        lines.append(Text(pace, style="yellow"))
    lines.append(Text(attempts(view)))
    stall = last_stall(view)
    if stall:
        lines.append(Text(stall, style="red"))
    lines.append(Text(checkpoint(view)))
    lines.append(Text("Ctrl-C to leave (the run goes on)", style="dim"))
    return Group(*lines)


# -- the loops ---------------------------------------------------------------------------
def _live(run_dir: Path, deadline: Optional[datetime.datetime], health: Optional[str]) -> None:
    from rich.console import Console
    from rich.live import Live

    # No automatic highlighting: a number in the middle of "epoch 2/8, batch 3" stays plain text (greppable, calm).
    with Live(frame(runview.read(run_dir), deadline, health), console=Console(highlight=False), auto_refresh=False) as live:
        while True:
            time.sleep(REFRESH_S)
            live.update(frame(runview.read(run_dir), deadline, health), refresh=True)


def _plain(run_dir: Path, deadline: Optional[datetime.datetime], write: Callable[[str], None]) -> None:
    said, said_at = None, 0.0
    while True:
        view = runview.read(run_dir)
        # What changed, leaving out the numbers that grow by themselves (the silence, the checkpoint's age).
        news = " | ".join(p for p in (position(view), speed(view, deadline), slow(view), attempts(view), last_stall(view)) if p)
        if news != said or time.monotonic() - said_at >= PLAIN_EVERY_S:
            write(plain_line(view, deadline))
            said, said_at = news, time.monotonic()
        time.sleep(REFRESH_S)


def _print_line(line: str) -> None:
    print(line, flush=True)


def main(run_dir: Path, deadline: Optional[datetime.datetime] = None, health: Optional[str] = None) -> int:
    """Watch ``run_dir`` until a stop signal; 0. A missing directory or rich is a UserError (one line)."""
    runview.read(run_dir)  # a missing run directory is one line before anything is drawn
    terminal = sys.stdout.isatty()
    if terminal:
        try:
            import rich  # noqa: F401
        except ImportError:
            raise UserError(
                "status --watch on a terminal needs rich: pip install 'trainbox[host]' (or pip install rich)"
            ) from None
    try:
        with interrupt.stop_requests():
            if terminal:
                _live(run_dir, deadline, health)
            else:
                _plain(run_dir, deadline, _print_line)
    except interrupt.StopRequested:
        return 0  # Ctrl-C is how a watch ends; the run goes on
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to show, and nothing went wrong
        # The exit's flush must not fail again; not the run directory: /dev/null.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - not the run directory: /dev/null
    return 0
