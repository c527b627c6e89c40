"""``RUN_DIR/progress.jsonl``: the child's beats over the whole run, sampled, for ``trainbox report``.

``heartbeat.json`` holds only the latest beat, and ``events.jsonl`` only what
the supervisor did; the throughput over wall time, across attempts, and the
silences actually seen in each phase need a history. The supervisor hands
every progress beat to :meth:`ProgressLog.observe`, which appends one sample
when the phase changes and otherwise at most every ``SAMPLE_S`` seconds:

``{"ts", "attempt", "phase", "epoch", "batch", "step", "imgs_per_s", "loss",
"silences": {PHASE: {"s", "budget", "budget_s"}}}``

``silences`` holds, per phase, the longest silence seen since the previous
sample (the time from one progress beat to the next, counted in the phase of
the earlier beat; ``startup`` before the first beat of an attempt) and the
budget that was in force for it, so a report can set the learned and declared
budgets against the rhythm they were meant for.

Best-effort: a sample that cannot be written (a full disk, a ``progress.jsonl`` that
:mod:`trainbox.rundir.safe` refuses) is dropped; the run's history proper is
``events.jsonl``. Lines are appended without fsync (about one every ``SAMPLE_S`` s:
100 KB an hour); :func:`read_samples` reads them back typed (:data:`SAMPLE`): a
sample without a usable ``ts`` is skipped (it cannot be placed in time), a
``silences`` that is not a table of silences is left out. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Protocol

from trainbox.rundir.records import (
    Records,
    Schema,
    files_of,
    number,
    parse_records,
    seconds,
    table,
    text,
    timestamp,
    whole,
)

#: At most one sample per this many seconds within a phase: fine enough for an epoch that lasts
#: minutes, small enough for a run that lasts days (a phase change always samples).
SAMPLE_S = 5.0
#: The beat fields a sample keeps (the rest of a beat is the child's own business).
KEPT_FIELDS = ("phase", "epoch", "batch", "step", "imgs_per_s", "loss")
#: The phase a silence before an attempt's first beat is counted in.
STARTUP_PHASE = "startup"
#: A sample is a few hundred bytes; a longer line is not one.
SAMPLE_LINE_BYTES = 64 * 1024
#: The newest part of progress.jsonl that is read (about 300 hours of samples), and the samples kept of it.
PROGRESS_BYTES = 32 << 20
MAX_SAMPLES = 200_000

#: One sample as :meth:`ProgressLog.observe` writes it; ``ts`` makes the sample.
SAMPLE = Schema(
    {
        "ts": timestamp,
        "attempt": whole,
        "phase": text,
        "epoch": whole,
        "batch": whole,
        "step": whole,
        "imgs_per_s": number,
        "loss": number,
        "silences": table(Schema({"s": seconds, "budget": text, "budget_s": seconds}, required=frozenset({"s"}))),
    },
    required=frozenset({"ts"}),
)


class NamedBudget(Protocol):
    """What the log keeps of the budget in force: its name and seconds (a supervisor's Budget has both)."""

    name: str
    seconds: float


class ProgressLog:
    """Appends samples of the beats of one supervisor's attempts to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.files, self.name = files_of(self.path)
        self._last_ts = 0.0
        self._last_phase: Optional[str] = None
        self._last_attempt: Optional[int] = None
        self._stepped = False
        self._silences: Dict[str, Dict[str, Any]] = {}

    def observe(self, attempt: int, previous: Optional[Dict[str, Any]], silent_s: float, budget: NamedBudget, beat: Any) -> None:
        """A progress ``beat`` came ``silent_s`` after ``previous`` (None: the attempt's first), under ``budget``."""
        beat = beat if isinstance(beat, dict) else {}
        phase = STARTUP_PHASE if previous is None else str(previous.get("phase", ""))
        worst = self._silences.get(phase)
        if worst is None or silent_s > worst["s"]:
            self._silences[phase] = {"s": round(silent_s, 3), "budget": budget.name, "budget_s": budget.seconds}
        now = time.time()
        if attempt != self._last_attempt:
            self._stepped = False
        # The attempt's first beat with a step says where it resumed: the lost work is counted from it.
        first_step = "step" in beat and not self._stepped
        self._stepped = self._stepped or first_step
        changed = beat.get("phase") != self._last_phase or attempt != self._last_attempt or first_step
        if not changed and now - self._last_ts < SAMPLE_S:
            return
        sample = {"ts": round(now, 3), "attempt": attempt, **{k: beat[k] for k in KEPT_FIELDS if k in beat}}
        sample["silences"] = self._silences
        self._silences = {}
        self._last_ts, self._last_phase, self._last_attempt = now, beat.get("phase"), attempt
        with contextlib.suppress(OSError):  # best-effort (a refusal is returned and dropped too): see the docstring
            self.files.append(self.name, (json.dumps(sample, sort_keys=True, default=str) + "\n").encode())


def read_samples(path: Path) -> Records:
    """The samples of ``progress.jsonl``, typed, oldest first (see the module's docstring)."""
    files, name = files_of(path)
    return parse_records(files.read_objects(name, SAMPLE_LINE_BYTES, PROGRESS_BYTES, MAX_SAMPLES), SAMPLE)
