"""Which progress counts for an attempt: the child's beats, else the counters its output shows, else none.

``trainbox supervise -- CMD`` promises to supervise someone's own training script as it is. A script that calls
``beat()`` says where it is; one that does not still shows it to a person: its progress bar moves, its
``Train Epoch: 1 [640/60000]`` lines count up (seed 001's check: "run twice, 60 seconds apart; if the batch number
doesn't change, it is hung"). The rules, in order:

1. **Beats win.** From the first beat of the attempt (``heartbeat.json`` or a torchrun rank's file, read by
   :class:`~trainbox.supervise.ranks.JobBeats`) the attempt is judged by its beats alone, as it always was:
   whatever its output shows from then on is ignored, so a child that beats is never judged twice, and a child
   whose beats stop is a stall even while its bar is redrawn.
2. **Until then, a counter that advances is the beat.** The attempt's
   :class:`~trainbox.supervise.output.progress.OutputProgress` reads each display line and says when a counter
   reached a new place (chatter, redraws at the same count and repeated lines are not progress). That reading
   (``phase``, ``epoch``, ``batch``, ``step``, their totals, and ``pattern``: which form was read) goes into the
   beat's place, timed when it was read, so the budgets, ``at`` and the same-place rule, the learned budgets,
   ``progress.jsonl``, ``state.json``/``status`` and the report work on a command that never heard of trainbox.
3. **Neither.** The attempt stays on its startup budget, judged by what its process tree does (the idle rule, a
   compile that extends the budget: :mod:`trainbox.supervise.stalls.silence`). The supervisor says so once, at
   :func:`notice_due`, with how to give progress (:data:`~trainbox.supervise.output.progress.HOW_TO_GIVE_PROGRESS`).

:func:`output_works` is the no-beat rule's exception (:mod:`trainbox.supervise.policy`): an attempt that showed no
progress of either kind but whose output was still coming when it was stopped ran; two of them in a row are not a
configuration error but a run whose progress cannot be read, and the give-up message says how to give it.

Limits: the output's readings are taken once per look at the attempt (every half second at most), so the
silences the learned budgets learn from are measured between looks (a little longer than the real gaps: the
budgets err on the long side); a program that prints a counter in a form nobody recognises, and no pattern was
given for, is judged as in rule 3.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.ranks import JobBeats, Progress, Standing

#: The notice that an attempt shows no progress comes this far into its startup budget: late enough that a
#: program importing torch has printed its first bar, early enough to be read long before the budget runs out.
NOTICE_SHARE = 0.5
#: ... and never later than this many seconds in (a startup budget of 20 minutes should not hide it for 10).
NOTICE_MAX_S = 60.0
#: An attempt without progress "ran" when its output still changed in the last part of its silence: a command
#: that cannot start prints its banner or its error and stops; one that works without a readable counter logs on.
WORKING_OUTPUT_SHARE = 0.5


class Source(str, Enum):
    """Where an attempt's progress comes from (``state.json``'s ``progress_source``)."""

    BEATS = "beats"
    OUTPUT = "output"
    NONE = "none"


class ProgressSource:
    """One attempt's progress, from whichever source counts (see the module docstring).

    :meth:`poll`, :meth:`lagging` and :meth:`report` are what the monitor and the stall handling ask;
    under torchrun the beats are per rank, as :class:`~trainbox.supervise.ranks.JobBeats` follows them.
    """

    def __init__(self, beats: JobBeats, output: OutputProgress) -> None:
        self.beats = beats
        self.output = output
        self.beaten = False
        self._taken: Optional[Tuple[float, Dict[str, Any]]] = None
        #: The first beat with a count, as this attempt's start when its progress comes from beats.
        self._first_beat: Optional[Dict[str, Any]] = None

    @property
    def source(self) -> Source:
        if self.beaten:
            return Source.BEATS
        return Source.OUTPUT if self._taken is not None else Source.NONE

    def poll(self, now: float) -> List[Progress]:
        """The progress since the last look: new beats, or (while there were none) a counter that advanced."""
        progressed = self.beats.poll(now)
        self.beaten = self.beaten or bool(progressed)
        if self.beaten:
            counted = [p.record for p in progressed if p.record and ("step" in p.record or "batch" in p.record)]
            self._first_beat = self._first_beat or (counted[0] if counted else None)
            return progressed
        beat, at = self.output.latest()
        if beat is None or at is None or self._taken == (at, beat):
            return []
        self._taken = (at, beat)
        # `ts`, as a beat carries it: the wall time the counter was read (status shows how long ago).
        record = dict(beat, ts=round(time.time() - (now - at), 3))
        return [self.beats.heard(record, at)]

    def starts(self, counter: Optional[str]) -> List[Dict[str, Any]]:
        """Where this attempt's progress began: the first places of ``counter`` in its output (None: its main
        counter), or its first beat with a count (a heartbeat file holds only the latest: the first one seen)."""
        if self.beaten:
            return [self._first_beat] if self._first_beat else []
        return self.output.starts(counter)

    def counters(self) -> List[str]:
        """The counters its output showed (none once it beats: beats have none)."""
        return [] if self.beaten else self.output.counters()

    def lagging(self, now: float) -> Standing:
        return self.beats.lagging(now)

    def report(self, now: float) -> Dict[str, Any]:
        return self.beats.report(now)


def notice_due(source: Source, since_start_s: float, startup_s: float) -> bool:
    """Whether an attempt ``since_start_s`` in, with ``startup_s`` of startup budget, should be told it shows no progress."""
    return source is Source.NONE and since_start_s >= min(NOTICE_MAX_S, NOTICE_SHARE * startup_s)


def output_works(silent_s: float, output_quiet_s: Optional[float]) -> bool:
    """Whether a silence of ``silent_s`` whose output last changed ``output_quiet_s`` ago (None: never) still ran."""
    return output_quiet_s is not None and output_quiet_s < WORKING_OUTPUT_SHARE * silent_s
