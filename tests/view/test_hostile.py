"""``status``, ``status --watch`` and ``report`` on a run directory whose files are odd but parseable, or broken
(issue 33 items 7 and 8): real CLI runs, each ends with exit 0 and says what it left out, never a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from tests.rundir.hostile import DEEP_JSON
from tests.supervised import REPO, Finished, cli_env, train_cli
from trainbox.rundir.layout import RunDir

NOW = time.time()


def sane_run(root: Path) -> RunDir:
    """A run in its second attempt after a stall: what the odd values are planted into, one at a time."""
    run = RunDir(root)
    run.train_args.parent.mkdir(parents=True)
    run.train_args.write_text("epochs: 10\nbatch: 16\n")
    beat = {"epoch": 2, "batch": 3, "step": 13, "phase": "train", "imgs_per_s": 12.5, "ts": NOW - 2}
    run.heartbeat.write_text(json.dumps(beat))
    run.state.write_text(json.dumps({"state": "running", "attempt": 1, "budget": {"name": "stall", "seconds": 5}}))
    write_lines(run.events, [
        {"ts": NOW - 60, "event": "start", "attempt": 0, "profile": "safe"},
        {"ts": NOW - 30, "event": "stall", "attempt": 0, "cause": "idle", "evidence": ["whole tree idle"], "silent_s": 5},
        {"ts": NOW - 29, "event": "restart", "attempt": 1, "profile": "safe", "previous_profile": "safe"},
        {"ts": NOW - 28, "event": "start", "attempt": 1, "profile": "safe"},
    ])  # fmt: skip
    write_lines(run.progress, [
        {"ts": NOW - 50, "attempt": 0, "phase": "train", "step": 4, "imgs_per_s": 11.0, "silences": {"train": {"s": 0.2}}},
        {"ts": NOW - 10, "attempt": 1, "phase": "train", "step": 8, "imgs_per_s": 12.5, "silences": {}},
    ])  # fmt: skip
    run.results.write_text("epoch,train/box_loss,metrics/mAP50(B)\n1,0.5,0.1\n")
    return run


def write_lines(path: Path, records: List[Dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def edit_lines(path: Path, index: int, **fields: Any) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[index].update(fields)
    write_lines(path, records)


def without_ts(run: RunDir) -> None:
    records = [json.loads(line) for line in run.progress.read_text().splitlines()]
    del records[0]["ts"]
    write_lines(run.progress, records)


#: Item 8, each odd value with the command it broke: a beat's ``epoch`` "2/10" (status: TypeError), a progress
#: sample without ``ts`` (report: KeyError), an event's ``"attempt": null`` (--watch and report: TypeError),
#: ``"silences": 3`` (report: AttributeError).
ODD: Dict[str, Callable[[RunDir], None]] = {
    "epoch-2/10": lambda run: run.heartbeat.write_text(json.dumps({"epoch": "2/10", "batch": 3, "ts": NOW - 2})),
    "sample-without-ts": without_ts,
    "attempt-null": lambda run: edit_lines(run.events, 0, attempt=None),
    "silences-3": lambda run: edit_lines(run.progress, 0, silences=3),
}
BROKE = {"epoch-2/10": "status", "sample-without-ts": "report", "attempt-null": "watch", "silences-3": "report"}


def command(run: RunDir, which: str) -> Finished:
    if which == "status":
        return train_cli(["status", "--run-dir", str(run.root)], run.root)
    if which == "report":
        return train_cli(["report", str(run.root)], run.root)
    return watch_once(run)


def watch_once(run: RunDir) -> Finished:
    """``status --watch`` without a terminal: its first line, then Ctrl-C (which is how a watch ends: exit 0)."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "trainbox", "status", "--watch", "--run-dir", str(run.root)],
        env=cli_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None and watch.stderr is not None
        line = watch.stdout.readline()
        watch.send_signal(signal.SIGINT)
        code = watch.wait(timeout=60)
        return Finished(code, line, watch.stderr.read(), run.root)
    finally:
        watch.kill()


@pytest.mark.parametrize("odd", list(ODD))
def test_an_odd_value_is_unknown_not_a_traceback(tmp_path: Path, odd: str) -> None:
    run = sane_run(tmp_path)
    ODD[odd](run)
    done = command(run, BROKE[odd])
    assert done.code == 0 and "Traceback" not in done.stderr, done.stderr
    if BROKE[odd] == "status":
        assert "progress  epoch ?/10, batch 3" in done.stdout, "the epoch that is not a number is unknown"
    elif BROKE[odd] == "watch":
        assert done.stdout.startswith("epoch 2/10, batch 3") and "last stall: attempt 0" in done.stdout, done.stdout
    else:
        page = run.report.read_text()
        assert "progress.jsonl: " in page and page.count("<img") >= 2, "said what was left out; the charts drawn"


def test_broken_history_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    """Item 7: a line ``[1]``, 100,000 ``[`` and a byte 0xe9 in events.jsonl ended ``status`` and ``report`` too."""
    run = sane_run(tmp_path)
    run.events.write_bytes(run.events.read_bytes() + b"\n".join([b"[1]", DEEP_JSON, b'{"event": "d\xe9j\xe0"}']) + b"\n")
    status = command(run, "status")
    assert status.code == 0 and "note      events.jsonl: 3 unusable line(s) skipped" in status.stdout, status.stderr
    assert "restarts  1, stalls 1, crashes 0" in status.stdout, "the usable history is all there"
    report = command(run, "report")
    assert report.code == 0 and "events.jsonl: 3 unusable line(s) skipped" in run.report.read_text(), report.stderr


def test_files_that_are_not_files_are_refused_and_said(tmp_path: Path) -> None:
    run = sane_run(tmp_path)
    run.progress.unlink()
    run.progress.mkdir()
    run.results.unlink()
    run.results.symlink_to("/etc/passwd")
    run.state.unlink()
    run.state.symlink_to(run.heartbeat.name)
    status = command(run, "status")
    assert status.code == 0 and f"note      unreadable supervisor state at {run.state} (a symbolic link)" in status.stdout
    report = command(run, "report")
    page = run.report.read_text()
    assert report.code == 0 and "progress.jsonl: a folder where a file belongs, refused" in page, report.stderr
    assert "epochs in results.csv" not in page and "No results." in page, "a results.csv link is not followed"
