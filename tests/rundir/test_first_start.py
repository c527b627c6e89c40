"""When a run first started, in milliseconds: written once, read back by every later supervisor, any file fuzzed."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainbox.rundir.first_start import FirstStart, first_start
from trainbox.rundir.layout import RunDir


def test_a_new_run_starts_now_and_every_later_supervisor_reads_that_back(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert first_start(run, [], 1000.0) == FirstStart(1000.0, new=True)
    assert json.loads(run.first_start.read_text()) == {"ts": 1000.0}
    later = [{"event": "start", "ts": 5000.0}]  # the events kept only the newest part of a long run
    assert first_start(run, later, 9000.0) == FirstStart(1000.0, new=False)


def test_a_run_directory_from_before_the_record_takes_its_first_start_event(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    events = [{"event": "stall", "ts": 10.0}, {"event": "start", "ts": 700.0}, {"event": "start", "ts": 800.0}]
    assert first_start(run, events, 900.0) == FirstStart(700.0, new=False)
    assert first_start(run, [], 950.0) == FirstStart(700.0, new=False), "written down then"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=64), st.just(b'{"ts": 1e300}'), st.just(b'{"ts": 2000}')))
def test_a_torn_or_hand_edited_record_counts_as_absent(tmp_path: Path, content: bytes) -> None:
    run = RunDir(tmp_path / f"case-{len(list(tmp_path.iterdir()))}")
    run.root.mkdir()
    run.first_start.write_bytes(content)
    began = first_start(run, [], 1500.0)
    assert began.ts <= 1500.0 and began.new == (began.ts == 1500.0)
    assert first_start(run, [], 1600.0) == FirstStart(began.ts, new=False)
