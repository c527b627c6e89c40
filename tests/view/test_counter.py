"""A run that does not beat, seen as the bar its output showed (trainbox.view.counter), and in status and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from hypothesis import given
from hypothesis import strategies as st

from trainbox.view import counter, status
from trainbox.view.counter import Bar


def samples(*points: tuple, attempt: int = 0, **fields: Any) -> List[Dict[str, Any]]:
    return [
        {"ts": ts, "attempt": attempt, **fields, **({"step": n} if "epoch" not in fields else {"batch": n})} for ts, n in points
    ]


def test_a_step_bar_has_its_total_rate_and_eta_as_tqdm_shows_them() -> None:
    bar = counter.bar_of({"step": 30, "steps": 60, "pattern": "tqdm"}, samples((100.0, 10), (105.0, 20), (110.0, 30)))
    assert bar == Bar("step", 30, 60, 2.0)
    assert (bar.position(), bar.speed(), bar.eta_s()) == ("step 30/60", "2.00 it/s", 15.0)
    slow = counter.bar_of({"step": 3}, samples((0.0, 1), (9.0, 3)))
    assert slow is not None and slow.speed() == "4.50 s/it" and slow.position() == "step 3" and slow.eta_s() is None


def test_a_batch_bar_counts_this_epoch_and_the_epochs_after_it() -> None:
    beat = {"epoch": 2, "epochs": 5, "batch": 30, "batches": 60}
    bar = counter.bar_of(beat, samples((0.0, 10), (10.0, 30), epoch=2))
    assert bar is not None and bar.position() == "epoch 2/5, batch 30/60"
    assert bar.eta_s() == (30 + 3 * 60) / 2.0


def test_the_rate_is_the_newest_pass_of_the_bar_only() -> None:
    old = samples((0.0, 0), (1.0, 1000))  # an earlier attempt, much faster
    assert counter.rate([*old, *samples((100.0, 0), (110.0, 10), attempt=1)], "step") == 1.0
    assert counter.rate(samples((0.0, 50), (5.0, 60), (10.0, 0), (20.0, 10)), "step") == 1.0, "a new bar starts at 0"
    assert counter.rate(samples((0.0, 0), (100.0, 50), (110.0, 60)), "step") == 1.0, "only the last minute"
    assert counter.rate(samples((0.0, 5)), "step") is None and counter.rate([], "batch") is None


def test_the_report_s_throughput_reads_steps_else_batches_within_an_epoch() -> None:
    batches = samples((0.0, 10), (5.0, 20), epoch=1) + samples((10.0, 2), (15.0, 12), epoch=2)
    assert counter.throughput(batches) == [(5.0, 2.0), (15.0, 2.0)], "no pair across the new epoch"
    assert counter.throughput(samples((0.0, 0), (2.0, 8))) == [(2.0, 4.0)]


@given(
    st.lists(
        st.fixed_dictionaries(
            {"ts": st.floats(0, 1e10), "attempt": st.integers(0, 3)},
            optional={"step": st.integers(0, 10**12), "batch": st.integers(0, 10**6), "epoch": st.integers(0, 10)},
        ),
        max_size=20,
    ),
    st.dictionaries(st.sampled_from(["step", "steps", "batch", "batches", "epoch", "epochs"]), st.integers(0, 10**12)),
)
def test_any_samples_and_beat_give_a_bar_or_none_without_error(found: List[Dict[str, Any]], beat: Dict[str, Any]) -> None:
    bar = counter.bar_of(beat, found)
    if bar is not None:
        assert bar.rate is None or bar.rate > 0
        eta = bar.eta_s()
        assert eta is None or eta >= 0
        assert bar.position() and bar.speed()
    for _, rate in counter.throughput(found):
        assert rate >= 0


def test_status_shows_a_tqdm_bar_read_from_the_output(tmp_path: Path) -> None:
    """What state.json and progress.jsonl hold for a tqdm loop of 60 steps, 30 done at 2 it/s."""
    state = {"state": "running", "attempt": 0, "heartbeat": {"step": 30, "steps": 60, "pattern": "tqdm"}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples((100.0, 10), (110.0, 30))))
    lines = status.render(tmp_path, status.read(tmp_path), now=111.0)
    assert lines[2].startswith("progress  step 30/60, last beat ") and lines[2].endswith("(read from its output: tqdm)")
    assert "speed     2.00 it/s" in lines and "eta       0m15s (the run's)" in lines


def _write(path: Path, records: List[Dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_time_lost_to_a_stall_is_its_silence_the_restart_and_the_work_done_again_never_the_whole_attempt(
    tmp_path: Path,
) -> None:
    """A tqdm loop (no phase) silent 10 s at step 40 in a run of 93 s; its retry (started over) finished."""
    from trainbox.view import runview

    stall = {"ts": 30.0, "event": "stall", "attempt": 0, "killed_ts": 30.0, "silent_s": 10.0, "kill_s": 0.0}
    stall["last_beat"] = {"step": 40, "pattern": "tqdm"}
    redone = {"ts": 36.0, "event": "redone", "attempt": 1, "redone": 40, "unit": "step", "from": None}
    events = [{"ts": 0.0, "event": "start", "attempt": 0}, stall, {"ts": 32.0, "event": "start", "attempt": 1}, redone]
    _write(tmp_path / "events.jsonl", [*events, {"ts": 93.0, "event": "exit", "attempt": 1, "code": 0}])
    _write(tmp_path / "progress.jsonl", samples((5.0, 10), (20.0, 40)) + samples((35.0, 0), (50.0, 30), (60.0, 45), attempt=1))
    loss = runview.read(tmp_path, now=100.0).loss(runview.read(tmp_path, now=100.0).stalls[0])
    assert loss.regained and loss.steps == 40 and loss.seconds == 60.0 - 20.0, "back at step 40 by the sample at 60 s"

    _write(tmp_path / "progress.jsonl", samples((5.0, 10), (20.0, 40)) + samples((35.0, 0), (50.0, 30), attempt=1))
    view = runview.read(tmp_path, now=100.0)
    lost = view.loss(view.stalls[0])
    assert not lost.regained and lost.seconds == 35.0 - 20.0, "the silence, the kill and the restart: not up to the end"


def _bar_run(tmp_path: Path, beat: Dict[str, Any], points: List[Dict[str, Any]], epochs: Any = None) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "state.json").write_text(json.dumps({"state": "running", "attempt": 0, "heartbeat": beat}))
    _write(tmp_path / "progress.jsonl", points)
    if epochs is not None:
        (tmp_path / "train").mkdir()
        (tmp_path / "train" / "args.yaml").write_text(f"epochs: {epochs}\nbatch: 16\n")
    return tmp_path


def _line(lines: List[str], head: str) -> str:
    [line] = [line for line in lines if line.startswith(head)]
    return line


def test_the_eta_is_the_run_s_where_the_epochs_are_known_and_the_bar_s_said_as_such_otherwise(tmp_path: Path) -> None:
    """Epoch 2 of 5 from Ultralytics' args.yaml, its bar 30/60 at 2 it/s: 15 s of this epoch and 3 more of 30 s."""
    beat = {"epoch": 2, "batch": 30, "batches": 60, "ts": 110.0}
    run = _bar_run(tmp_path / "known", beat, samples((100.0, 10), (110.0, 30), epoch=2), epochs=5)
    assert _line(status.render(run, status.read(run, now=110.0), now=110.0), "eta") == "eta       1m45s (the run's)"
    alone = _bar_run(tmp_path / "alone", beat, samples((100.0, 10), (110.0, 30), epoch=2))
    eta = _line(status.render(alone, status.read(alone, now=110.0), now=110.0), "eta")
    assert eta == "eta       0m15s (this bar's; the run's epochs are not known)"


def test_the_eta_of_a_silent_run_grows_and_says_so(tmp_path: Path) -> None:
    """Hung at step 30 of 60 after 2 it/s: not ``0m15s`` for ever."""
    run = _bar_run(tmp_path, {"step": 30, "steps": 60, "ts": 110.0}, samples((100.0, 10), (110.0, 30)))
    etas = [_line(status.render(run, status.read(run, now=now), now=now), "eta") for now in (110.0, 170.0, 410.0)]
    assert etas[0] == "eta       0m15s (the run's)"
    # 20 steps in 70 s, then in 310 s: the 30 left take 1m45s, then 7m45s
    assert etas[1] == "eta       1m45s (the run's, growing: no progress for 60 s)", etas
    assert etas[2] == "eta       7m45s (the run's, growing: no progress for 300 s)", etas


def test_a_moving_bar_has_a_rate_before_two_samples_of_it_are_written(tmp_path: Path) -> None:
    """progress.jsonl samples every 5 s: a bar of 8 s has one sample, and the counter published since is the second."""
    run = _bar_run(tmp_path, {"step": 30, "steps": 40, "ts": 104.0}, samples((100.0, 10)))
    lines = status.render(run, status.read(run, now=104.0), now=104.0)
    assert _line(lines, "speed") == "speed     5.00 it/s" and _line(lines, "eta") == "eta       0m02s (the run's)"


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.integers(0, 100), st.integers(0, 100))
def test_a_silence_never_makes_the_eta_shorter(silent_a: float, silent_b: float, count: int, left: int) -> None:
    beat = {"step": count, "steps": count + left, "ts": 10.0}
    earlier, later = sorted((silent_a, silent_b))
    bars = [counter.bar_of(beat, samples((0.0, 0)), now=10.0 + silent) for silent in (earlier, later)]
    etas = [bar.eta_s() if bar is not None else None for bar in bars]
    assert (etas[0] is None) == (etas[1] is None) and (etas[0] is None or etas[1] >= etas[0])
