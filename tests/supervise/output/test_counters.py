"""Counters followed as counters: forward by their own steps, one main counter for the place, one unit per run."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest

from trainbox.supervise.output.counters import MAX_TRACKS, PERCENT_FACTOR, PERCENT_NOTICE, Counters
from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.policy import position

TRAIN = "{:3d}%|█▌        | {}/100 [00:04<00:05,  9.80it/s]"  # Hugging Face's training bar: no label
SHARDS = "Writing model shards: 100%|██████████| 1/1 [00:00<00:00,  5.10it/s]"
EVAL = "{:3d}%|█████     | {}/40 [00:01<00:01,  2.00it/s]"  # its evaluation bar: no label either, another total


def fed(lines: List[Tuple[float, str]], progress: Optional[OutputProgress] = None) -> List[Dict[str, Any]]:
    """The beats of ``lines`` (each with its time), read as the supervisor reads them."""
    progress = progress or OutputProgress()
    return [beat for at, line in lines if (beat := progress.observe(line, at)) is not None]


def bar(form: str, count: int) -> str:
    return form.format(count, count)


def test_a_counter_moves_forward_and_a_copy_behind_it_is_no_progress() -> None:
    rank0, rank1 = "step 57 loss 0.1", "step 56 loss 0.1"  # two ranks printing the same line form
    beats = fed([(0, rank0), (1, rank1), (2, rank1), (3, "step 58 loss 0.1")])
    assert [b["step"] for b in beats] == [57, 58]


def test_a_counter_that_starts_again_is_progress() -> None:
    beats = fed([(0, "100%|█| 100/100 [00:10<00:00]"), (1, "  0%|          | 0/100 [00:00<00:10]")])
    assert [b["step"] for b in beats] == [100, 0]


def test_a_counter_that_jumps_forward_is_progress_at_every_jump() -> None:
    # a logger that prints its first 5 steps, then every 1000th: each line it prints is progress
    lines = [(t, f"iter {n} loss 0.1") for t, n in enumerate([1, 2, 3, 4, 5, 1000, 2000, 3000])]
    assert [b["step"] for b in fed(lines)] == [1, 2, 3, 4, 5, 1000, 2000, 3000]


def test_a_counter_that_counts_within_each_epoch_is_progress_in_every_epoch() -> None:
    # ``step 50/100``, ``step 100/100``, then ``step 50/100`` again: a new epoch, without the epoch in the line
    logged = [f"step {n}/100 loss 0.1" for n in (50, 100)] * 3
    assert [b["step"] for b in fed(list(enumerate(logged)))] == [50, 100] * 3
    unbounded = [f"step {n} loss 0.1" for n in (50, 100)] * 3  # no total: back to where it first stood
    assert [b["step"] for b in fed(list(enumerate(unbounded)))] == [50, 100] * 3


def test_a_counter_back_to_its_start_is_progress_and_a_copy_behind_is_not() -> None:
    lines = ["iter 10", "iter 20", "iter 30", "iter 29", "iter 10", "iter 20", "iter 20", "iter 19", "iter 30"]
    assert [b["step"] for b in fed(list(enumerate(lines)))] == [10, 20, 30, 10, 20, 30]


def test_each_line_form_is_its_own_counter() -> None:
    beats = fed([(0, "train step 5"), (1, "eval step 3"), (2, "eval step 2"), (3, "train step 6")])
    assert [b["counter"] for b in beats] == ["words:train:?", "words:eval:?", "words:train:?"]


def test_a_save_bar_inside_the_training_bar_is_a_phase_inside_its_place() -> None:
    lines = [(t * 0.2, bar(TRAIN, t)) for t in range(51)] + [(10.5, SHARDS), (11.0, bar(TRAIN, 51))]
    beats = fed(lines)
    save = beats[-2]
    assert (save["step"], save["phase"], save["side_step"], save["side_total"]) == (50, "save", 1, 1)
    assert position(save) == "phase save, step 50", "the training step, not step 1 of the shard writer"
    assert beats[-1] == {"step": 51, "steps": 100, "pattern": "tqdm", "counter": "tqdm::100"}


def test_an_evaluation_bar_without_a_label_keeps_the_training_place_and_names_its_own_counter() -> None:
    lines = [(t * 0.2, bar(TRAIN, t)) for t in range(61)]  # 12 s of training, then 8 s of evaluation
    lines += [(12 + t * 0.2, bar(EVAL, t)) for t in range(41)] + [(20.5, bar(TRAIN, 61))]
    beats = fed(lines)
    evaluation = [b for b in beats if b["counter"] == "tqdm::40"]
    assert len(evaluation) == 41 and {b["step"] for b in evaluation} == {60}
    assert beats[-1]["step"] == 61 and beats[-1]["counter"] == "tqdm::100"


def test_the_counter_that_ran_longest_becomes_the_main_one() -> None:
    lines = [(t * 0.1, bar(TRAIN, t)) for t in range(5)]  # ran 0.4 s
    lines += [(1 + t * 0.5, bar(EVAL, t)) for t in range(4)]  # ran 1.5 s: it is the run's counter now
    assert "side_step" not in fed(lines)[-1]


def test_a_complete_bar_hands_the_place_to_the_next() -> None:
    lines = [(0, "Scanning labels: 100%|██████████| 32/32 [00:00<00:00]"), (1, "Epoch 1:  25%|██▌  | 1/4 [00:01<00:03]")]
    assert fed(lines)[-1]["batch"] == 1


def test_an_epoch_fraction_from_a_log_line_is_progress_inside_the_place_of_the_steps() -> None:
    logged = "{'loss': '0.6936', 'grad_norm': '0.4041', 'learning_rate': '4.063e-05', 'epoch': '0.625'}"
    beats = fed([(0, bar(TRAIN, 4)), (1, logged), (2, logged), (3, bar(TRAIN, 5))])
    assert [b.get("step") for b in beats] == [4, 4, 5] and all("epoch" not in b for b in beats), "the place: steps"
    assert beats[1]["counter"] == "hf-log::?", "the log dict's counter moved"
    assert fed([(0, logged)])[0]["epoch"] == 0.625, "alone, it is the place"


def test_a_percentage_only_bar_is_judged_by_the_time_a_percent_takes() -> None:
    progress = OutputProgress(floor_s=5.0)
    track = "Working... ━━━━━━━━━━━━━━━━ {}% 0:00:10"
    first = fed([(0.0, track.format(0))], progress)[0]
    assert "timeout" not in first, "before a percent has passed, the stall budget judges (not a day)"
    assert progress.notices() == [PERCENT_NOTICE] and progress.notices() == [], "said once"
    beats = fed([(t * 400.0, track.format(t)) for t in (1, 2, 3)], progress)
    assert beats[-1]["timeout"] == PERCENT_FACTOR * 400.0, "a percent of 400 s: longer than the stall budget"
    quick = OutputProgress(floor_s=5.0)
    assert fed([(t * 0.1, track.format(t)) for t in range(4)], quick)[-1]["timeout"] == 5.0, "never under the budget"


def test_tracks_are_bounded_and_the_main_one_is_kept() -> None:
    counters = Counters()
    progress = OutputProgress()
    labels = [f"bar {chr(65 + i // 26)}{chr(65 + i % 26)}" for i in range(MAX_TRACKS + 1)]
    for label in labels:
        assert progress.observe(f"{label}: 50%|█████     | 1/2 [00:00<00:00]", 0.0) is not None
    # the first bar is the main one and stays; the second was forgotten, so its reading is news again
    assert progress.observe(f"{labels[0]}: 50%|█████     | 1/2 [00:00<00:00]", 1.0) is None
    assert progress.observe(f"{labels[1]}: 50%|█████     | 1/2 [00:00<00:00]", 1.0) is not None
    assert len(counters.tracks) <= MAX_TRACKS


#: Log forms as programs print them through a run: each line is a new value of its counter, so each is progress.
RUNS = {
    "pytorch tutorials": [f"Epoch [{e}/2], Step [{s}/600], Loss: 0.2143" for e in (1, 2) for s in (100, 200, 600)],
    "a bracketed batch": [f"[batch {b}/600] loss 0.31" for _ in (1, 2) for b in (100, 300, 600)],
    "imagenet ProgressMeter": [f"Epoch: [{e}][ {b:>3}/500]\tTime  0.123" for e in (0, 1) for b in (0, 10, 20)],
    "Megatron": [f" iteration {i:>8}/    1000 | consumed samples: {i * 128:>12} | lm loss: 5.0E+00 |" for i in (1, 10, 100)],
    "DeepSpeed": [f"[Rank 0] step={s}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]" for s in (10, 20, 30)],
    "logging": [f"2026-12-06 03:33:{s:02d},768 INFO train: step {s}/20 loss 0.1" for _ in (1, 2) for s in (10, 20)],
    "timm": [f"Train: {e} [{b:>4}/1251 ({b * 100 // 1251:>3}%)]  Loss: 6.912 (6.925)" for e in (0, 1) for b in (0, 50)],
}


@pytest.mark.parametrize("form", sorted(RUNS))
def test_every_new_value_of_a_log_form_through_a_run_is_progress(form: str) -> None:
    lines = RUNS[form]
    assert len(fed(list(enumerate(lines)))) == len(lines)
    assert len(fed(list(enumerate(line for line in lines for _ in (1, 2))))) == len(lines), "each printed twice: no more"


def test_a_counter_that_only_repeats_the_main_counters_place_in_another_form_is_no_progress() -> None:
    # DeepSpeed logs each step twice: the engine's report, then its throughput timer's
    report = "[2026-12-06 03:56:48,599] [INFO] [logging.py:123:log_dist] [Rank 0] step={}, skipped=0, lr=[0.01], mom=[0]"
    timer = "[2026-12-06 03:56:48,599] [INFO] [timer.py:264:stop] epoch=0/micro_step={0}/global_step={0}, Samples/sec=283"
    lines = [line.format(step) for step in (20, 40, 60) for line in (report, timer)]
    beats = fed(list(enumerate(lines)))
    assert [b["step"] for b in beats] == [20, 40, 60] and len({b["counter"] for b in beats}) == 1, "one rhythm"
    lagging = [report.format(20), timer.format(20), report.format(40), timer.format(30)]  # the timer behind: its own
    assert [b.get("side_step", b["step"]) for b in fed(list(enumerate(lagging)))] == [20, 40, 30]
