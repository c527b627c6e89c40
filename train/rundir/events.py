"""``RUN_DIR/events.jsonl``: the run's history, one JSON object per line, and its one reader.

Every record has ``ts`` (unix seconds), ``event`` and ``attempt``. Lines are
appended with one ``write`` on an ``O_APPEND`` descriptor and fsynced
(:meth:`trainbox.rundir.safe.RunFiles.append`), so a crash loses at most the
line being written and never corrupts earlier ones. An ``events.jsonl`` that
trainbox refuses (a link, a FIFO, a folder, a file with another hard link:
:mod:`trainbox.rundir.safe`) cannot hold the history: :meth:`EventLog.emit`
raises :class:`HistoryRefused`, whose line says so, and the supervisor ends
there (exit 2: the run directory is bad input, and running again cannot help
until it is fixed).

:func:`history` reads the file back typed (:data:`EVENT`, :mod:`trainbox.rundir.records`): at most the newest
:data:`EVENTS_BYTES` and :data:`MAX_EVENTS` records, lines that are not a usable record skipped and counted,
never an exception (issue 33 item 7: a line ``[1]``, 100,000 ``[`` or a byte ``0xe9`` ended the supervisor,
``status`` and ``report``).
"""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainbox.errors import UserError
from trainbox.rundir.records import (
    BEAT,
    Records,
    Schema,
    exit_code,
    files_of,
    parse_records,
    pid,
    pids,
    plain,
    seconds,
    table,
    text,
    texts,
    timestamp,
    whole,
    wholes,
)
from trainbox.rundir.safe import Refusal

#: start: an attempt was launched (carries ``profile``); stall: a budget ran out or the tree stayed idle
#: (``rule``, ``cause``, ``evidence``, ``budget``, ``budget_s``, ``silent_s``); extend: a compile making
#: progress got more time (``cause``, ``budget_s``, ``evidence``); crash: the child exited non-zero;
#: restart: the next attempt is scheduled (``reason``); exit: the supervisor ends (``code``);
#: give_up: the restart budget is spent, the same stall came back, or the child is misconfigured; device: the
#: child's first beat that carries ``device`` (the device it found and what it decided for it), once per attempt;
#: supervisor_hung: ``health --act`` found the supervisor itself hung and ended it (written by the health check,
#: :mod:`trainbox.supervise.watchdog`); notify_failed: a ``--notify`` command could not start, failed, ran out of
#: time or an event was dropped (``kind``, ``line``), once per kind (:mod:`trainbox.supervise.notify.notifier`); slow: the
#: run keeps beating but has become much slower than its own pace (``rate``, ``baseline_rate``, ``ratio``,
#: ``since_ts``, ``suspect``, ``evidence``); recovered: it is back at its pace (:mod:`trainbox.supervise.pace.watch`);
#: redone: a restarted attempt's work done again, once it showed where it began (``redone``, ``unit``, ``reached``,
#: ``began``, ``from``; :mod:`trainbox.supervise.resume.redone`).
EVENTS = (
    "start",
    "device",
    "stall",
    "extend",
    "crash",
    "restart",
    "probe",
    "exit",
    "give_up",
    "supervisor_hung",
    "notify_failed",
    "slow",
    "recovered",
    "redone",
)


class Cause(str, Enum):
    """Why a child was silent (a ``stall`` event's ``cause``; :func:`trainbox.diagnose.causes.classify` names it)."""

    LOADER_DEADLOCK = "loader_deadlock"
    IDLE = "idle"
    KERNEL_COMPILE = "kernel_compile"
    GPU_WAIT = "gpu_wait"
    IO_WAIT = "io_wait"
    BUSY_PYTHON = "busy_python"
    BUSY_NATIVE = "busy_native"
    #: A process of the tree is stopped (state T: SIGSTOP, a debugger's or the shell's job-control stop).
    STOPPED = "stopped"
    #: A thread holds the GIL off the CPU (a C call that never released it), so no other thread runs Python.
    GIL_HELD = "gil_held"
    UNKNOWN = "unknown"


class Retry(str, Enum):
    """What the attempt after a stall runs (the ``restart`` event's ``retry``)."""

    LADDER = "ladder"  # the profile's fallback; its startup_fallback for a stall before the first batch
    SAME = "same"  # the same profile again
    NATIVE = "native"  # the first rung below with PyTorch's own convolutions (safe-native): nothing to compile
    GPU_RELEASE = "gpu_release"  # wait until the killed tree's GPU memory is released, then the same profile


#: Fields every record has; a ``device`` beat's fields of the same names are not copied.
RECORD_FIELDS = ("ts", "event", "attempt")
#: A line longer than this is not an event (a stall's, with a few ranks' last beats, is a few KiB).
EVENT_LINE_BYTES = 1 << 20
#: The newest part of the history that is read: years of a run's events; a larger file is read from its end.
EVENTS_BYTES = 16 << 20
#: Records kept of that part (the newest).
MAX_EVENTS = 100_000

#: Every field the events table (docs/contract.md) names that a reader uses, with its kind (the rest pass as they are).
EVENT = Schema(
    {
        "ts": timestamp,
        "event": text,
        "attempt": whole,
        "profile": text,
        "previous_profile": text,
        "argv": plain,
        "pid": pid,
        **dict.fromkeys(("startup_timeout_s", "stall_timeout_s", "idle_timeout_s", "compile_cap_s"), seconds),
        **dict.fromkeys(("rule", "cause", "action", "at", "budget", "phase", "incident", "incident_error"), text),
        **dict.fromkeys(("budget_s", "silent_s", "incident_s", "kill_s", "delay_s", "gpu_release_s", "age_s"), seconds),
        **dict.fromkeys(("killed_ts", "first_beat_ts", "first_step_ts", "quiet_until_ts"), timestamp),
        **dict.fromkeys(("beats", "incident_bytes", "restarts", "stalls", "crashes", "hangs"), whole),
        "evidence": texts,
        "silent_ranks": wholes,
        "sigkilled": pids,
        "survivors": pids,
        "continued": pids,
        "learned": table(seconds),
        "last_beat": BEAT,
        "reached": BEAT,
        "began": BEAT,
        "redone": whole,
        "unit": text,
        "code": exit_code,
        "code_before_kill": exit_code,
        **dict.fromkeys(("after", "reason", "retry", "gpu_release"), text),
        **dict.fromkeys(("supervisor_state", "proc_state", "wchan", "name", "stacks"), text),
        "hung_after_s": seconds,
    },
    required=frozenset({"ts", "event"}),
)


def device_fields(beat: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fields of a ``device`` event from a beat that carries a ``device`` object, else None."""
    device = (beat or {}).get("device")
    if not isinstance(device, dict):
        return None
    return {key: value for key, value in device.items() if key not in RECORD_FIELDS}


class HistoryRefused(UserError):
    """events.jsonl is something trainbox refuses to write through (see the module's docstring); exit 2."""

    @classmethod
    def at(cls, path: Path, refusal: Refusal) -> HistoryRefused:
        return cls(
            f"{refusal.line(path)}: the run's history cannot be written there; move it away and run again "
            "(training resumes from its last checkpoint)"
        )


class EventLog:
    """Appends to ``path`` (``RunDir.events``), through the run directory's safe operations."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.files, self.name = files_of(self.path)

    def emit(self, event: str, attempt: int, **fields: Any) -> Dict[str, Any]:
        """Append one record and return it; raises HistoryRefused (refused file) or OSError (a full disk)."""
        record = self.record(event, attempt, **fields)
        self.append(record)
        return record

    @staticmethod
    def record(event: str, attempt: int, **fields: Any) -> Dict[str, Any]:
        """The record ``emit`` writes, made but not written (ValueError for a name not in EVENTS)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}")
        return {"ts": round(time.time(), 3), "event": event, "attempt": attempt, **fields}

    def append(self, record: Dict[str, Any]) -> None:
        """One line, one ``write`` on an ``O_APPEND`` descriptor, fsynced (threads may append at once)."""
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        refused = self.files.append(self.name, line, fsync=True)
        if refused is not None:
            raise HistoryRefused.at(self.path, refused)


def history(path: Path) -> Records:
    """The run's history, typed (see the module's docstring); a missing file is an empty history."""
    files, name = files_of(path)
    return parse_records(files.read_objects(name, EVENT_LINE_BYTES, EVENTS_BYTES, MAX_EVENTS), EVENT)


def read_events(path: Path) -> List[Dict[str, Any]]:
    """The usable records of :func:`history`, oldest first."""
    return history(path).records
