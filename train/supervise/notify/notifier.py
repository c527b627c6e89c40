"""Notifications: run the person's own command on the events they care about, never holding up training.

A run that gives up at 03:00 waits silently until someone looks (seed 000's hang was found 7.8 hours
late). Batch systems tell the person instead: Slurm's ``sbatch --mail-type=FAIL``, systemd's
``OnFailure=`` unit, Alertmanager's webhook receivers. trainbox does the same with one command line,
``--notify CMD``, the way Git hooks and Alertmanager's webhooks hand over their payload: the event is
one JSON object (one line, as in ``events.jsonl``) on the command's standard input, ``TRAINBOX_EVENT``
holds its name and ``TRAINBOX_SUMMARY`` one line for a person (:func:`summary`), so a three-line shell
script can send it anywhere (``examples/notify/``).

The rules:

* **CMD is a command line, not a shell script.** :func:`parse_command` splits it into words as a
  shell would (``shlex``) and the program is run directly. That way trainbox knows which program it
  will run and checks at the start that it exists: a notifier path with a typo is reported when the
  run starts, not discovered when the run gives up eight hours later (a shell string would always
  find ``/bin/sh``). Whoever wants a pipe writes a script, or says ``sh -c '...'`` explicitly.
* **``send`` only queues**, so it returns in microseconds. One worker thread runs the notifiers one
  at a time, in the order the events happened (``give_up`` before ``exit`` on the phone too). The
  queue is bounded (:data:`MAX_QUEUED`): a restart loop with a notifier that hangs drops events
  instead of piling up processes.
* **Each notifier is detached and bounded.** It runs in its own session and process group
  (``start_new_session``). At :data:`LIMIT_S` its whole group is killed; when the program exits,
  whatever it left running in its group is killed at once, so nothing it starts outlives it. Its
  standard input is an in-memory file (``memfd``): writing the event never blocks, whether the
  notifier reads it or not. Its standard output goes to ``/dev/null``; its standard error is read
  by the worker as it comes (a notifier that prints megabytes blocks nothing), keeping only the
  last :data:`STDERR_TAIL_BYTES` to quote in a failure line.
* **No zombies, and no confusion with the training tree.** The supervisor is a child subreaper:
  what a notifier orphans is re-parented to it. The worker reaps every child of ours left in the
  notifier's group after killing it (``waitpid(-pgid)``). :meth:`Notifier.groups` names the groups
  in flight, so the supervisor's process tree leaves them out of the training tree it samples
  and kills (:class:`trainbox.system.proctree.ProcessTree`'s ``foreign_groups``): a notifier's CPU
  never makes a deadlocked trainer look busy, and a stall's kill never ends a notification. A
  notifier is registered before anyone can ask about it: ``groups()`` waits while one is being
  started, so a tree that listed the supervisor's children before asking finds each one's group.
* **Wired through the run's record** (:func:`attach`): every event the supervisor writes is sent,
  and the queue is closed as the run ends (:data:`CLOSE_S`), so the ``exit`` notification goes out.
* **A failure is said once per kind**: the program cannot start (``start``), exits non-zero
  (``status``), is still running at the limit (``timeout``), or an event is dropped (``dropped``:
  queue full, or the run ended first). ``on_failure(kind, line)`` gets one line for the first
  failure of each kind; the run goes on whatever happens.

Limits: a notifier that calls ``setsid`` itself leaves its group, and the group kill does not reach
it. The limit is enforced by the supervisor's worker thread: a supervisor killed with SIGKILL leaves
a running notifier to end by itself. Linux only (``memfd_create``, ``waitid``), as the rest of trainbox.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, FrozenSet, Mapping, Optional, Sequence, Set

from trainbox.errors import say
from trainbox.heartbeat import RUN_DIR_ENV
from trainbox.supervise.notify.events import DEFAULT_EVENTS, EVENT_ENV, LIMIT_S
from trainbox.supervise.notify.redact import quote, redact
from trainbox.supervise.record import Record

#: The environment variable with one line a person can read (:func:`summary`): a title or a message as it is.
SUMMARY_ENV = "TRAINBOX_SUMMARY"
#: The fields a summary quotes, in this order, when the event has them: why, what was found, how it ended.
SUMMARY_FIELDS = ("reason", "cause", "code", "ratio", "suspect", "profile")
#: Events waiting for the worker beyond which new ones are dropped: a run restarting every second with a
#: notifier that hangs its full limit would otherwise queue without end; 32 covers any real burst (a stall,
#: its restart, a give-up and the exit are four).
MAX_QUEUED = 32
#: How often the worker looks at a running notifier (has it exited, is its time up, is the run ending):
#: 50 ms adds nothing a person notices to a notification, and costs nothing while none runs.
POLL_S = 0.05
#: How much of a notifier's standard error is kept, to quote its last line when it fails.
STDERR_TAIL_BYTES = 4096
#: One read from a notifier's standard error: a pipe's default capacity, so a flood is drained in few calls.
READ_CHUNK = 65536
#: What is read of a notifier's standard error once it has ended: its final lines are in the last pipe-full; a
#: process it let escape the group (``setsid``) and that keeps writing must not hold the worker.
FINAL_READ_BYTES = 4 * READ_CHUNK
#: How long the worker waits for killed members of a group to be reaped: SIGKILL takes effect in
#: microseconds, except for a process stuck in the kernel, which nobody can reap anyway.
REAP_S = 1.0
#: How long ``close`` waits for the worker once it is told to stop: one look at the notifier, then its leader
#: and its group reaped (:data:`REAP_S` each), with room for the dropped events' one line.
ABORT_S = POLL_S + 2 * REAP_S + 0.5
#: At most this many characters of a notifier's error output are quoted in a failure line.
QUOTE_CHARS = 200
#: How long the end of a run (or ``health --act``, before its kill) waits for the notifications still queued:
#: the last one's whole limit and its reaping. Past it, :meth:`Notifier.close` kills and drops (:data:`ABORT_S` more).
CLOSE_S = LIMIT_S + 2 * REAP_S

#: ``on_failure(kind, line)``: ``kind`` is one of :data:`FAILURE_KINDS`, ``line`` says what happened.
FailureHandler = Callable[[str, str], None]
FAILURE_KINDS = ("start", "status", "timeout", "dropped")


def summary(event: Mapping[str, Any]) -> str:
    """One line for a person: ``give_up, attempt 3: reason restart budget spent`` (bounded, no newline)."""
    head = f"{event.get('event', '?')}, attempt {event.get('attempt', '?')}"
    said = [f"{key} {event[key]}" for key in SUMMARY_FIELDS if event.get(key) not in (None, "")]
    return " ".join((head + (": " + ", ".join(said) if said else "")).split())[:QUOTE_CHARS]


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has ended, without reaping it: its pid, and so its process group, stay reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _reap_group(pgid: int) -> None:
    """Reap our children left in group ``pgid`` (what the notifier orphaned, re-parented to a subreaper)."""
    deadline = time.monotonic() + REAP_S
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return  # none of our children is in that group
        if pid == 0:
            time.sleep(POLL_S / 10)


def _reaped(proc: subprocess.Popen) -> int:
    """The exit status of a notifier just killed (or exited); SIGKILL's when it cannot be reaped (stuck in the kernel)."""
    try:
        return proc.wait(REAP_S)
    except subprocess.TimeoutExpired:
        return -signal.SIGKILL  # left to subprocess's own clean-up of forgotten processes


class _ErrorTail:
    """A notifier's standard error, read without blocking as it comes; only its last bytes are kept."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.open = True  # until end of file: every writer has closed it
        self.kept = b""
        os.set_blocking(fd, False)

    def wait(self, seconds: float) -> None:
        """Read one chunk if some arrives within ``seconds`` (just sleep once the pipe is at its end)."""
        if not self.open:
            time.sleep(seconds)
            return
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if ready:
            self.read(READ_CHUNK)

    def read(self, most: int) -> None:
        """Read what is there now, up to ``most`` bytes: a writer as fast as the reads cannot hold the worker."""
        while self.open and most > 0:
            try:
                chunk = os.read(self.fd, min(most, READ_CHUNK))
            except BlockingIOError:
                return
            self.open = bool(chunk)
            self.kept = (self.kept + chunk)[-STDERR_TAIL_BYTES:]
            most -= len(chunk)

    def last_line(self) -> str:
        lines = [line.strip() for line in self.kept.decode(errors="replace").splitlines() if line.strip()]
        return quote(lines[-1], QUOTE_CHARS) if lines else ""  # redacted before the cut: no secret's first characters


def _event_input(payload: bytes) -> int:
    """A file descriptor on an in-memory file holding ``payload``, positioned at its start."""
    fd = os.memfd_create("trainbox-event", os.MFD_CLOEXEC)
    try:
        os.write(fd, payload)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class _Job:
    """One notification: the event's name, its line for a person, and its JSON."""

    name: str
    summary: str
    payload: bytes


class Notifier:
    """Runs ``command`` for each event whose name is in ``events``; see the module's rules."""

    def __init__(
        self,
        command: Sequence[str],
        events: FrozenSet[str] = DEFAULT_EVENTS,
        on_failure: FailureHandler = lambda kind, line: None,
        limit_s: float = LIMIT_S,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        if not command:
            raise ValueError("a notifier needs a command")
        self.command = list(command)
        self.events = frozenset(events)
        self.limit_s = limit_s
        self._env = dict(env or {})
        self._on_failure = on_failure
        self._reported: Set[str] = set()
        self._queue: Deque[_Job] = collections.deque()
        self._groups: Set[int] = set()
        #: Held from before a notifier is forked until its group is in ``_groups``: see :meth:`groups`.
        self._spawning = threading.Lock()
        self._lock = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self._worker: Optional[threading.Thread] = None
        if shutil.which(self.command[0]) is None:
            self._fail("start", f"{self._cannot_start()}: not found, or not executable")

    # -- the caller's side -----------------------------------------------------
    def send(self, event: Dict[str, Any]) -> None:
        """Queue ``event`` (a record as ``EventLog.emit`` returns it) if its name was asked for; returns at once."""
        name = str(event.get("event", ""))
        if name not in self.events:
            return
        job = _Job(name, summary(event), (json.dumps(event, sort_keys=True, default=str) + "\n").encode())
        with self._lock:
            if self._closing:
                return
            if len(self._queue) >= MAX_QUEUED:
                dropped = True
            else:
                dropped = False
                self._queue.append(job)
                self._start_worker()
                self._lock.notify()
        if dropped:
            self._fail("dropped", f"notification of {name} dropped: {MAX_QUEUED} notifications are waiting already")

    def groups(self) -> FrozenSet[int]:
        """The process groups of the notifiers running now (not part of the training tree).

        Waits for a notifier being started (milliseconds), so a caller that listed the supervisor's children
        first, then asks, finds the group of every notifier it listed (:class:`trainbox.system.proctree.ProcessTree`).
        """
        with self._spawning, self._lock:
            return frozenset(self._groups)

    def close(self, timeout: float) -> None:
        """At the run's end: wait up to ``timeout`` s for the queued notifications, then kill and drop the rest."""
        with self._lock:
            self._closing = True
            self._lock.notify()
            worker = self._worker
        if worker is None:
            return
        worker.join(timeout)
        if worker.is_alive():
            self._abort.set()
            worker.join(ABORT_S)

    # -- the worker ----------------------------------------------------------------
    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="trainbox-notify", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
            if self._abort.is_set():
                self._fail("dropped", f"notification of {job.name} dropped: the run ended before it could be sent")
                continue
            self._notify(job)

    def _notify(self, job: _Job) -> None:
        """Run the command for one event, to its end or its limit; report what went wrong."""
        try:
            proc = self._start(job)
        except OSError as exc:
            self._fail("start", f"{self._cannot_start()}: {exc.strerror or exc}")
            return
        assert proc.stderr is not None
        tail = _ErrorTail(proc.stderr.fileno())
        try:
            exited = self._watch(proc.pid, tail)
            _kill_group(proc.pid)  # the leader is not reaped yet: the group id cannot have been reused
            tail.read(FINAL_READ_BYTES)  # its last words, written before it exited or was killed
            code = _reaped(proc)
            _reap_group(proc.pid)
        finally:
            with self._lock:
                self._groups.discard(proc.pid)
            proc.stderr.close()
        self._report(job.name, exited, code, tail.last_line())

    def _start(self, job: _Job) -> subprocess.Popen:
        """Start the command for ``job``, its group registered before :meth:`groups` can answer again."""
        with self._spawning:
            proc = self._spawn(job)
            with self._lock:
                self._groups.add(proc.pid)
        return proc

    def _spawn(self, job: _Job) -> subprocess.Popen:
        event_input = _event_input(job.payload)
        try:
            return subprocess.Popen(
                self.command,
                stdin=event_input,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**os.environ, **self._env, EVENT_ENV: job.name, SUMMARY_ENV: job.summary},
                start_new_session=True,
            )
        finally:
            os.close(event_input)

    def _watch(self, pid: int, tail: _ErrorTail) -> bool:
        """Wait for the notifier to exit, reading its errors; False when its limit came (or the run ended) first."""
        deadline = time.monotonic() + self.limit_s
        while not _exited(pid):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._abort.is_set():
                return False
            tail.wait(min(POLL_S, remaining))
        return True

    def _report(self, name: str, exited: bool, code: int, last_error: str) -> None:
        said = f": {last_error}" if last_error else ""
        if not exited:
            why = "the run ended" if self._abort.is_set() else f"its {self.limit_s:g} s were up"
            self._fail("timeout", f"notifier {self.command[0]} killed on {name}: {why}{said}")
        elif code != 0:
            status = f"status {code}" if code > 0 else f"signal {-code}"
            self._fail("status", f"notifier {self.command[0]} failed on {name} ({status}){said}")

    def _cannot_start(self) -> str:
        return f"notifier {self.command[0]} cannot start"

    def _fail(self, kind: str, line: str) -> None:
        """Say ``line``, its secrets redacted (:mod:`~trainbox.supervise.notify.redact`), through ``on_failure``, the
        first time only for each ``kind``."""
        with self._lock:
            if kind in self._reported:
                return
            self._reported.add(kind)
        try:
            self._on_failure(kind, redact(line) + " (said once; the run goes on)")
        except Exception:  # noqa: BLE001 - the handler's own failure must not end the worker (zombies, a stuck queue)
            pass


def attach(record: Record, command: Sequence[str], events: FrozenSet[str], attempt: Callable[[], int]) -> Notifier:
    """A notifier told every event ``record`` writes from now on (``TRAIN_RUN_DIR`` names the run for it).

    Its failures are one line each (``notify: ...``) and a ``notify_failed`` event, written best-effort: they come
    from its worker thread, where a full disk must not end it, and the run goes on either way.
    """

    def failed(kind: str, line: str) -> None:
        say(f"notify: {line}")
        record.emit_best_effort("notify_failed", attempt(), kind=kind, line=line)

    notifier = Notifier(command, events, failed, env={RUN_DIR_ENV: str(record.run_dir.root)})
    record.listen(notifier.send)
    return notifier
