"""Whose run a run directory holds: one command's runs per directory, and which directory a command runs in.

A run directory is one command's: ``supervise -- python train.py`` writes into it, and running the same
command again there resumes it. A second command written into the same directory mixed two runs (``status``
read the first one's checkpoint, the attempt logs held both, the report drew two "attempt 0"), so the
supervisor records the command's name (:func:`trainbox.rundir.layout.command_name`) in ``state.json`` as
``command``, and :func:`check` refuses, before anything in the directory is touched, a directory whose
recorded command is another. A directory from before the name was recorded, or with no readable
``state.json``, holds no known command and is taken as it is.

:func:`choose` is where a command runs when the person named no directory: a new
``runs/<command>-<YYYYmmdd-HHMMSS>`` (:func:`trainbox.rundir.layout.run_name`), ``runs/NAME`` for ``--name``,
or with ``--resume`` the newest run of the same command under ``runs/`` (by the time in its name). A new run's
directory is reserved as it is chosen: made with a ``mkdir`` that fails on a name already there, then ``-2``,
``-3`` ..., so runs of one command started in the same second (a sweep started by a script) each get their own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

from trainbox.errors import UserError
from trainbox.rundir import layout
from trainbox.rundir import state as state_file
from trainbox.rundir.layout import RunDir

#: Names of runs listed under ``runs/`` when choosing one (years of runs of one person).
MAX_RUNS_LISTED = 100_000
#: Runs of one command started within one second that get a name of their own (``-2`` ... ``-N``).
MAX_SAME_SECOND = 10_000


def recorded_command(run: RunDir) -> Optional[str]:
    """The command whose run ``run`` holds, as its supervisor recorded it; None when none is known."""
    state, _ = state_file.read(run.state)
    command = (state or {}).get("command")
    return command if isinstance(command, str) and command else None


def check(run_dir: Path, command: str) -> None:
    """Refuse (a UserError, exit 2) a run directory that holds another command's run; nothing is written."""
    recorded = recorded_command(RunDir(run_dir))
    if recorded is not None and recorded != command:
        raise UserError(
            f"{run_dir} holds a run of `{recorded}`, not of `{command}`: leave out --run-dir for a new run, "
            f"or give another directory (--resume goes on with the newest run of `{command}`)"
        )


def _listing(runs: Path) -> List[str]:
    """The names under ``runs`` (not a run directory: the folder of runs), none when it is not a folder."""
    try:
        with os.scandir(runs) as listed:  # not the run directory: the runs folder, listed
            return [entry.name for _, entry in zip(range(MAX_RUNS_LISTED), listed)]
    except OSError:
        return []


def choose(command: str, name: Optional[str], resume: bool, runs: Path = layout.RUNS) -> Path:
    """The run directory of a command given no ``--run-dir``: ``runs/NAME``, the newest run of ``command`` to
    resume, or a new one (see the module docstring); a UserError for a bad name or nothing to resume."""
    if name is not None:
        if layout.NAME_CHARS.search(name) or name in (".", "..") or not name:
            raise UserError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it is a folder under {runs}/)")
        return runs / name
    if resume:
        found = layout.newest_named(runs, command, _listing(runs))
        if found is None:
            raise UserError(f"--resume: no run of `{command}` under {runs}/ to go on with; leave out --resume to start one")
        return found
    return reserve(runs, command, time.time())


def reserve(runs: Path, command: str, started: float) -> Path:
    """A new run directory of ``command`` under ``runs``, made (see the module docstring); a UserError when
    ``runs`` cannot hold one."""
    try:
        runs.mkdir(parents=True, exist_ok=True)  # not the run directory: the folder of runs
        for number in range(1, MAX_SAME_SECOND + 1):
            found = runs / layout.run_name(command, started, number)
            try:
                found.mkdir()  # not the run directory: its root, made; fails on a name taken a moment ago
                return found
            except FileExistsError:
                continue
    except OSError as exc:
        raise UserError(f"cannot make a run directory under {runs}/: {exc.strerror or exc}") from None
    raise UserError(f"{MAX_SAME_SECOND} runs of `{command}` under {runs}/ started in the same second: give --name")
