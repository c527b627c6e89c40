"""Every reader of run-directory data, fuzzed (issue 33): arbitrary bytes, JSON of every shape and hostile file
types (links, a FIFO, a folder, a socket, a 1 GiB sparse file: tests/rundir/hostile.py) at each file a reader
reads. Each property asserts the reader returns (no exception), within a time bound and a memory bound (it runs
in a forked child with an address-space limit: :func:`tests.rundir.hostile.assert_bounded`), and that what it
returns has the kinds its parser promises.

The readers: the parsers of each file kind (events, ``state.json``, progress samples, beats and rank files, an
incident's ``summary.json``, the container's exit record, torchrun's error file) and what reads through them: the
supervisor's rank follower (:class:`trainbox.supervise.ranks.JobBeats`), ``health``, ``status``, the live view's
lines, the report's view and its page, ``invoke train``'s restart line and the Prometheus metrics (``trainbox
metrics``: its textfile must stay what node_exporter parses, whatever the run directory holds).

Example counts are sized so that all fuzz tests of the suite (these and tests/rundir/test_safe.py's properties)
take under two minutes on a 2-core CI machine: see :data:`EXAMPLES` and docs/development.md's Tests section.
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple, Union

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.rundir import hostile
from tests.rundir.hostile import Kind, assert_bounded, plant, put, scene
from trainbox.container import launch  # imported once here: each forked example has it (the Docker SDK is slow to import)
from trainbox.errors import UserError
from trainbox.rundir import events, exit_record, owner, progress, records, state
from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import BEAT, SUMMARY
from trainbox.supervise import health, ranks, watchdog
from trainbox.supervise.stalls.budgets import BudgetPolicy
from trainbox.view import html_report, live, metrics, runview, status

#: Examples per property: each forks a child and makes a scene (a temporary folder with a few files). Measured:
#: about 0.1 s an example on a 2-core machine; the report's page (matplotlib) about 1 s.
EXAMPLES = 40
PAGE_EXAMPLES = 8
#: A correct reader takes milliseconds; the bounds are for a runaway one (a blocking FIFO, a whole 1 GiB read).
SECONDS = 20.0
MIB = 128.0
PAGE_MIB = 512.0
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: What stands at a reader's path: nothing, a hostile kind, or bytes.
Entry = Union[None, Kind, bytes]


# -- what a run directory may hold -------------------------------------------------------------------------------
def _times() -> st.SearchStrategy[Any]:
    """Mostly plausible unix times, sometimes any JSON value (a reader must not assume one)."""
    return st.one_of(st.floats(min_value=1.7e9, max_value=1.9e9), hostile.json_values())


def _lines(objects: st.SearchStrategy[Dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """JSON Lines of ``objects`` mixed with what is not an object (garbage, other shapes, the hostile blobs)."""
    garbage = st.one_of(st.binary(max_size=64), hostile.json_values().map(hostile.dumps), st.sampled_from(hostile.HOSTILE_BLOBS))
    line = st.one_of(objects.map(hostile.dumps), objects.map(hostile.dumps), garbage)
    return st.lists(line, max_size=12).map(lambda lines: b"\n".join(lines) + b"\n")


def _objects(keys: Sequence[str], **fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[Dict[str, Any]]:
    """Objects with a reader's ``keys`` holding any shape, and ``fixed`` fields usually of their kind."""
    extra = st.fixed_dictionaries({}, optional=fixed) if fixed else st.just({})
    return st.tuples(hostile.json_objects(keys), extra).map(lambda pair: {**pair[0], **pair[1]})


EVENT_KEYS = tuple(events.EVENT.fields)
EVENT_OBJECTS = _objects(
    EVENT_KEYS, ts=_times(), event=st.sampled_from(events.EVENTS), last_beat=hostile.json_objects(tuple(BEAT.fields))
)
SAMPLE_OBJECTS = _objects(
    tuple(progress.SAMPLE.fields),
    ts=_times(),
    silences=st.dictionaries(st.text(max_size=6), hostile.json_objects(("s", "budget", "budget_s")), max_size=3),
)
#: Numbers at the edges a reader may overflow on: a pid past what the kernel hands out, a rank past any node.
EDGES = st.one_of(st.integers(), st.sampled_from([0, 2**22, 2**22 + 1, 2**31, 2**63 - 1, 2**63, 10**30]))
BEAT_OBJECTS = _objects(tuple(BEAT.fields), ts=_times(), rank=EDGES, pid=EDGES, local_world_size=EDGES)
STATE_OBJECTS = _objects(
    tuple(state.STATE.fields),
    state=st.sampled_from([s.value for s in state.State]),
    budget=hostile.json_objects(("name", "seconds")),
    updated_ts=_times(),
    supervisor_pid=EDGES,
    heartbeat=BEAT_OBJECTS,  # the counter read from the output, which status shows when nothing beats
)


def _content(strategy: st.SearchStrategy[bytes], keys: Sequence[str] = ()) -> st.SearchStrategy[Entry]:
    """At a file's place: nothing, a hostile kind, arbitrary content, or ``strategy``'s (twice as likely)."""
    return st.one_of(st.none(), hostile.kinds(), hostile.file_bytes(keys), strategy, strategy)


def _put(path: Path, entry: Entry, outside: hostile.Outside) -> None:
    if isinstance(entry, Kind):
        plant(path, entry, outside)
    elif entry is not None:
        put(path, entry)


#: The files of a run directory a reader may read, and what may stand there (RunDir's names, as the readers use them).
RUN_FILES: Dict[str, st.SearchStrategy[Entry]] = {
    "events.jsonl": _content(_lines(EVENT_OBJECTS), EVENT_KEYS),
    "state.json": _content(STATE_OBJECTS.map(hostile.dumps), tuple(state.STATE.fields)),
    "heartbeat.json": _content(BEAT_OBJECTS.map(hostile.dumps), tuple(BEAT.fields)),
    "heartbeats/rank-0.json": _content(BEAT_OBJECTS.map(hostile.dumps), tuple(BEAT.fields)),
    "heartbeats/rank-1.json": _content(BEAT_OBJECTS.map(hostile.dumps), tuple(BEAT.fields)),
    "progress.jsonl": _content(_lines(SAMPLE_OBJECTS), tuple(progress.SAMPLE.fields)),
    "incidents/20261123155507-0/summary.json": _content(hostile.json_objects(tuple(SUMMARY.fields)).map(hostile.dumps)),
    "train/args.yaml": _content(st.sampled_from([b"epochs: 10\nbatch: 16\n", b"epochs: x\nbatch: [1]\n", b"{" * 10_000])),
    "train/results.csv": _content(st.sampled_from([b"epoch,metrics/mAP50(B)\n1,0.5\n2,nan\n", b"epoch\n" + b"9" * 200_000])),
    "train/weights/last.pt": st.one_of(st.none(), hostile.kinds(), st.just(b"\x80\x02")),
    "container-exit.json": _content(hostile.json_objects(("code", "hostname")).map(hostile.dumps)),
    "logs/attempt-0.torchrun-error.json": _content(hostile.json_objects(("message",)).map(hostile.dumps)),
}
#: A whole run directory: an entry for every file (most runs hold most of them).
RUN_DIRS = st.fixed_dictionaries({}, optional=RUN_FILES)
#: Events that point at the incident folder under fuzz, or outside the run directory.
INCIDENT_NAMES = ("20261123155507-0", "..", "/etc", "/runs/r/incidents/20261123155507-0", "20261123155507-0/../..")


def _fuzzed(files: Mapping[str, Entry], read: Callable[[RunDir], object], mib: float = MIB) -> None:
    """Plant ``files`` in a fresh run directory and run ``read`` on it, bounded; nothing outside may change."""
    with scene() as made:
        for name, entry in files.items():
            _put(made.run / name, entry, made.outside)
        run = RunDir(made.run)
        assert_bounded(lambda: read(run), SECONDS, mib)
        made.assert_outside_intact()


# -- the kinds the parsers promise -------------------------------------------------------------------------------
def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _assert_typed(record: Mapping[str, Any], kinds: Mapping[str, Callable[[Any], bool]]) -> None:
    for key, holds in kinds.items():
        assert key not in record or holds(record[key]), (key, record[key])


WHOLE = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0  # noqa: E731
TEXT = lambda value: isinstance(value, str)  # noqa: E731
PID = lambda value: WHOLE(value) and 0 < value <= records.MAX_PID  # noqa: E731
TIME = lambda value: _number(value) and 0 <= value < records.MAX_TIMESTAMP  # noqa: E731


def _check_history(run: RunDir) -> None:
    read = events.history(run.events)
    for record in read.records:
        assert TIME(record["ts"]) and TEXT(record["event"]), record
        _assert_typed(record, {"attempt": WHOLE, "cause": TEXT, "silent_s": _number, "evidence": lambda v: isinstance(v, list)})
    read.note("events.jsonl")
    watchdog.hangs_in_a_row(read.records)


def _check_state(run: RunDir) -> None:
    found, why = state.read(run.state)
    assert (found is None) == bool(why)
    if found is not None:
        _assert_typed(found, {"state": TEXT, "supervisor_pid": PID, "updated_ts": TIME, "budget": lambda v: isinstance(v, dict)})
    health.check(run.root, now=1.8e9)
    command = owner.recorded_command(run)
    assert command is None or (TEXT(command) and command)
    try:
        owner.check(run.root, "train")
    except UserError as refused:
        assert str(refused).startswith(f"{run.root} holds a run of `") and command not in (None, "train")


def _check_samples(run: RunDir) -> None:
    for sample in progress.read_samples(run.progress).records:
        assert TIME(sample["ts"]), sample
        for seen in sample.get("silences", {}).values():
            assert _number(seen["s"]), seen


def _check_beats(run: RunDir) -> None:
    beat = records.read_beat(run.files, run.heartbeat)
    if beat is not None:
        _assert_typed(beat, {"epoch": WHOLE, "pid": PID, "local_world_size": lambda v: WHOLE(v) and v <= records.MAX_LOCAL_RANKS})
    beats = ranks.JobBeats(run, BudgetPolicy(startup_s=10, stall_s=5, factor=3, floor_s=1, min_samples=2), started=0.0)
    for now in (1.0, 2.0):
        beats.poll(now)
        beats.lagging(now)
        json.dumps(beats.report(now), default=str)
    ranks.clear(run)


def _check_small_files(run: RunDir) -> None:
    records.read_summary(run.files, run.incident(20261123155507, 0).summary)
    code = exit_record.recorded(run.root, "c0ffee")
    assert code is None or isinstance(code, int)
    ranks.failure(run.rank_error(0), "Root Cause (first observed failure):\n  rank : 1 (local_rank: 1)\n  exitcode  : -9")


def _check_views(run: RunDir) -> None:
    deadline = datetime.datetime(2026, 11, 24, 7, 0)
    lines = status.render(run.root, status.read(run.root), "healthy", deadline, now=1.8e9)
    assert lines[0] == f"run       {run.root}" and all(isinstance(line, str) for line in lines)
    view = runview.read(run.root, now=1.8e9)
    assert " | " in live.plain_line(view, deadline)
    for stall in view.stalls:
        assert view.loss(stall).seconds >= 0
    view.samples_by_attempt()
    html_report.summary_rows(view, deadline)
    html_report.incident_rows(view, run.root)
    html_report.attempt_rows(view)
    html_report.phase_silences(view)


def _check_page(run: RunDir) -> None:
    view = runview.read(run.root, now=1.8e9)
    page = html_report.render(view, run.report, datetime.datetime(2026, 11, 24, 7, 0))
    assert page.endswith("</html>\n")
    page.encode("utf-8")  # what the report's write does: a lone surrogate from the child would fail it


def _check_metrics(run: RunDir) -> None:
    """The textfile node_exporter reads: it parses, one ``run`` label everywhere, every value a finite number."""
    text = metrics.render(metrics.collect(run.root, now=1.8e9, deadline_ts=1.8e9 + 3600))
    families = list(text_string_to_metric_families(text))
    assert [family.name for family in families][:1] == ["trainbox_state"]
    for family in families:
        for sample in family.samples:
            assert sample.labels["run"] == run.root.name and math.isfinite(sample.value), sample


def _check_restart_line(run: RunDir) -> None:
    inspected = {
        "RestartCount": 1,
        "HostConfig": {"RestartPolicy": {"MaximumRetryCount": 3}},
        "Config": {"Labels": {"io.trainbox.run-dir": str(run.root)}},
    }
    assert launch._restart_line(inspected, {"State": {"StartedAt": "2026-11-23T18:10:00Z"}}).startswith("trainbox: ")


# -- the properties ------------------------------------------------------------------------------------------------
@FUZZ
@given(entry=RUN_FILES["events.jsonl"])
def test_the_history_reader(entry: Entry) -> None:
    _fuzzed({"events.jsonl": entry}, _check_history)


@FUZZ
@given(entry=RUN_FILES["state.json"])
def test_the_state_reader_and_health(entry: Entry) -> None:
    _fuzzed({"state.json": entry}, _check_state)


@FUZZ
@given(entry=RUN_FILES["progress.jsonl"])
def test_the_progress_reader(entry: Entry) -> None:
    _fuzzed({"progress.jsonl": entry}, _check_samples)


@FUZZ
@given(files=st.fixed_dictionaries({}, optional={k: RUN_FILES[k] for k in RUN_FILES if "heartbeat" in k}), folder=hostile.kinds())
def test_the_beat_readers_and_the_rank_follower(files: Dict[str, Entry], folder: Kind) -> None:
    """Beats and rank files, and ``heartbeats/`` itself as any hostile kind when no rank file is planted in it."""
    planted: Dict[str, Entry] = dict(files)
    if not any(name.startswith("heartbeats/") for name in files):
        planted["heartbeats"] = folder
    _fuzzed(planted, _check_beats)


@FUZZ
@given(
    files=st.fixed_dictionaries(
        {},
        optional={
            k: RUN_FILES[k]
            for k in ("incidents/20261123155507-0/summary.json", "container-exit.json", "logs/attempt-0.torchrun-error.json")
        },
    )
)
def test_the_summary_exit_record_and_torchrun_error_readers(files: Dict[str, Entry]) -> None:
    _fuzzed(files, _check_small_files)


@FUZZ
@given(files=RUN_DIRS, incident=st.sampled_from(INCIDENT_NAMES))
def test_status_the_live_view_and_the_reports_tables(files: Dict[str, Entry], incident: str) -> None:
    _fuzzed(_with_a_stall(files, incident), _check_views)


@settings(max_examples=PAGE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=RUN_DIRS, incident=st.sampled_from(INCIDENT_NAMES))
def test_the_report_page(files: Dict[str, Entry], incident: str) -> None:
    html_report._import_matplotlib()  # in the parent: each forked child has it at hand
    _fuzzed(_with_a_stall(files, incident), _check_page, PAGE_MIB)


@FUZZ
@given(entry=RUN_FILES["events.jsonl"])
def test_invoke_trains_restart_line(entry: Entry) -> None:
    _fuzzed({"events.jsonl": entry}, _check_restart_line)


@FUZZ
@given(files=RUN_DIRS)
def test_the_metrics_exporter(files: Dict[str, Entry]) -> None:
    _fuzzed(files, _check_metrics)


def _with_a_stall(files: Dict[str, Entry], incident: str) -> Dict[str, Entry]:
    """``files`` with, when their history is usable bytes, a stall naming ``incident`` appended (so the report's
    incident paths are walked)."""
    history = files.get("events.jsonl")
    if isinstance(history, bytes):
        stall = {"ts": 1.79e9, "event": "stall", "attempt": 0, "incident": incident, "silent_s": 3, "killed_ts": 1.79e9}
        files = dict(files, **{"events.jsonl": history + hostile.dumps(stall) + b"\n"})
    return files


def test_a_sparse_gigabyte_in_every_file_is_bounded() -> None:
    """The 1 GiB sparse file at every path at once: each reader reads a bounded part, never the whole."""
    planted: Dict[str, Entry] = {name: Kind.SPARSE for name in RUN_FILES}
    checks: Tuple[Callable[[RunDir], None], ...] = (
        _check_history,
        _check_state,
        _check_samples,
        _check_beats,
        _check_views,
        _check_metrics,
    )
    for check in checks:
        _fuzzed(planted, check)
