"""`invoke status` from a synthetic run directory, and the .env settings (no Docker)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.rundir import hostile
from tests.supervised import train_cli
from trainbox.container import dotenv
from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir
from trainbox.view import status

NOW = 1_800_000_000.0


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "train" / "weights").mkdir(parents=True)
    (run / "train" / "args.yaml").write_text("epochs: 10\nbatch: 16\n")
    (run / "state.json").write_text(json.dumps({"state": "running", "attempt": 1, "restarts": 1, "stalls": 1}))
    beat = {"epoch": 3, "batch": 5, "step": 25, "phase": "train", "imgs_per_s": 32.0, "ts": NOW - 4}
    (run / "heartbeat.json").write_text(json.dumps(beat))
    stall = {"event": "stall", "attempt": 0, "cause": "loader_deadlock", "evidence": ["main thread in _try_get_data", "x"]}
    events = [{"event": "start", "attempt": 0}, stall, {"event": "restart", "attempt": 0}]
    events = [dict(event, ts=NOW - 100 + n) for n, event in enumerate(events)]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"torn')
    last = run / "train" / "weights" / "last.pt"
    last.write_bytes(b"")
    os.utime(last, (NOW - 90, NOW - 90))
    return run


def test_progress_and_eta(tmp_path: Path) -> None:
    progress = status.read(make_run(tmp_path))
    assert progress.batches_per_epoch == 10  # (25 - 5) steps over 2 finished epochs
    assert progress.eta_s() == pytest.approx((100 - 25) * 16 / 32.0)
    assert (progress.count("restart"), progress.count("stall"), progress.count("crash")) == (1, 1, 0)


def test_under_torchrun_the_lowest_ranks_beat_is_the_progress(tmp_path: Path) -> None:
    run = make_run(tmp_path)  # its heartbeat.json: the launcher's (Ultralytics' DDP launcher beats only its setup)
    (run / "heartbeat.json").write_text(json.dumps({"phase": "setup", "ts": NOW - 60}))
    files = RunDir(run).rank_heartbeat
    files.directory.mkdir()
    for rank, step in ((3, 24), (2, 25)):
        files(rank).write_text(json.dumps({"rank": rank, "epoch": 3, "batch": 5, "step": step}))
    assert status.read(run).beat["rank"] == 2, "this node's lowest rank"


def test_render_with_deadline(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    now = datetime.datetime.fromtimestamp(NOW)
    lines = status.render(run, status.read(run), "healthy", now + datetime.timedelta(hours=1), now=NOW)
    text = "\n".join(lines)
    assert "epoch 3/10, batch 5/10" in text and "32.0 img/s" in text
    assert "restarts  1, stalls 1, crashes 0" in text
    assert "stall     attempt 0: loader_deadlock (main thread in _try_get_data)" in lines, "the cause and first evidence line"
    assert "checkpoint last.pt, 1m30s old" in text and "health    healthy" in text
    assert "makes it with" in text
    late = status.render(run, status.read(run), None, now + datetime.timedelta(seconds=10), now=NOW)
    assert "late by" in late[-1]


def test_deadline_parsing() -> None:
    now = datetime.datetime(2026, 11, 21, 23, 0)
    assert status.parse_deadline("07:00", now) == datetime.datetime(2026, 11, 22, 7, 0)
    assert status.parse_deadline("2026-11-21T23:30", now) == datetime.datetime(2026, 11, 21, 23, 30)
    utc = datetime.datetime(2026, 11, 21, 23, 30, tzinfo=datetime.timezone.utc)
    assert status.parse_deadline("2026-11-21T23:30+00:00", now) == utc.astimezone().replace(tzinfo=None)
    with pytest.raises(UserError):
        status.parse_deadline("soon", now)


def test_missing_run_dir_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        status.read(tmp_path / "nope")


def test_dotenv_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINBOX_KFD_DEVICE", str(tmp_path / "kfd"))
    monkeypatch.setenv("TRAINBOX_TORCH_VERSION", "9.9.9")
    monkeypatch.delenv("TRAINBOX_CA_CERTS", raising=False)
    values = dotenv.settings("cpu")
    assert values["COMPOSE_PROFILES"] == "cpu" and values["TORCH_VERSION"] == "9.9.9"
    assert values["TRAINBOX_RENDER_GID"].isdigit() and values["EXTRA_CA_CERTS_B64"] == ""
    rendered = dotenv.render(values)
    assert rendered.startswith("# Generated") and "\nTORCH_VERSION=9.9.9\n" in rendered


def write_events(run: Path, *records: dict) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def runs_of_every_route(runs: Path) -> None:
    """invoke train's runs/<profile>-<time>, compose's runs/demo (made first, trained last), a native run, odd ones."""
    write_events(runs / "demo", {"event": "start", "ts": NOW - 50}, {"event": "exit", "code": 0, "ts": NOW - 10})
    os.utime(runs / "demo", (NOW - 900, NOW - 900))
    write_events(runs / "safe-20261124-2340", {"event": "start", "ts": NOW - 500}, {"event": "exit", "code": 0, "ts": NOW - 400})
    os.utime(runs / "safe-20261124-2340", (NOW - 5, NOW - 5))  # touched later (a report rewritten): not an event
    write_events(runs / "trainbox", {"event": "start", "ts": "yesterday"}, {"torn": True})  # untrusted: no usable ts
    os.utime(runs / "trainbox", (NOW - 800, NOW - 800))
    (runs / "made-not-started").mkdir()
    os.utime(runs / "made-not-started", (NOW - 20, NOW - 20))
    (runs / "notes.txt").write_text("not a run")


def test_the_newest_run_is_the_one_with_the_latest_last_event(tmp_path: Path) -> None:
    runs_of_every_route(tmp_path / "runs")
    assert status.newest_run(tmp_path / "runs") == tmp_path / "runs" / "demo"
    write_events(tmp_path / "runs" / "fast-20261125-0001", {"event": "start", "ts": NOW - 1})
    assert status.newest_run(tmp_path / "runs").name == "fast-20261125-0001"
    with pytest.raises(UserError, match="no run found under"):
        status.newest_run(tmp_path / "empty")


def test_invoke_status_and_trainbox_status_show_the_newest_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from trainbox import cli
    from trainbox.container import launch

    runs_of_every_route(tmp_path / "runs")
    monkeypatch.setenv("TRAINBOX_RUNS_HOST", str(tmp_path / "runs"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # no engine: no container health to add
    assert launch.locate(tmp_path, None, None) == (tmp_path / "runs" / "demo", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAIN_RUN_DIR", raising=False)
    assert cli.main(["status"]) == 0
    assert capsys.readouterr().out.startswith(
        f"run       {Path('runs') / 'demo'} (the newest run under runs/; --run-dir for another)\n"
    )


def test_a_finished_run_says_when_and_how_it_ended_and_nothing_else(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "state.json").write_text(json.dumps({"state": "succeeded", "attempt": 1, "restarts": 1, "stalls": 1}))
    with (run / "events.jsonl").open("a") as events:
        events.write("\n" + json.dumps({"event": "exit", "attempt": 1, "code": 0, "reason": "completed", "ts": NOW - 60}) + "\n")
    lines = status.render(run, status.read(run), "unhealthy (container exited)", now=NOW)
    finished = datetime.datetime.fromtimestamp(NOW - 60).strftime("%Y-%m-%d %H:%M:%S")
    assert lines[1] == f"state     succeeded (attempt 1), finished at {finished}, exit 0"
    assert lines[2] == "trained   epoch 3/10"
    text = "\n".join(lines)
    assert not any(word in text for word in ("health", "phase", "eta", "last beat", "img/s")), text


def test_a_child_that_does_not_beat_shows_the_counter_read_from_its_output_and_its_rung(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    read = {"phase": "train", "epoch": 0, "batch": 20, "batches": 40, "pattern": "tqdm", "ts": NOW - 3}
    state = {"state": "running", "attempt": 1, "profile": "careful", "progress_source": "output", "heartbeat": read}
    (run / "state.json").write_text(json.dumps(state))
    lines = status.render(run, status.read(run), now=NOW)
    assert "state     running (attempt 1, profile careful)" in lines, "the profile, or a ladder file's rung"
    assert "progress  epoch 0, batch 20/40, phase train, last beat 0m03s ago (read from its output: tqdm)" in lines
    state["heartbeat"] = {"step": 1200, "pattern": "words", "ts": "not a time"}
    (run / "state.json").write_text(json.dumps(state))
    assert "progress  step 1200, last beat 0m00s ago (read from its output: words)" in status.render(
        run, status.read(run), now=NOW
    )
    state["heartbeat"] = ["not", "a", "beat"]
    (run / "state.json").write_text(json.dumps(state))
    assert "progress  no heartbeat yet" in status.render(run, status.read(run), now=NOW)


def test_the_ladder_line_is_the_policys_last_word_and_survives_garbage() -> None:
    probe = {"rung": "fast", "kind": "probe", "policy": "cost", "reason": "probing fast", "lost_to_stalls_s": 310.0,
             "safety_would_cost_s": 5400.0}  # fmt: skip
    events = [{"event": "restart", "ladder": None}, {"event": "probe", "ladder": probe}, {"event": "stall", "ladder": {}}]
    line = status.ladder_line(events)
    assert line == (
        "fast (probe, --ladder-policy cost): stalls cost 5m10s, the safest rung would have cost 1h30m more; probing fast"
    )
    assert status.ladder_line([{"event": "restart"}]) is None
    odd = status.ladder_line([{"event": "restart", "ladder": {"lost_to_stalls_s": "x", "safety_would_cost_s": [1]}}])
    assert odd is not None and odd.startswith("? (?, --ladder-policy ?): stalls cost")


def test_the_newest_checkpoint_a_command_wrote_and_what_a_restart_redid_are_shown(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "train" / "weights" / "last.pt").unlink()  # a command of the user's: its checkpoints are its own
    state = json.loads((run / "state.json").read_text())
    state["checkpoint"] = {"path": "/w/out/checkpoint-50", "mtime": NOW - 65, "step": 50}
    state["resumed"] = {"attempt": 1, "from": "/w/out/checkpoint-50", "step": 50, "redone_steps": 7, "redone_unit": "step"}
    (run / "state.json").write_text(json.dumps(dict(state, redone_steps=7)))
    lines = status.render(run, status.read(run), now=NOW)
    assert "checkpoint /w/out/checkpoint-50, 1m05s old, step 50" in lines
    assert "resumed   attempt 1 from /w/out/checkpoint-50 (step 50): 7 steps done again, 7 in the run" in lines


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    checkpoint=st.one_of(hostile.json_values(), hostile.json_objects(("path", "mtime", "step"))),
    resumed=st.one_of(hostile.json_values(), hostile.json_objects(("attempt", "from", "step", "redone_steps"))),
    total=hostile.json_values(),
)
def test_any_checkpoint_or_resume_record_in_state_json_renders(tmp_path: Path, checkpoint: Any, resumed: Any, total: Any) -> None:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    record = {"state": "running", "checkpoint": checkpoint, "resumed": resumed, "redone_steps": total}
    (run / "state.json").write_bytes(hostile.dumps(record))
    lines = status.render(run, status.read(run), now=NOW)
    shown = [line for line in lines if line.startswith(("checkpoint", "resumed"))]
    assert shown and all("\n" not in line for line in shown)


def test_a_checkpoint_path_or_resume_source_with_terminal_controls_is_shown_on_one_line_without_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    evil = "ck\n\x1b[31mred\x1b[0m"
    record = {
        "state": "running",
        "checkpoint": {"path": evil, "mtime": NOW - 5, "step": 3},
        "resumed": {"attempt": 1, "from": evil, "step": 3, "redone_steps": 1},
    }
    (run / "state.json").write_text(json.dumps(record))
    lines = status.render(run, status.read(run), now=NOW)
    shown = [line for line in lines if line.startswith(("checkpoint", "resumed"))]
    assert len(shown) == 2 and all("red" in line for line in shown)
    assert not any(char in line for line in shown for char in "\n\x1b")


def test_a_busy_silence_allowed_past_its_budget_is_shown_while_it_lasts(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    allowed = {"busy": True, "guess": "evaluation?", "signs": ["pid 7 wants 100 % CPU"], "budget": "learned:train"}
    record = {"state": "running", "silent_s": 75.3, "busy": dict(allowed, judged_at_s=300.0, bound="stall_budget")}
    (run / "state.json").write_text(json.dumps(record))
    assert "silence   silent 75 s, busy (evaluation?), judged at 300 s" in status.render(run, status.read(run), now=NOW)
    (run / "state.json").write_text(json.dumps({"state": "running", "silent_s": 75.3, "busy": None}))
    assert not any(line.startswith("silence") for line in status.render(run, status.read(run), now=NOW))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    busy=st.one_of(hostile.json_values(), hostile.json_objects(("busy", "guess", "signs", "judged_at_s"))),
    silent=hostile.json_values(),
)
def test_any_busy_record_in_state_json_renders(tmp_path: Path, busy: Any, silent: Any) -> None:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "state.json").write_bytes(hostile.dumps({"state": "running", "busy": busy, "silent_s": silent}))
    lines = status.render(run, status.read(run), now=NOW)
    assert all("\n" not in line for line in lines) and lines[1].startswith("state")


def test_a_run_that_gave_up_before_any_progress_says_so_not_epoch_unknown(tmp_path: Path) -> None:
    write_events(tmp_path, {"event": "start", "attempt": 0, "ts": 1.0}, {"event": "exit", "attempt": 0, "code": 1, "ts": 2.0})
    (tmp_path / "state.json").write_text(json.dumps({"state": "gave_up", "attempt": 0}))
    lines = status.render(tmp_path, status.read(tmp_path), now=3.0)
    assert "trained   nothing: no progress was read" in lines, lines
    (tmp_path / "state.json").write_text(json.dumps({"state": "gave_up", "attempt": 0, "heartbeat": {"step": 40, "steps": 40}}))
    assert "trained   step 40/40" in status.render(tmp_path, status.read(tmp_path), now=3.0)


#: A loop that prints ``step N/40`` and exits right after its last line: nothing of it is read after the last look.
STEPS = "import time\nfor i in range(1, 41):\n    print(f'step {i}/40', flush=True)\n    time.sleep(0.02)\n"


def test_status_reads_the_last_counter_up_to_the_exit(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = train_cli(["supervise", "--run-dir", str(run_dir), "--quiet", "--", sys.executable, "-c", STEPS], run_dir)
    assert done.code == 0, done.stderr
    shown = train_cli(["status", "--run-dir", str(run_dir)])
    assert "trained   step 40/40" in shown.stdout.splitlines(), shown.stdout
