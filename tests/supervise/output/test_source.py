"""Which progress counts: beats win, else a counter in the output is the beat, else none (milliseconds, no process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainbox.rundir.layout import RunDir
from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.output.source import ProgressSource, Source, notice_due, output_works
from trainbox.supervise.ranks import JobBeats
from trainbox.supervise.stalls.budgets import BudgetPolicy

BAR = "Epoch 1:  {pct:2d}%|####      | {n}/40 [00:04<00:05, 9.80it/s]"


def bar(n: int) -> str:
    return BAR.format(pct=n * 100 // 40, n=n)


@pytest.fixture
def parts(tmp_path: Path) -> tuple:
    run = RunDir(tmp_path)
    policy = BudgetPolicy(startup_s=20, stall_s=5, factor=3, floor_s=1, min_samples=2)
    output = OutputProgress()
    return run, policy, output, ProgressSource(JobBeats(run, policy, started=100.0), output)


def test_a_counter_that_advances_is_the_beat_timed_when_it_was_read(parts: tuple) -> None:
    _, policy, output, source = parts
    assert source.source is Source.NONE and source.poll(101.0) == []
    output.observe(bar(3), 103.0)
    [first] = source.poll(104.5)
    assert first.silent_s == 3.0 and first.previous is None and first.budget.name == "startup"
    assert {k: first.record[k] for k in ("phase", "epoch", "batch", "batches", "pattern")} == {
        "phase": "train",
        "epoch": 1,
        "batch": 3,
        "batches": 40,
        "pattern": "tqdm",
    }
    assert source.source is Source.OUTPUT
    assert source.lagging(104.5).silent_s == 1.5, "silent since the counter was read, not since the look"
    output.observe(bar(3), 105.0)  # a redraw at the same count: chatter
    assert source.poll(106.0) == []
    output.observe(bar(4), 106.5)
    [second] = source.poll(107.0)
    assert second.previous == first.record and second.silent_s == 3.5 and second.budget.name == "stall"
    assert policy.rhythm["train"].samples == 1, "the learned budgets learn the output's rhythm"


def test_beats_win_from_the_first_one_on(parts: tuple) -> None:
    run, _, output, source = parts
    output.observe(bar(1), 101.0)
    assert len(source.poll(101.5)) == 1
    run.heartbeat.write_text(json.dumps({"phase": "train", "step": 7, "pid": os.getpid(), "ts": 0}))
    [beaten] = source.poll(102.0)
    assert beaten.record["step"] == 7 and source.source is Source.BEATS
    output.observe(bar(2), 103.0)
    assert source.poll(104.0) == [], "a child that beats is judged by its beats alone"
    assert source.lagging(110.0).silent_s == 8.0


def test_a_command_that_shows_nothing_is_told_once_half_way_into_its_startup() -> None:
    assert not notice_due(Source.NONE, 9.9, startup_s=20)
    assert notice_due(Source.NONE, 10.0, startup_s=20)
    assert notice_due(Source.NONE, 60.0, startup_s=1200), "never later than a minute in"
    assert not notice_due(Source.OUTPUT, 100.0, startup_s=20) and not notice_due(Source.BEATS, 100.0, startup_s=20)


def test_output_that_kept_coming_shows_the_command_ran() -> None:
    assert output_works(silent_s=20, output_quiet_s=1.0)
    assert not output_works(silent_s=20, output_quiet_s=15.0), "a banner, then nothing: it did not get going"
    assert not output_works(silent_s=20, output_quiet_s=None), "no output at all"
