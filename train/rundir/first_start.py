"""When a run first started: the one record of it, in ``first-start.json``.

A run's checkpoints are those written since it first started, its earlier attempts and earlier supervisors of the
same run directory included (:mod:`trainbox.supervise.resume.resumer`); anything older in the same folders is
another run's. So the first start is written once, as the first supervisor of a run directory begins, and every
later one (``--resume``, the Ctrl-C line, ``--run-dir`` of an existing run) reads it back unchanged. The events
cannot stand in for it: ``events.jsonl`` is read from its newest part only, and a long run's first ``start`` falls
out of it. A run directory made before this file existed gets its first ``start`` event's time, written down then.

The file is input from a run directory: a torn, hand-edited or refused one counts as absent, never as an error.
Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List

from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import Schema, read_record, timestamp

#: ``first-start.json``: ``{"ts": <unix seconds>}``.
FIRST_START = Schema({"ts": timestamp}, required=frozenset({"ts"}))
#: The file is a few bytes; anything longer is not ours.
FIRST_START_BYTES = 4096


@dataclass(frozen=True)
class FirstStart:
    """When the run first started (unix seconds), and whether it starts now: a new run, nothing of it before."""

    ts: float
    new: bool


def first_start(run: RunDir, events: List[Dict[str, Any]], now: float) -> FirstStart:
    """The run's first start: the recorded one, else its first ``start`` event (``events``), else ``now`` (a new run),
    written down when it was not yet (best effort: a run directory that refuses it only forgets it)."""
    found, _ = read_record(run.files, run.first_start, FIRST_START_BYTES, FIRST_START)
    if found is not None and found["ts"] <= now:
        return FirstStart(found["ts"], new=False)
    starts = [r["ts"] for r in events if r.get("event") == "start" and isinstance(r.get("ts"), (int, float))]
    began = FirstStart(min(starts), new=False) if starts else FirstStart(now, new=True)
    try:
        run.files.replace(run.first_start, json.dumps({"ts": began.ts}).encode() + b"\n")
    except OSError:
        pass  # forgotten, as the docstring says; a full disk is named where the run's history is written (DiskFull)
    return began
