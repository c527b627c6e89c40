"""What the monitor writes down about resuming, as an attempt runs: the newest checkpoint, and the work done again.

``status`` and the report read the run directory only, and a command's checkpoints are its own, anywhere: so the
monitor looks for the newest complete one every :data:`LOOK_S` (and once as each attempt ends) and keeps it in
state.json (``checkpoint``: path, time, step). The look runs on a thread of its own: a glob over a slow or huge
folder never holds up the loop, which goes on judging silences and writing state.json; the loop only publishes what
the last look found, at its next turn. One look runs at a time, and one that is still running when the attempt
ends is waited for at most :data:`LAST_WAIT_S`.

Each attempt's last beat is kept as it ends (``reached``); once the attempt after it shows where it began on that
counter, the work done again (:func:`trainbox.supervise.resume.redone.measure`) is written down: a ``redone`` event
(for the report), the run's ``redone_steps`` and the restart's ``resumed`` in state.json (for ``status``). Every
restart is measured, one that resumed and one that started from nothing alike.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Protocol

from trainbox.errors import say
from trainbox.rundir.events import history
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.resume.checkpoints import Checkpoint
from trainbox.supervise.resume.redone import counter_of, measure


def last_reached(records: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Where a run's last attempt got to, from its history: its stall's or crash's ``last_beat``; None when it
    ended otherwise (it completed, or was stopped: nothing says where)."""
    reached = None
    for record in records:
        if record.get("event") == "start":
            reached = None
        elif record.get("event") in ("stall", "crash") and isinstance(record.get("last_beat"), dict):
            reached = dict(record["last_beat"])
    return reached


class Started(Protocol):
    """Where an attempt's progress began (:meth:`trainbox.supervise.output.source.ProgressSource.starts`)."""

    def starts(self, counter: Optional[str]) -> List[Dict[str, Any]]: ...

    def counters(self) -> List[str]: ...


#: Seconds between two looks for the command's newest checkpoint (a glob and a stat or two each): ``status`` shows
#: its age in seconds, and checkpoints come minutes apart.
LOOK_S = 5.0
#: Seconds the end of an attempt waits for a look still running (a stat of a few files, unless the disk hangs).
LAST_WAIT_S = 2.0


class ResumeNotes:
    """Keeps state.json's ``checkpoint`` and ``resumed`` for one run (see the module docstring)."""

    def __init__(self, record: Record, newest: Callable[[Launch], Optional[Checkpoint]]) -> None:
        self.record = record
        self.newest = newest
        self.looked = -LOOK_S
        self._looking: Optional[threading.Thread] = None
        #: What the last finished look found (a list, so that the thread hands it over with one append).
        self._found: List[Optional[Checkpoint]] = []
        #: The last beat of the attempt that ended last (where it got to; a run gone on with: its last stall's or
        #: crash's), and the attempts already measured.
        self.reached = last_reached(history(record.run_dir.events).records)
        self.measured = -1

    def look(self, launch: Launch, now: float, last: bool = False) -> None:
        """Every LOOK_S (monotonic ``now``), or as an attempt ends (``last``): a look for the newest checkpoint started
        on its thread; what the one before found, published."""
        self._publish()
        busy = self._looking is not None and self._looking.is_alive()
        if last and busy and self._looking is not None:  # the attempt's last look comes after the one under way
            self._looking.join(LAST_WAIT_S)
            busy = self._looking.is_alive()
            self._publish()
        if busy or (not last and now - self.looked < LOOK_S):
            return
        self.looked = now
        self._looking = threading.Thread(target=self._look, args=(launch,), name="trainbox-checkpoint-look", daemon=True)
        self._looking.start()
        if last:
            self._looking.join(LAST_WAIT_S)
            self._publish()

    def _look(self, launch: Launch) -> None:
        self._found.append(self.newest(launch))

    def _publish(self) -> None:
        while self._found:
            newest = self._found.pop(0)
            if newest is not None:
                self.record.publish(checkpoint=newest.as_dict())

    def ended(self, last_beat: Optional[Dict[str, Any]]) -> None:
        """An attempt ended at ``last_beat``: the next one's work done again is counted up to there (an attempt
        that showed no beat got nowhere: the one before it is where the work stands)."""
        self.reached = dict(last_beat) if last_beat else self.reached

    def progressed(self, number: int, launch: Launch, progress: Started) -> None:
        """Attempt ``number`` made progress: once where it began is known, its work done again, written down."""
        if self.measured >= number or not self.reached:
            return
        found = measure(self.reached, progress.starts(counter_of(self.reached, progress.counters())))
        if found is None:
            return
        self.measured = number
        counters = self.record.counters
        self.record.counters = replace(counters, redone_steps=counters.redone_steps + found.count)
        resumed = launch.resumed or {}
        fields = {key: resumed.get(key) for key in ("from", "step", "why", "written", "options")}
        began = {key: value for key, value in found.began.items() if key != "stride"}
        self.record.emit("redone", number, redone=found.count, unit=found.unit, reached=self.reached, began=began, **fields)
        self.record.publish(
            force=True, resumed=dict(fields, attempt=number, first=began, redone_steps=found.count, redone_unit=found.unit)
        )
        where = "" if resumed.get("from") else " (it started from the start)"  # the monitor said where it resumed from
        say(f"attempt {number}: {found.words()} done again{where}")
