"""The child's side of the supervisor contract: beats, and stack dumps on request.

A beat rewrites ``$TRAIN_HEARTBEAT_FILE`` atomically with one JSON object. The
supervisor counts a beat as progress when the object (ignoring ``ts`` and
``pid``) differs from the previous one. ``beat()`` is throttled: it writes at
most once per ``TRAIN_HEARTBEAT_INTERVAL`` seconds (default 1) unless the
phase or its declared timeout changes, so calling it on every batch costs a
dictionary update and a clock read.

Under torchrun (``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set, as
torch.distributed.elastic sets them in every worker, Ultralytics' DDP ranks
included) each rank beats into its own file, ``RUN_DIR/heartbeats/rank-<RANK>.json``
(:class:`trainbox.rundir.layout.RunDir`), and every beat carries ``rank``, ``local_rank``,
``world_size`` and ``local_world_size``: the supervisor follows every rank
(:mod:`trainbox.supervise.ranks`), so one silent rank is not hidden by the others' beats.

Standard library only: this module is imported by the supervisor, by training
children and by spawned DataLoader workers alike.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from trainbox.atomic import write_text_atomic
from trainbox.rundir.layout import RunDir

HEARTBEAT_ENV = "TRAIN_HEARTBEAT_FILE"
ATTEMPT_ENV = "TRAIN_ATTEMPT"
RUN_DIR_ENV = "TRAIN_RUN_DIR"
INTERVAL_ENV = "TRAIN_HEARTBEAT_INTERVAL"
#: What torchrun sets in each worker: its global rank, its rank on this node, and the two world sizes.
RANK_ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE", "local_world_size": "LOCAL_WORLD_SIZE"}

#: Keys that change on every write and so never count as progress.
VOLATILE_KEYS = frozenset({"ts", "pid"})

#: The signal a process answers with a dump of all its threads' Python stacks.
STACK_DUMP_SIGNAL = signal.SIGUSR1


class _Beater:
    """Process-local throttled writer; one per process (reset after fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: Dict[str, Any] = {}
        self.written: Dict[str, Any] = {}
        self.last_write = 0.0
        path = os.environ.get(HEARTBEAT_ENV)
        self.path: Optional[Path] = Path(path) if path else None
        identity = rank_identity()
        if self.path is not None and identity is not None:
            # The rank files sit in the run directory beside heartbeat.json, which is RUN_DIR/heartbeat.json.
            self.path = (run_dir() or RunDir(self.path.parent)).rank_heartbeat(identity["rank"])
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.state.update(identity)
        self.interval = float(os.environ.get(INTERVAL_ENV, "1.0"))

    def beat(self, force: bool, phase: Optional[str], timeout: Optional[float], fields: Dict[str, Any]) -> bool:
        if self.path is None:
            return False
        with self.lock:
            if phase is not None and phase != self.state.get("phase"):
                self.state["phase"] = phase
                self.state.pop("timeout", None)
            if timeout is not None:
                self.state["timeout"] = timeout
            self.state.update((k, v) for k, v in fields.items() if v is not None)
            now = time.monotonic()
            phase_changed = any(self.state.get(k) != self.written.get(k) for k in ("phase", "timeout"))
            if not (force or phase_changed or now - self.last_write >= self.interval):
                return False
            record = dict(self.state, ts=time.time(), pid=os.getpid())
            write_text_atomic(self.path, json.dumps(record, sort_keys=True), fsync=False)
            self.written = dict(self.state)
            self.last_write = now
            return True


def rank_identity() -> Optional[Dict[str, int]]:
    """Under torchrun: this process's ``rank``, ``local_rank``, ``world_size``, ``local_world_size``; else None.

    A launcher that sets no ``LOCAL_WORLD_SIZE`` runs one node: it is the world size then.
    """
    values = {key: os.environ.get(name, "") for key, name in RANK_ENV.items()}
    values["local_world_size"] = values["local_world_size"] or values["world_size"]
    if not all(value.isdigit() for value in values.values()):
        return None
    return {key: int(value) for key, value in values.items()}


_beater: Optional[_Beater] = None


def _reset_after_fork() -> None:
    global _beater
    _beater = None


os.register_at_fork(after_in_child=_reset_after_fork)


def beat(
    phase: Optional[str] = None,
    *,
    step: Optional[int] = None,
    epoch: Optional[int] = None,
    batch: Optional[int] = None,
    timeout: Optional[float] = None,
    force: bool = False,
    **metrics: Any,
) -> bool:
    """Record progress; return True when the heartbeat file was written.

    Fields left out (or None) keep their last value, except ``timeout``: a
    declared budget lasts until the phase changes. Without
    ``TRAIN_HEARTBEAT_FILE`` this is a no-op, so instrumented scripts also run
    unsupervised.
    """
    global _beater
    if _beater is None:
        _beater = _Beater()
        install_stack_dump()
    return _beater.beat(force, phase, timeout, dict(metrics, step=step, epoch=epoch, batch=batch))


#: How often :func:`checkpoint_requested` looks at the request file: one ``stat`` a second at most, so it may be
#: called at every step.
REQUEST_CHECK_S = 1.0
#: Since when this process has answered checkpoint requests: one written before it started is not for it.
_answered = [time.time()]
_looked = [0.0]


def checkpoint_requested() -> bool:
    """Whether the supervisor asks for a checkpoint now: it is about to restart this attempt because it became slow
    (``--on-slow restart``) and writes ``RUN_DIR/checkpoint.request`` first. Call it where a checkpoint can be written
    (after an optimizer step); write one, then :func:`checkpointed`. Looks at the file at most once a second."""
    run, now = run_dir(), time.monotonic()
    if run is None or now - _looked[0] < REQUEST_CHECK_S:
        return False
    _looked[0] = now
    try:
        return run.checkpoint_request.stat().st_mtime > _answered[0]
    except OSError:
        return False


def checkpointed() -> bool:
    """Say that a checkpoint was just written: a beat with ``checkpoint_ts``, which the supervisor waits for before it
    restarts a slow attempt. Returns what :func:`beat` returns."""
    _answered[0] = time.time()
    return beat(force=True, checkpoint_ts=round(_answered[0], 3))


#: A beat is a small JSON object (well under 1 KiB); anything larger is garbage, not a beat, and is
#: never parsed (a file of 100,000 '[' made json raise RecursionError inside the supervisor).
MAX_BEAT_BYTES = 64 * 1024


def read(path: Path) -> Optional[Dict[str, Any]]:
    """The last complete beat in ``path``, or None when absent, unreadable or not a beat ("no new beat")."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BEAT_BYTES + 1)
        if len(raw) > MAX_BEAT_BYTES:
            return None
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def progress_key(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """What must change between two beats for the second to count as progress."""
    if record is None:
        return None
    return json.dumps({k: v for k, v in record.items() if k not in VOLATILE_KEYS}, sort_keys=True)


def run_dir() -> Optional[RunDir]:
    """The run directory the supervisor gave this process (``$TRAIN_RUN_DIR``), if any."""
    root = os.environ.get(RUN_DIR_ENV)
    return RunDir(Path(root)) if root else None


_stack_file = None


def install_stack_dump() -> bool:
    """Dump all Python thread stacks to ``$TRAIN_RUN_DIR/stacks/<pid>.txt`` on SIGUSR1.

    The supervisor sends the signal only to processes whose signal mask shows
    a handler (``SigCgt`` in /proc), since SIGUSR1 kills a process that has
    none. Called by ``beat()`` and by DataLoader worker init functions; a
    forked child re-registers with its own file.
    """
    global _stack_file
    run = run_dir()
    if run is None:
        return False
    run.stack_dump.directory.mkdir(parents=True, exist_ok=True)
    if _stack_file is not None:
        _stack_file.close()
    _stack_file = open(run.stack_dump(os.getpid()), "w")  # noqa: SIM115 - must outlive this call
    faulthandler.register(STACK_DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    return True


def _reinstall_after_fork() -> None:
    if _stack_file is not None:
        install_stack_dump()


os.register_at_fork(after_in_child=_reinstall_after_fork)
