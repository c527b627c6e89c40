"""What the supervisor leaves behind as it goes: the run's history, state.json and the counters.

Three promises, each kept here so that no other piece of the supervisor has to know them:

* **the history must not be lost.** :meth:`Record.emit` appends to ``events.jsonl`` and raises
  :class:`~trainbox.errors.DiskFull` when the disk refuses, or
  :class:`~trainbox.rundir.events.HistoryRefused` when the file is something trainbox refuses to write through
  (a link, a FIFO: :mod:`trainbox.rundir.safe`): the supervisor then ends the tree and exits with one
  line, rather than run on with a history that no longer says what happened. Only the endings that are already
  about a broken disk or a stuck kernel write theirs best-effort (:meth:`Record.emit_best_effort`).
* **state.json is fresh.** :meth:`Record.publish` rewrites it at most once a second (``force`` for news that
  ``health`` must see at once) and never fails: a full disk (or a folder planted where it goes) leaves an old
  state, which ``health`` reads as stale.
  Work that may keep it unwritten for longer is declared first (:meth:`Record.quiet`), as
  :mod:`trainbox.supervise.watchdog` promises ``health``.
* **the state moves only along the machine.** :meth:`Record.set_state` checks every move against
  :data:`trainbox.rundir.state.TRANSITIONS`, so an ending added later cannot publish a state ``health`` misreads.

And it tells those who asked, so that no other piece of the supervisor has to: every event it writes goes to
its listeners (:meth:`Record.listen`: the ``--notify`` command's queue, :mod:`trainbox.supervise.notify.notifier`), the
best-effort endings too, even when the disk refused them (a full disk is news a person needs most); and each
rewrite of state.json is followed by ``on_publish`` (the CLI's ``--metrics-textfile``), at once for forced news
(a state change, a stall) and otherwise at most every :data:`REFRESH_EVERY_S`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from trainbox.errors import DISK_FULL_ERRNOS, DiskFull
from trainbox.rundir.events import EventLog, HistoryRefused
from trainbox.rundir.layout import RunDir
from trainbox.rundir.state import State, check_transition
from trainbox.supervise.policy import Counters, Outcome

#: state.json is rewritten at most this often unless forced: ``health`` allows a minute (``--hung-after``).
PUBLISH_EVERY_S = 1.0
#: ``on_publish`` (the metrics textfile) runs at most this often between forced publishes: node_exporter is
#: commonly scraped every 15 s, so 5 s keeps any scrape fresh, and a textfile costs a few ms to write.
REFRESH_EVERY_S = 5.0

#: Told every event as it is written (``Notifier.send``): it must return at once.
Listener = Callable[[Dict[str, Any]], None]


class Record:
    """The run's history, its published state and its counters, for one supervisor."""

    def __init__(self, run_dir: RunDir, on_publish: Optional[Callable[[RunDir], None]] = None) -> None:
        self.run_dir = run_dir
        self.events = EventLog(run_dir.events)
        self.files = run_dir.files
        self.state = State.STARTING
        self.counters = Counters()
        #: What state.json says besides the state and the counters (attempt, budget, last beat, ...).
        self._status: Dict[str, Any] = {}
        self._written = 0.0
        self._listeners: List[Listener] = []
        self._on_publish = on_publish
        self._refreshed = -REFRESH_EVERY_S

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` every event written from now on, after it is written."""
        self._listeners.append(listener)

    def emit(self, event: str, attempt: int, **fields: Any) -> Dict[str, Any]:
        """Append to the run's history, which must not be lost: a full disk raises DiskFull."""
        try:
            record = self.events.emit(event, attempt, **fields)
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFull.writing(self.run_dir.events, exc) from None
            raise
        self._tell(record)
        return record

    def emit_best_effort(self, event: str, attempt: int, **fields: Any) -> Dict[str, Any]:
        """Append when the disk allows (the endings about the disk or the kernel, a notifier's failure); told either way."""
        record = self.events.record(event, attempt, **fields)
        with contextlib.suppress(OSError, HistoryRefused):
            self.events.append(record)
        self._tell(record)
        return record

    def _tell(self, record: Dict[str, Any]) -> None:
        for listener in self._listeners:
            listener(record)

    def count(self, outcome: Outcome) -> None:
        """Count ``outcome`` as a stall or a crash, as it is reported."""
        self.counters = self.counters.counted(outcome)

    def set_state(self, state: State, **fields: Any) -> None:
        """Move to ``state`` (checked against the state machine) and publish it at once with ``fields``."""
        check_transition(self.state, state)
        self.state = state
        self.publish(force=True, **fields)

    def publish(self, force: bool = False, **fields: Any) -> None:
        """Keep ``fields`` for state.json and rewrite it, at most every PUBLISH_EVERY_S unless ``force``."""
        self._status.update(fields)
        now = time.monotonic()
        if not force and now - self._written < PUBLISH_EVERY_S:
            return
        record = dict(
            self._status, **self.counters.published(), state=self.state.value, supervisor_pid=os.getpid(), updated_ts=time.time()
        )
        try:
            data = json.dumps(record, sort_keys=True, default=str).encode()
            refused = self.files.replace(self.run_dir.state, data, fsync=False)
        except OSError:
            return  # best-effort (a full disk): `health` reads an old state as stale, and the next publish tries again
        if refused is None:
            self._written = now  # refused (a folder in its place): tried again at the next publish, like a full disk
        if self._on_publish is not None and (force or now - self._refreshed >= REFRESH_EVERY_S):
            self._refreshed = now
            self._on_publish(self.run_dir)

    @contextlib.contextmanager
    def quiet(self, seconds: float) -> Iterator[None]:
        """Work that may keep state.json unwritten for up to ``seconds``: declared to ``health`` first."""
        self.publish(force=True, quiet_until_ts=time.time() + seconds)
        try:
            yield
        finally:
            self.publish(force=True, quiet_until_ts=None)
