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

Every file is written through :mod:`trainbox.rundir.safe` (a ``heartbeats`` link
or a folder where a beat goes refuses the write, and ``beat()`` returns False);
:func:`read` reads a beat back typed (:func:`trainbox.rundir.records.read_beat`).

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
from typing import IO, Any, Dict, Optional, Tuple

from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import files_of, read_beat
from trainbox.rundir.safe import Open, RunFiles

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
        self.files: Optional[RunFiles] = None
        identity = rank_identity()
        if self.path is not None and identity is not None:
            # The rank files sit in the run directory beside heartbeat.json, which is RUN_DIR/heartbeat.json.
            run = run_dir() or RunDir(self.path.parent)
            self.path, self.files = run.rank_heartbeat(identity["rank"]), run.files
            self.state.update(identity)
        elif self.path is not None:
            self.files = files_of(self.path)[0]
        self.interval = float(os.environ.get(INTERVAL_ENV, "1.0"))

    def beat(self, force: bool, phase: Optional[str], timeout: Optional[float], fields: Dict[str, Any]) -> bool:
        if self.path is None or self.files is None:
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
            if self.files.replace(self.path, json.dumps(record, sort_keys=True).encode(), fsync=False) is not None:
                return False  # refused (a link, a folder in its place): not written, tried again at the next beat
            self.written = dict(self.state)
            self.last_write = now
            return True


def rank_identity() -> Optional[Dict[str, int]]:
    """Under torchrun: this process's ``rank``, ``local_rank``, ``world_size`` and ``local_world_size``; else None.

    A launcher that sets no ``LOCAL_WORLD_SIZE`` (DeepSpeed's multi-node launcher, a hand-written SLURM script)
    gives no ``local_world_size``: how many ranks this node runs is then unknown, and the supervisor follows the
    ranks that beat. ``WORLD_SIZE`` is never taken for it: the other nodes' ranks would be waited for here
    (issue 33 item 9: a healthy rank of a 2-node job was killed as "silent_ranks [1]").
    """
    values = {key: os.environ.get(name, "") for key, name in RANK_ENV.items()}
    if not values["local_world_size"]:
        del values["local_world_size"]
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
        _requests.note_start()
    return _beater.beat(force, phase, timeout, dict(metrics, step=step, epoch=epoch, batch=batch))


#: How often :func:`checkpoint_requested` looks at the request file: one ``stat`` a second at most, so it may be
#: called at every step.
REQUEST_CHECK_S = 1.0

#: A checkpoint request told apart from another by its file's inode, size and mtime in nanoseconds.
RequestId = Tuple[int, int, int]


class _Requests:
    """Which checkpoint request this process has answered, or found at its first look (the first beat or the first
    :func:`checkpoint_requested`): one written before this process started is not for it.

    A request is new when its file's identity differs from that one. Its mtime is never compared with this process's
    clock: a run directory on NFS, or in a VM's or container's shared folder, is stamped by another machine's clock,
    and one behind ours would hide every request, one ahead answer the same request at every step."""

    def __init__(self) -> None:
        self.answered: Optional[RequestId] = None
        self.first_look = True
        self.seen: Optional[RequestId] = None  # the request the last look found
        self.looked = 0.0

    @staticmethod
    def current() -> Optional[RequestId]:
        run = run_dir()
        found = run.files.stat(run.checkpoint_request).value if run is not None else None
        # None when missing or not a plain file (a link, a FIFO: never opened)
        return None if found is None else (found.st_ino, found.st_size, found.st_mtime_ns)

    def note_start(self) -> None:
        if self.first_look:
            self.first_look = False
            self.answered = self.current()

    def pending(self) -> bool:
        """Whether a request is waiting. Once seen it stays asked for until :meth:`answer`: a step that cannot write
        a checkpoint (no optimizer step under gradient accumulation, an epoch's last batch) must not use up the look,
        or at a steady pace the look at each second lands on such steps again and again."""
        self.note_start()
        now = time.monotonic()
        if now - self.looked >= REQUEST_CHECK_S:
            self.looked = now
            self.seen = self.current()
        return self.seen is not None and self.seen != self.answered

    def answer(self) -> None:
        """A checkpoint was written: the request the last look found (if any) is answered."""
        if self.seen is not None:
            self.answered = self.seen


_requests = _Requests()


def checkpoint_requested() -> bool:
    """Whether the supervisor asks for a checkpoint now: it is about to restart this attempt because it became slow
    (``--on-slow restart``) and writes ``RUN_DIR/checkpoint.request`` first. Call it where a checkpoint can be written
    (after an optimizer step); write one, then :func:`checkpointed`. Looks at the file at most once a second; a request
    seen stays asked for until :func:`checkpointed`."""
    return _requests.pending()


def checkpointed() -> bool:
    """Say that a checkpoint was just written: a beat with ``checkpoint_ts``, which the supervisor waits for before it
    restarts a slow attempt, and the request last seen answered. Returns what :func:`beat` returns."""
    _requests.answer()
    return beat(force=True, checkpoint_ts=round(time.time(), 3))


def read(path: Path) -> Optional[Dict[str, Any]]:
    """The last complete beat in ``path``, typed, or None when absent, refused, over MAX_BEAT_BYTES or not a beat
    ("no new beat"; :func:`trainbox.rundir.records.read_beat`)."""
    files, name = files_of(path)
    return read_beat(files, name)


def progress_key(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """What must change between two beats for the second to count as progress."""
    if record is None:
        return None
    return json.dumps({k: v for k, v in record.items() if k not in VOLATILE_KEYS}, sort_keys=True)


def run_dir() -> Optional[RunDir]:
    """The run directory the supervisor gave this process (``$TRAIN_RUN_DIR``), if any."""
    root = os.environ.get(RUN_DIR_ENV)
    return RunDir(Path(root)) if root else None


_stack_file: Optional[IO[str]] = None


def open_stack_file(run: RunDir, pid: int) -> Optional[IO[str]]:
    """``stacks/<pid>.txt``, emptied and open for faulthandler to write into; None when it is refused (a FIFO or a
    link planted there: a blocking open would freeze the process, a followed link would write elsewhere)."""
    opened = run.files.open_fd(run.stack_dump(pid), Open.TRUNCATE)
    return None if opened.value is None else os.fdopen(opened.value, "w")


def install_stack_dump() -> bool:
    """Dump all Python thread stacks to ``$TRAIN_RUN_DIR/stacks/<pid>.txt`` on SIGUSR1; whether it is installed.

    The supervisor sends the signal only to processes whose signal mask shows
    a handler (``SigCgt`` in /proc), since SIGUSR1 kills a process that has
    none. Called by ``beat()`` and by DataLoader worker init functions; a
    forked child re-registers with its own file. A file that is refused leaves no handler registered.
    """
    global _stack_file
    run = run_dir()
    if run is None:
        return False
    if _stack_file is not None:
        faulthandler.unregister(STACK_DUMP_SIGNAL)
        _stack_file.close()
    _stack_file = open_stack_file(run, os.getpid())
    if _stack_file is None:
        return False
    faulthandler.register(STACK_DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    return True


def _reinstall_after_fork() -> None:
    if _stack_file is not None:
        install_stack_dump()


os.register_at_fork(after_in_child=_reinstall_after_fork)
