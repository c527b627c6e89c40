"""Typed records from the run directory: one parser per file kind, at the edge, and the field rules they share.

Why: what a run directory holds is input from the child (issue 33). A beat with ``"epoch": "2/10"`` made
``status`` compare a string with an int; a progress sample without ``ts``, an event with ``"attempt": null`` and
``"silences": 3`` ended ``report`` with a traceback; one beat claiming ``local_world_size`` 10**9 had the
supervisor build a set of 10**9 ranks. So every record is typed once, where it is read, and nothing
downstream meets a value of the wrong kind.

The rule
  * A :class:`Schema` names each field a reader uses and its kind (:func:`timestamp`, :func:`seconds`,
    :func:`whole`, :func:`text`, a nested schema ...). A field of the wrong kind is **dropped** (as if it were
    absent) and counted; a field that is JSON ``null`` (unknown) is left out too, uncounted, so a reader's
    ``record.get(key, default)`` always meets its default or a value of the kind; a record without a
    ``required`` field, or that is not an object, is **skipped** and counted. Fields no schema names are kept
    as they are when they are plain JSON of bounded depth (a beat's own metrics), and never compared by trainbox.
  * Kinds bound their values: a timestamp is a unix time before the year 5138 (``datetime`` and matplotlib
    take it), a duration at most 31 years, a whole number below 2**63, a number finite (NaN is not equal to
    itself, ``Infinity`` breaks arithmetic); text is one printable line (control characters, which could drive
    the terminal ``status`` prints to, and lone surrogates, which cannot be encoded, are replaced) of at most
    :data:`MAX_TEXT` characters.
  * The parsers never raise: :func:`parse_records` returns a :class:`Records` with what was usable and the
    counts, and :meth:`Records.note` says them in one line for a person (``status`` and ``report`` show it).

The parsers of each file kind: events (:mod:`trainbox.rundir.events`), ``state.json``
(:mod:`trainbox.rundir.state`), progress samples (:mod:`trainbox.rundir.progress`), and here the ones with no
module of their own: beats (``heartbeat.json``, ``heartbeats/rank-<rank>.json``; also inside ``state.json``
and events) and an incident's ``summary.json``. Files are read through :mod:`trainbox.rundir.safe`.

Standard library only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import Got, PathLike, Refusal, RunFiles

#: A unix time in a record: before this one (the year 5138; ``datetime`` goes to 9999) or it is not a time.
MAX_TIMESTAMP = 1e11
#: A duration in a record: at most this many seconds (31 years), so sums and plots of them stay finite.
MAX_SECONDS = 1e9
#: A whole number (a pid, a step, a rank): below this (what a C long holds).
MAX_WHOLE = 2**63 - 1
#: An exit status: within a C int.
MAX_EXIT_CODE = 2**31
#: The largest pid Linux hands out (``PID_MAX_LIMIT``, 4 Mi): a larger one is no process (os.kill and psutil overflow).
MAX_PID = 4 * 1024 * 1024
#: The characters of a text field that are kept (an evidence line is under 300).
MAX_TEXT = 4096
#: Nesting a field no schema names may have (a beat's metrics are flat; deeper is kept out of every dump).
MAX_DEPTH = 16
#: Ranks one node runs (``local_world_size``): torchrun starts one per GPU, or per core on a CPU. A beat
#: claiming more names no node (issue 33 item 6: 10**9 of them exhausted the supervisor's memory).
MAX_LOCAL_RANKS = 1024
#: Rank files read per look: a node's ranks, at most MAX_LOCAL_RANKS, and room for a restart's renumbered ones.
MAX_RANK_FILES = 2 * MAX_LOCAL_RANKS
#: A beat is a small JSON object (well under 1 KiB); anything larger is garbage, not a beat, and is never parsed.
MAX_BEAT_BYTES = 64 * 1024
#: An incident's summary.json (tens of KiB with many ranks' last beats).
MAX_SUMMARY_BYTES = 1 << 20


class _Unusable:
    """What a field kind returns for a value it cannot use (JSON has no such value, so it cannot be confused)."""

    def __repr__(self) -> str:
        return "UNUSABLE"


UNUSABLE: Any = _Unusable()
#: A field kind: the typed value, or UNUSABLE. ``None`` (JSON ``null``) never reaches one: it is left out.
Kind = Callable[[Any], Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(value: Any) -> Any:
    """Any finite number (a loss, img/s)."""
    return value if _is_number(value) and math.isfinite(value) else UNUSABLE


def timestamp(value: Any) -> Any:
    """A unix time in seconds (``ts``, ``killed_ts``)."""
    return float(value) if _is_number(value) and 0 <= value < MAX_TIMESTAMP else UNUSABLE


def seconds(value: Any) -> Any:
    """A duration in seconds (``silent_s``, ``budget_s``)."""
    return float(value) if _is_number(value) and 0 <= value <= MAX_SECONDS else UNUSABLE


def positive(value: Any) -> Any:
    """A number above 0, ``Infinity`` included (a declared ``timeout``: the supervisor caps it, not the parser)."""
    return float(value) if _is_number(value) and value > 0 else UNUSABLE  # NaN is not > 0


def whole(value: Any) -> Any:
    """A whole number from 0 (a pid, a step, a rank, an attempt)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_WHOLE else UNUSABLE


def pid(value: Any) -> Any:
    """A process id: a whole number from 1 to MAX_PID."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_PID else UNUSABLE


def pids(value: Any) -> Any:
    """A list of process ids (``sigkilled``); items that are not are left out."""
    if not isinstance(value, list):
        return UNUSABLE
    return [item for item in (pid(item) for item in value) if item is not UNUSABLE]


def exit_code(value: Any) -> Any:
    """An exit status (negative for a signal, as torchrun reports it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < MAX_EXIT_CODE else UNUSABLE


def flag(value: Any) -> Any:
    return value if isinstance(value, bool) else UNUSABLE


#: Characters a one-line text for a person must not hold: C0 and C1 controls (escape sequences, line breaks).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def text(value: Any) -> Any:
    """One printable line: controls replaced by U+FFFD, lone surrogates by ``?``, at most MAX_TEXT characters."""
    if not isinstance(value, str):
        return UNUSABLE
    value = value[:MAX_TEXT]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub("\ufffd", value)


def texts(value: Any) -> Any:
    """A list of text lines (an ``evidence``); one text is a list of one; items that are not text are left out."""
    if isinstance(value, str):
        return [text(value)]
    if not isinstance(value, list):
        return UNUSABLE
    return [line for line in (text(item) for item in value) if line is not UNUSABLE]


def wholes(value: Any) -> Any:
    """A list of whole numbers (``silent_ranks``); items that are not are left out."""
    if not isinstance(value, list):
        return UNUSABLE
    return [item for item in (whole(item) for item in value) if item is not UNUSABLE]


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (a scalar: 0), counted without recursion (a hostile value may be deep)."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            return depth
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        pending.extend((child, depth + 1) for child in children)
    return deepest


def plain(value: Any) -> Any:
    """Any JSON value nested at most MAX_DEPTH deep (kept as it is, never compared)."""
    return value if _depth(value) <= MAX_DEPTH else UNUSABLE


def table(values: Kind) -> Kind:
    """An object used as a table: text keys (a phase), each value of kind ``values``; unusable entries left out."""

    def kind(value: Any) -> Any:
        if not isinstance(value, dict):
            return UNUSABLE
        found = {}
        for key, item in value.items():
            typed = UNUSABLE if item is None else values(item)
            if typed is not UNUSABLE:
                found[text(key)] = typed
        return found

    return kind


@dataclass(frozen=True)
class Schema:
    """The fields of one kind of record a reader uses, each with its kind; ``required`` ones make the record."""

    fields: Mapping[str, Kind]
    required: FrozenSet[str] = frozenset()

    def parse(self, value: Any) -> Tuple[Optional[Dict[str, Any]], int]:
        """(the typed record, fields dropped); (None, 0) for a value that is not an object or lacks a required field."""
        if not isinstance(value, dict):
            return None, 0
        record: Dict[str, Any] = {}
        dropped = 0
        for key, item in value.items():
            if item is None:
                continue  # unknown, as if absent: every reader's ``get`` then meets its default
            typed = self.fields.get(key, plain)(item)
            if typed is UNUSABLE:
                dropped += 1
            else:
                record[key] = typed
        if not self.required <= record.keys():
            return None, 0
        return record, dropped

    def __call__(self, value: Any) -> Any:
        """The schema as a field kind (a record nested in another)."""
        record, _ = self.parse(value)
        return UNUSABLE if record is None else record


@dataclass(frozen=True)
class Records:
    """What a reader of one file kind found: the typed records, and what it left out (see :meth:`note`)."""

    records: List[Dict[str, Any]]
    #: Lines (or files) that were not a usable record: not JSON, not an object, too long, no required field.
    skipped: int = 0
    #: Fields of usable records that were not of their kind.
    dropped: int = 0
    #: The file itself was refused (a link, a FIFO, a folder ...; MISSING is not a refusal a person needs).
    refused: Optional[Refusal] = None
    #: Only the newest part was read (the file is over its limits).
    truncated: bool = False

    def note(self, name: str) -> Optional[str]:
        """``events.jsonl: 2 lines skipped, 1 field dropped`` (or why it was refused); None when all was well."""
        if self.refused is not None and self.refused is not Refusal.MISSING:
            return self.refused.line(name)
        parts = [f"{self.skipped} unusable line(s) skipped"] if self.skipped else []
        parts += [f"{self.dropped} field(s) of the wrong kind ignored"] if self.dropped else []
        parts += ["only the newest part read"] if self.truncated else []
        return f"{name}: " + ", ".join(parts) if parts else None


def parse_records(got: Got[List[Dict[str, Any]]], schema: Schema) -> Records:
    """Type the objects of a JSON Lines read (:meth:`trainbox.rundir.safe.RunFiles.read_objects`)."""
    if got.value is None:
        return Records([], refused=got.refused)
    records, skipped, dropped = [], got.skipped, 0
    for value in got.value:
        record, lost = schema.parse(value)
        if record is None:
            skipped += 1
        else:
            records.append(record)
            dropped += lost
    return Records(records, skipped, dropped, truncated=got.truncated)


def read_record(files: RunFiles, path: PathLike, limit: int, schema: Schema) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The typed object one file holds, or None and why (the refusal's few words, or "not usable")."""
    got = files.read_object(path, limit)
    if got.value is None:
        return None, (got.refused or Refusal.UNREADABLE).value
    record, _ = schema.parse(got.value)
    return (record, None) if record is not None else (None, "not usable")


def files_of(path: PathLike) -> Tuple[RunFiles, str]:
    """The safe operations of the folder that holds ``path``, and its name: for a reader given one file's path."""
    located = Path(path)
    return RunFiles(located.parent), located.name


# -- beats: heartbeat.json and heartbeats/rank-<rank>.json -------------------------------------------------------
def _local_world_size(value: Any) -> Any:
    found = whole(value)
    return found if found is not UNUSABLE and found <= MAX_LOCAL_RANKS else UNUSABLE


#: What the supervisor, ``status`` and ``report`` read of a beat (docs/contract.md, "Beats"); its metrics pass as they are.
BEAT = Schema(
    {
        "ts": timestamp,
        "pid": pid,
        "phase": text,
        "timeout": positive,
        "step": whole,
        "epoch": whole,
        "epochs": whole,
        "batch": whole,
        "batches": whole,
        "steps": whole,
        "imgs_per_s": number,
        "loss": number,
        "rank": whole,
        "local_rank": whole,
        "world_size": whole,
        "local_world_size": _local_world_size,
        "device": table(plain),
        "pattern": text,
    }
)


def parse_beat(value: Any) -> Optional[Dict[str, Any]]:
    """A beat, typed (see :data:`BEAT`); None when ``value`` is not an object."""
    return BEAT.parse(value)[0]


def read_beat(files: RunFiles, path: PathLike) -> Optional[Dict[str, Any]]:
    """The beat in ``path``; None when it is missing, refused (a FIFO, a link ...), over MAX_BEAT_BYTES or not one."""
    return read_record(files, path, MAX_BEAT_BYTES, BEAT)[0]


def rank_files(run: RunDir) -> List[int]:
    """The ranks whose files ``heartbeats/`` holds (at most MAX_RANK_FILES, by name; none when it is refused)."""
    listed = run.files.list_dir(run.rank_heartbeat.directory, MAX_RANK_FILES).value or []
    return [rank for rank in map(run.rank_heartbeat.number_of, listed) if rank is not None]


# -- an incident's summary.json ------------------------------------------------------------------------------------
#: What ``report`` shows of a stall's summary when its event lacks it (older supervisors wrote it there only).
SUMMARY = Schema({"cause": text, "evidence": texts, "silent_ranks": wholes, "write_s": seconds, "bytes": whole})


def read_summary(files: RunFiles, path: PathLike) -> Optional[Dict[str, Any]]:
    return read_record(files, path, MAX_SUMMARY_BYTES, SUMMARY)[0]


def first_text(value: Optional[Sequence[str]]) -> Optional[str]:
    """The first line of a typed ``texts`` field, or None."""
    return value[0] if value else None
