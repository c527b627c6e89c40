"""``RUN_DIR/events.jsonl``: the run's history, one JSON object per line.

Every record has ``ts`` (unix seconds), ``event`` and ``attempt``. Lines are
appended with one ``write`` on an ``O_APPEND`` descriptor and fsynced, so a
crash loses at most the line being written and never corrupts earlier ones.
"""

from __future__ import annotations

import json
import os
import time
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

#: start: an attempt was launched (carries ``profile``); stall: a budget ran out or the tree stayed idle
#: (``rule``, ``cause``, ``evidence``, ``budget``, ``budget_s``, ``silent_s``); extend: a compile making
#: progress got more time (``cause``, ``budget_s``, ``evidence``); crash: the child exited non-zero;
#: restart: the next attempt is scheduled (``reason``); exit: the supervisor ends (``code``);
#: give_up: the restart budget is spent, the same stall came back, or the child is misconfigured; device: the
#: child's first beat that carries ``device`` (the device it found and what it decided for it), once per attempt;
#: supervisor_hung: ``health --act`` found the supervisor itself hung and ended it (written by the health check,
#: :mod:`trainbox.supervise.watchdog`); notify_failed: a ``--notify`` command could not start, failed, ran out of
#: time or an event was dropped (``kind``, ``line``), once per kind (:mod:`trainbox.supervise.notify`).
EVENTS = ("start", "device", "stall", "extend", "crash", "restart", "exit", "give_up", "supervisor_hung", "notify_failed")


class Cause(str, Enum):
    """Why a child was silent (a ``stall`` event's ``cause``; :func:`trainbox.diagnose.causes.classify` names it)."""

    LOADER_DEADLOCK = "loader_deadlock"
    IDLE = "idle"
    KERNEL_COMPILE = "kernel_compile"
    GPU_WAIT = "gpu_wait"
    IO_WAIT = "io_wait"
    BUSY_PYTHON = "busy_python"
    BUSY_NATIVE = "busy_native"
    UNKNOWN = "unknown"


class Retry(str, Enum):
    """What the attempt after a stall runs (the ``restart`` event's ``retry``)."""

    LADDER = "ladder"  # the profile's fallback; its startup_fallback for a stall before the first batch
    SAME = "same"  # the same profile again
    NATIVE = "native"  # the first rung below with PyTorch's own convolutions (safe-native): nothing to compile
    GPU_RELEASE = "gpu_release"  # wait until the killed tree's GPU memory is released, then the same profile


#: Fields every record has; a ``device`` beat's fields of the same names are not copied.
RECORD_FIELDS = ("ts", "event", "attempt")


def device_fields(beat: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fields of a ``device`` event from a beat that carries a ``device`` object, else None."""
    device = (beat or {}).get("device")
    if not isinstance(device, dict):
        return None
    return {key: value for key, value in device.items() if key not in RECORD_FIELDS}


class EventLog:
    """Appends to ``path``; its folder must exist (the supervisor's run-directory lock makes it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def emit(self, event: str, attempt: int, **fields: Any) -> Dict[str, Any]:
        """Append one record and return it; OSError when it cannot be written."""
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
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def read_events(path: Path) -> List[Dict[str, Any]]:
    """All complete records; a torn last line (crash mid-write) is ignored."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
