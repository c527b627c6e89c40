"""``status``, ``status --watch`` and ``report`` on a run directory whose files are odd but parseable, or broken
(issue 33 items 7 and 8): real CLI runs, each ends with exit 0 and says what it left out, never a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rundir.hostile import DEEP_JSON
from tests.supervised import REPO, cli_env, train_cli
from trainbox.rundir.layout import RunDir

NOW = time.time()


def odd_run(root: Path) -> RunDir:
    """Item 8's inputs: a beat with ``epoch: "2/10"``, a progress sample without ``ts``, an event with
    ``"attempt": null``, ``"silences": 3``; item 7's: history lines ``[1]``, 100,000 ``[`` and a byte 0xe9."""
    run = RunDir(root)
    run.train_args.parent.mkdir(parents=True)
    run.train_args.write_text("epochs: 10\nbatch: 16\n")
    run.heartbeat.write_text(json.dumps({"epoch": "2/10", "batch": 3, "step": 13, "phase": "train", "ts": NOW - 2}))
    run.state.write_text(json.dumps({"state": "running", "attempt": None, "budget": {"name": "stall", "seconds": "5"}}))
    events = [
        {"ts": NOW - 60, "event": "start", "attempt": None, "profile": "safe"},
        {"ts": NOW - 30, "event": "stall", "attempt": None, "cause": 7, "evidence": "main thread in x", "incident": ".."},
        {"ts": NOW - 20, "event": "restart", "attempt": "1", "profile": ["safe"]},
    ]
    lines = [json.dumps(event).encode() for event in events] + [b"[1]", DEEP_JSON, b'{"event": "d\xe9j\xe0"}']
    run.events.write_bytes(b"\n".join(lines) + b"\n")
    samples = [
        {"attempt": 0, "phase": "train", "step": 3, "silences": {"train": {"s": 0.2}}},  # no ts
        {"ts": NOW - 50, "attempt": 0, "phase": "train", "step": 4, "silences": 3},
        {"ts": NOW - 40, "attempt": 0, "phase": "train", "step": "5", "silences": {"train": {"s": "x"}, "val": [1]}},
        {"ts": NOW - 10, "attempt": 1, "phase": "train", "step": 8, "imgs_per_s": 12.5, "silences": {}},
    ]
    run.progress.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    run.results.write_text("epoch,train/box_loss,metrics/mAP50(B)\n1,0.5,0.1\nx,y,z\n2,nan,0.2\n1e400,1,1\n")
    return run


def test_status_reads_what_it_can_and_says_what_it_left_out(tmp_path: Path) -> None:
    odd_run(tmp_path)
    done = train_cli(["status", "--run-dir", str(tmp_path)], tmp_path)
    assert done.code == 0 and not done.stderr, done.stderr
    assert "progress  epoch ?/10, batch 3, phase train" in done.stdout, "the epoch that is not a number is unknown"
    assert "state     running\n" in done.stdout, "an attempt of null is no attempt"
    assert "note      events.jsonl: 3 unusable line(s) skipped, " in done.stdout


def test_watch_shows_the_odd_run_and_leaves_on_ctrl_c(tmp_path: Path) -> None:
    odd_run(tmp_path)
    watch = subprocess.Popen(
        [sys.executable, "-m", "trainbox", "status", "--watch", "--run-dir", str(tmp_path)],
        env=cli_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        line = watch.stdout.readline()
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=60) == 0, watch.stderr.read() if watch.stderr else ""
    finally:
        watch.kill()
    assert line.startswith("epoch ?/10, batch 3") and "last stall: attempt 0" in line, line


@pytest.mark.parametrize("odd", [True, False], ids=["odd", "hostile-kinds"])
def test_report_is_written_from_what_can_be_used(tmp_path: Path, odd: bool) -> None:
    run = odd_run(tmp_path)
    if not odd:  # the same run, its history and samples replaced by things that are not files
        run.progress.unlink()
        run.progress.mkdir()
        run.results.unlink()
        run.results.symlink_to("/etc/passwd")
    done = train_cli(["report", str(tmp_path)], tmp_path)
    assert done.code == 0, done.stderr
    page = run.report.read_text()
    assert "Traceback" not in done.stderr and page.count("<img") >= 2
    if odd:
        assert "progress.jsonl: 1 unusable line(s) skipped, 2 field(s) of the wrong kind ignored" in page
        assert "2 of 10" in page, "results.csv: the epochs that are whole numbers"
    else:
        assert "progress.jsonl: a folder where a file belongs, refused" in page
