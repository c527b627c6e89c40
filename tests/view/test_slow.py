"""Slow periods, from the events the supervisor wrote, as status, the live view and the report show them."""

from __future__ import annotations

import base64
import datetime
import io
import json
import re
from pathlib import Path
from typing import Any, Dict, List

from PIL import Image

from trainbox.view import html_report, live, runview, slow, status

NOW = 1_800_000_000.0
EVIDENCE = ["pid 4121 (python) outside the run: 97 % CPU (baseline 0 %)", "outside the run: 160 % CPU in all (baseline 12 %)"]


def slow_event(ts: float, since: float, **extra: Any) -> Dict[str, Any]:
    fields = {"ratio": 0.41, "phase": "train", "suspect": "contention", "evidence": EVIDENCE, "action": "report"}
    return {"event": "slow", "attempt": 0, "ts": ts, "since_ts": since, **fields, **extra}


def test_a_period_opens_at_its_change_and_closes_when_the_pace_is_back_or_the_run_ends() -> None:
    events = [
        {"event": "start", "ts": NOW - 3000},
        slow_event(NOW - 2000, NOW - 2040),
        {"event": "recovered", "ts": NOW - 1500, "recovered_ts": NOW - 1510, "slow_s": 530},
        slow_event(NOW - 1000, NOW - 1030, suspect="memory", action="restart"),
        {"event": "restart", "ts": NOW - 900, "after": "slow"},  # a restart does not end it
        {"event": "exit", "ts": NOW - 100},
    ]
    first, second = slow.periods(events)
    assert (first.since_ts, first.flagged_ts, first.ended_ts, first.recovered) == (NOW - 2040, NOW - 2000, NOW - 1510, True)
    assert (second.ended_ts, second.recovered, second.suspect, second.action) == (NOW - 100, False, "memory", "restart")
    assert slow.total_s([first, second], NOW) == 530 + 930
    assert slow.going_on(events) is None
    going = slow.going_on(events[:4])
    assert going is not None and going.suspect == "memory" and going.ended_ts is None


def test_an_attempt_ended_by_on_slow_restart_is_ended_by_slow(tmp_path: Path) -> None:
    events = [
        {"event": "start", "attempt": 0, "ts": NOW - 600, "profile": "fast"},
        slow_event(NOW - 300, NOW - 340, suspect="memory", action="restart"),
        {"event": "restart", "attempt": 1, "ts": NOW - 200, "after": "slow"},
        {"event": "start", "attempt": 1, "ts": NOW - 198, "profile": "fast"},
    ]
    first, second = runview.read(make_run(tmp_path, events), now=NOW).attempts
    assert (first.ended_by, first.ended_ts) == ("slow", NOW - 200) and second.ended_by == "running"


def test_the_line_says_how_much_of_its_pace_the_run_keeps_since_when_and_why() -> None:
    since = datetime.datetime(2026, 11, 24, 14, 2).timestamp()
    (period,) = slow.periods([slow_event(since + 40, since)])
    assert period.ended_ts is None and period.seconds(since + 100) == 100
    assert period.line() == "slow: 0.41x of this run's pace since 14:02 (suspect: contention)"


def test_untrusted_events_read_as_unknown_and_never_raise() -> None:
    events: List[Dict[str, Any]] = [
        {"event": "slow", "ts": "yesterday"},
        {"event": "slow", "ts": NOW, "since_ts": NOW + 50, "ratio": "fast", "evidence": {"a": 1}, "suspect": None, "phase": 3},
        {"event": "recovered", "ts": None, "recovered_ts": "x"},
        {"event": "slow", "ts": NOW + 10, "evidence": "one line"},
    ]
    first, second = slow.periods(events)
    assert (first.since_ts, first.ratio, first.evidence, first.suspect, first.phase) == (NOW, None, (), "unknown", None)
    assert first.ended_ts == NOW and second.evidence == ("one line",)
    assert "a fraction of this run's pace" in first.line()


def make_run(tmp_path: Path, events: List[Dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"state": "running", "attempt": 0}))
    (run / "heartbeat.json").write_text(json.dumps({"step": 900, "phase": "train", "ts": NOW - 1}))
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    samples = [{"ts": NOW - 600 + 5 * n, "attempt": 0, "phase": "train", "step": 10 * n - (6 * (n - 80) if n > 80 else 0)}
               for n in range(120)]  # fmt: skip
    (run / "progress.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run


def test_status_and_the_live_view_show_the_slowdown_under_way(tmp_path: Path) -> None:
    since = NOW - 200
    run = make_run(tmp_path, [{"event": "start", "attempt": 0, "ts": NOW - 600}, slow_event(NOW - 160, since)])
    lines = status.render(run, status.read(run), now=NOW)
    clock = datetime.datetime.fromtimestamp(since).strftime("%H:%M")
    expected = f"pace      slow: 0.41x of this run's pace since {clock} (suspect: contention); {EVIDENCE[0]}"
    assert expected in lines and "pace      slow for 3m20s in 1 episode(s)" in lines
    view = runview.read(run, now=NOW)
    assert live.slow(view) == f"slow: 0.41x of this run's pace since {clock} (suspect: contention)"
    assert live.slow(view) in live.plain_line(view, None)


def test_a_run_back_at_its_pace_shows_only_the_time_it_spent_slow(tmp_path: Path) -> None:
    events = [{"event": "start", "attempt": 0, "ts": NOW - 600}, slow_event(NOW - 160, NOW - 200)]
    run = make_run(tmp_path, [*events, {"event": "recovered", "ts": NOW - 50, "recovered_ts": NOW - 50}])
    lines = status.render(run, status.read(run), now=NOW)
    assert [line for line in lines if line.startswith("pace")] == ["pace      slow for 2m30s in 1 episode(s)"]
    assert live.slow(runview.read(run, now=NOW)) is None


def test_the_report_shades_and_lists_the_slow_periods(tmp_path: Path) -> None:
    events = [{"event": "start", "attempt": 0, "ts": NOW - 600}, slow_event(NOW - 160, NOW - 200)]
    run = make_run(
        tmp_path, [*events, {"event": "recovered", "ts": NOW - 50, "recovered_ts": NOW - 50}, {"event": "exit", "ts": NOW}]
    )
    page = html_report.render(runview.read(run, now=NOW), run / "report.html")
    table = page[page.index("id='slow'") :]
    assert "0.41× of its pace" in table and "contention" in table and "2m30s" in table
    assert "pid 4121 (python) outside the run: 97 % CPU (baseline 0 %)" in table
    assert "time spent slow</td><td>2m30s (25 %) in 1 period(s)" in page
    chart = Image.open(io.BytesIO(base64.b64decode(re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)[0])))
    shaded = [pixel for pixel in chart.convert("RGB").getdata() if pixel[0] > 245 and 225 <= pixel[1] <= 245 and pixel[2] < 225]
    assert len(shaded) > 1000, "the slow period is shaded in the slow colour"
