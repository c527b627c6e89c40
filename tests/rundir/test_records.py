"""The typed parsers (train/rundir/records.py and the schemas of events, state and progress): each field of the
wrong kind is left out and counted, a record without what makes it is skipped, text is one printable line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainbox.rundir import events, progress, records, state
from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import BEAT, MAX_LOCAL_RANKS, Records, Schema, parse_beat, text, timestamp, whole
from trainbox.rundir.safe import Refusal


def test_a_beat_keeps_its_kinds_and_drops_the_rest() -> None:
    beat = {"epoch": "2/10", "batch": 3, "step": True, "ts": 1.8e9, "pid": 2**40, "local_world_size": 10**9, "loss": 0.5}
    assert BEAT.parse(beat) == ({"batch": 3, "ts": 1.8e9, "loss": 0.5}, 4)
    assert parse_beat({"local_world_size": MAX_LOCAL_RANKS, "rank": 3, "timeout": float("inf")}) == {
        "local_world_size": MAX_LOCAL_RANKS,
        "rank": 3,
        "timeout": float("inf"),
    }, "a declared Infinity is the supervisor's to cap (24 h), not the parser's"
    assert parse_beat([1]) is None and parse_beat("beat") is None


def test_null_is_unknown_and_a_record_needs_what_makes_it() -> None:
    schema = Schema({"ts": timestamp, "n": whole}, required=frozenset({"ts"}))
    assert schema.parse({"ts": 1.0, "n": None}) == ({"ts": 1.0}, 0), "null: as if absent, not counted"
    assert schema.parse({"ts": None, "n": 1}) == (None, 0) and schema.parse({"n": 1}) == (None, 0)
    assert schema.parse({"ts": 1.0, "other": {"a": [1, {"b": None}]}}) == ({"ts": 1.0, "other": {"a": [1, {"b": None}]}}, 0)
    deep: object = 1
    for _ in range(records.MAX_DEPTH + 2):
        deep = [deep]
    assert schema.parse({"ts": 1.0, "deep": deep}) == ({"ts": 1.0}, 1), "a value nested past MAX_DEPTH is dropped"


@pytest.mark.parametrize("value", [-1, 1e11, float("nan"), float("inf"), "1.8e9", True, None, [1]])
def test_a_timestamp_is_a_unix_time_datetime_can_take(value: object) -> None:
    assert timestamp(value) is records.UNUSABLE


def test_text_is_one_printable_line() -> None:
    assert text("phase\x1b]0;pwned\x07 train\n") == "phase\ufffd]0;pwned\ufffd train\ufffd", "no escape reaches a terminal"
    assert text("\ud800lone") == "?lone", "a lone surrogate (from JSON's \\ud800) cannot be encoded: replaced"
    assert len(text("x" * 10_000)) == records.MAX_TEXT
    assert text(7) is records.UNUSABLE


def test_every_event_field_the_readers_use_has_a_kind(tmp_path: Path) -> None:
    lines = [
        {
            "ts": 1.8e9,
            "event": "stall",
            "attempt": None,
            "evidence": "one line",
            "silent_ranks": [1, "2", -3],
            "sigkilled": [2**40, 7],
        },
        {"ts": 1.8e9, "event": "restart", "attempt": "1", "profile": ["safe"], "delay_s": -1},
        {"event": "exit"},
        [1],
    ]
    RunDir(tmp_path).events.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"torn')
    history = events.history(RunDir(tmp_path).events)
    assert history.records == [
        {"ts": 1.8e9, "event": "stall", "evidence": ["one line"], "silent_ranks": [1], "sigkilled": [7]},
        {"ts": 1.8e9, "event": "restart"},
    ]
    assert (history.skipped, history.dropped) == (3, 3), "no ts, not an object, torn; attempt, profile, delay_s"
    assert history.note("events.jsonl") == "events.jsonl: 3 unusable line(s) skipped, 3 field(s) of the wrong kind ignored"


def test_a_sample_needs_a_time_and_silences_are_a_table(tmp_path: Path) -> None:
    path = RunDir(tmp_path).progress
    samples = [{"step": 1}, {"ts": 1.8e9, "silences": 3}, {"ts": 1.8e9, "silences": {"train": {"s": 0.5}, "val": {"s": "x"}}}]
    path.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    read = progress.read_samples(path)
    assert read.records == [{"ts": 1.8e9}, {"ts": 1.8e9, "silences": {"train": {"s": 0.5}}}]
    assert (read.skipped, read.dropped) == (1, 1)


def test_state_json_refused_or_odd_is_one_line(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert state.read(run.state) == (None, f"no supervisor state at {run.state} (not started yet?)")
    run.state.mkdir()
    assert state.read(run.state) == (None, f"unreadable supervisor state at {run.state} (a folder where a file belongs)")
    run.state.rmdir()
    run.state.write_text(json.dumps({"state": "running", "supervisor_pid": "4242", "budget": {"seconds": "5"}}))
    assert state.read(run.state) == ({"state": "running", "budget": {}}, "")


def test_a_note_says_a_refusal_but_not_a_missing_file() -> None:
    assert Records([], refused=Refusal.MISSING).note("events.jsonl") is None
    assert Records([], refused=Refusal.FIFO).note("events.jsonl") == "events.jsonl: a FIFO, refused"
    assert Records([{}], truncated=True).note("progress.jsonl") == "progress.jsonl: only the newest part read"
