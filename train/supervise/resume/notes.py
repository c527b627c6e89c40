"""What the monitor writes down about resuming, as an attempt runs: the newest checkpoint, and the work done again.

``status`` and the report read the run directory only, and a command's checkpoints are its own, anywhere: so the
monitor looks for the newest complete one every :data:`LOOK_S` (and once as each attempt ends) and keeps it in
state.json (``checkpoint``: path, time, step). The look runs on a thread of its own: a glob over a slow or huge
folder never holds up the loop, which goes on judging silences and writing state.json; the loop only publishes what
the last look found, at its next turn. One look runs at a time, and one that is still running when the attempt
ends is waited for at most :data:`LAST_WAIT_S`. When a restarted attempt shows its first counter, the steps done
again since where the attempt before it had got (:func:`trainbox.supervise.resume.resumer.redone`) are added to the
run's ``redone_steps`` and the restart's ``resumed`` is kept in state.json with them.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from trainbox.errors import say
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.resume.checkpoints import Checkpoint
from trainbox.supervise.resume.resumer import redone

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

    def first_counter(self, number: int, launch: Launch, first: Dict[str, Any]) -> None:
        """Attempt ``number``'s first counter ``first``: for a restart, the work done again, counted and published."""
        resumed = launch.resumed
        if not resumed or not resumed.get("reached"):
            return
        steps = redone(resumed["reached"], first)
        counters = self.record.counters
        self.record.counters = replace(counters, redone_steps=counters.redone_steps + (steps or 0))
        fields = {key: resumed.get(key) for key in ("from", "step", "why")}
        self.record.publish(force=True, resumed=dict(fields, attempt=number, first=first, redone_steps=steps))
        where = f"from {resumed['from']}" if resumed.get("from") else "from the start"
        say(f"attempt {number} resumed {where}" + (f": {steps} step(s) done again" if steps is not None else ""))
