"""Progress read from output: each recognised form, chatter, redraws, new bars, phases, user patterns.

The recorded fixtures (tests/fixtures/output/, README.md there) are real programs' bytes on a pty.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainbox import errors
from trainbox.supervise.output import progress
from trainbox.supervise.output.progress import (
    HOW_TO_GIVE_PROGRESS,
    PATTERNS,
    OutputProgress,
    ProgressPatternError,
    describe,
    read,
    user_pattern,
    with_user_patterns,
)
from trainbox.supervise.output.terminal import TerminalLines
from trainbox.supervise.policy import position

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "output"
#: Ultralytics' validation bar's label (``DetectionValidator.get_desc``).
VAL = "                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95)"


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: f"{p.name}:{p.sample[:24]}")
def test_every_pattern_reads_its_own_sample(pattern: Any) -> None:
    reading = read(pattern.sample)
    assert reading is not None and reading.pattern == pattern.name
    assert pattern.sample.strip() in describe()


READINGS = [
    # tqdm, and the tools that draw with it
    ("45%|####5     | 45/100 [00:04<00:05, 9.80it/s]", dict(pattern="tqdm", step=45)),
    ("slow:  67%|███████▋    | 2/3 [00:02<00:01,  1.20s/it]", dict(pattern="tqdm", step=2)),
    ("stream: 45it [00:04, 9.80it/s]", dict(pattern="tqdm", step=45)),
    ("Downloading: 45%|████▌     | 4.5k/10.0k [00:04<00:05, 1.0kit/s]", dict(phase="setup", step=4500)),
    (
        "Epoch 3:  45%|████▌     | 45/100 [00:04<00:05, 9.80it/s, v_num=0, loss=0.1, val_loss=0.2]",
        dict(phase="train", epoch=3, batch=45, batches=100),
    ),
    ("Validation DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 19.56it/s]", dict(phase="val", step=1)),
    ("Sanity Checking DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 19.56it/s]", dict(phase="val", step=1)),
    ("Sanity Checking: |          | 0/? [00:00<?, ?it/s]", dict(phase="val", step=0)),
    ("Validating: 100%|██████████| 3/3 [00:00<00:00, 19.81it/s]", dict(phase="val", step=3)),
    ("Evaluating:  20%|██        | 2/10 [00:01<00:04,  2.00it/s]", dict(phase="val", step=2)),
    ("  6%|▋         | 1/16 [00:00<00:13,  1.12it/s]", dict(pattern="tqdm", step=1)),  # Hugging Face Trainer
    # Ultralytics
    (
        "        1/50      1.2G      1.234…: 45% ━━━━━─────── 4886/41163 9.8it/s 8:18<9:59",  # cut to a narrow terminal
        dict(pattern="ultralytics", phase="train", epoch=1, epochs=50, batch=4886, batches=41163),
    ),
    (f"{VAL}: 50% ━━━━━━────── 1/2 1.2it/s 0.8s<0.8s", dict(pattern="ultralytics", phase="val", batch=1, batches=2)),
    (
        "train: Scanning /d/labels/train... 32 images, 0 backgrounds, 0 corrupt: 100% ━━━━━━━━━━━━ 32/32 1.5Kit/s 0.0s",
        dict(pattern="ultralytics", phase="setup", step=32),
    ),
    # rich
    ("Training... ━━━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━━━━━━━━━  35% 0:00:01", dict(pattern="rich-percent", phase="train", step=35)),
    ("Epoch 0/1  ━━━━━━━━━━━━━━━━ 4/20 0:00:00 • 0:00:01 499.16it/s", dict(pattern="rich", epoch=0, epochs=1, batch=4)),
    ("Validation ━━━━━━━━━━━━━━━━ 1/4   0:00:00 • -:--:-- 0.00it/s", dict(pattern="rich", phase="val", step=1)),
    # Keras
    ("12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 10ms/step - loss: 0.1234", dict(pattern="keras", batch=12, batches=100)),
    (" 12/100 [==>...........................] - ETA: 1s - loss: 0.1000", dict(pattern="keras", batch=12)),
    ("Epoch 3/10", dict(pattern="keras", epoch=3, epochs=10)),
    # pytorch/examples
    ("Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.301384", dict(pattern="pytorch-examples", phase="train", epoch=1, batch=640)),
    ("Epoch: [0][ 10/5005]\tTime  0.123 ( 0.456)", dict(pattern="pytorch-examples", epoch=0, batch=10, batches=5005)),
    ("Test: [ 10/196]\tTime  0.050 ( 0.061)", dict(pattern="pytorch-examples", phase="val", batch=10)),
    # Hugging Face Trainer's log lines, 4.x and 5.x
    ("{'loss': 0.6936, 'grad_norm': 0.4041, 'learning_rate': 4.063e-05, 'epoch': 0.5}", dict(pattern="hf-log", epoch=0.5)),
    ("{'loss': '0.6934', 'grad_norm': '0.6196', 'learning_rate': '2.813e-05', 'epoch': '1'}", dict(epoch=1)),
    ("{'eval_loss': '0.6931', 'eval_runtime': '0.0994', 'epoch': '1'}", dict(pattern="hf-log", phase="val", epoch=1)),
    # words
    ("step=1200 loss=0.173", dict(pattern="words", step=1200)),
    ("Step 1200/5000 | loss 0.2", dict(step=1200)),
    ("iter 30: loss 1.2", dict(step=30)),
    ("Iteration: 4", dict(step=4)),
    ("global_step=88 lr=1e-4", dict(step=88)),
    ("global_step 88", dict(step=88)),
    ("[eval] step 5 loss 0.3", dict(phase="val", step=5)),
    ("epoch 2 step 300 loss 0.1", dict(epoch=2, step=300)),
    ("Epoch 7 finished, val loss 0.3", dict(pattern="words", phase=None, epoch=7)),
    # the PyTorch tutorials' print, a bracketed batch, Megatron, DeepSpeed, torchtitan, logging, timm
    ("Epoch [1/5], Step [100/600], Loss: 0.2143", dict(pattern="words", epoch=1, epochs=5, step=100, total=600)),
    ("[batch 100/600] loss 0.31", dict(pattern="words", batch=100, batches=600)),
    (
        " iteration      100/    1000 | consumed samples:        12800 | elapsed time per iteration (ms): 1234.5 |"
        " learning rate: 1.000E-04 | global batch size:   128 | lm loss: 5.017E+00 |",
        dict(pattern="words", step=100, total=1000),
    ),
    (
        "[2026-12-06 03:30:01,123] [INFO] [logging.py:128:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
        dict(pattern="words", step=10),
    ),
    (
        "[2026-12-06 03:30:01,123] [INFO] [timer.py:264:stop] epoch=0/micro_step=20/global_step=10, "
        "RunningAvgSamplesPerSec=25.31, CurrSamplesPerSec=26.12, MemAllocated=0.5GB, MaxMemAllocated=1.2GB",
        dict(pattern="words", epoch=0, step=10),
    ),
    ("steps: 10 loss: 0.6931 iter time (s): 0.123 samples/sec: 260.163", dict(pattern="words", step=10)),
    ("step:  1  loss: 10.8345  memory:  5.21GiB(5.49%)  tps: 1,234  tflops: 0.51  mfu: 2.30%", dict(step=1)),
    ("2026-12-06 03:33:17,872 INFO train: step 10/100 loss 0.1000 lr 1.00e-03", dict(step=10, total=100)),
    ("Train: 3 [ 100/1251 (  8%)]  Loss: 6.912 (6.925)  Time: 0.412s,  621.36/s", dict(pattern="timm", epoch=3, batch=100)),
]


@pytest.mark.parametrize("line, expected", READINGS, ids=[line[:40] for line, _ in READINGS])
def test_reading(line: str, expected: Dict[str, Any]) -> None:
    reading = read(line)
    assert reading is not None
    assert {key: getattr(reading, key) for key in expected} == expected


CHATTER = [
    "GPU memory 5.1 GB",
    "Starting training for 2 epochs...",
    "2 epochs completed in 0.001 hours.",
    "Test set: Average loss: 2.4797, Accuracy: 98/640 (15%)",
    "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size",
    "`Trainer.fit` stopped: `max_epochs=2` reached.",
    "Using 32 train, 8 val images for fraction=1.0 at imgsz=64",
    "lr=0.01 steps_per_epoch=100 warmup_steps=10",
    "12:03:45 INFO step size 0.1",
    "40/40 images done",
    "[timing] ms/step: 530, avg step: 1.23s",  # a timing thread: a rate and a measure, never a step
    "avg step: 1.23s",
    "step: 530ms",
    "time per iter: 12",
    "12 s/iter, step time 0.5",
    "step 100 %",
    "epoch: 0.625",
    "  Total optimization steps = 16",  # a plan, not a place
    "  Num examples = 60000, batch size 32, batch: 32, global batch size:   128",  # sizes
    "elapsed time per iteration (ms): 1234.5 | samples/sec: 260.163 | 12 s/step 3",  # rates
    "",
]


@pytest.mark.parametrize("line", CHATTER)
def test_chatter_is_no_reading(line: str) -> None:
    assert read(line) is None


def beats(lines: List[str], progress: OutputProgress = None) -> List[Dict[str, Any]]:  # type: ignore[assignment]
    progress = progress or OutputProgress()
    return [beat for i, line in enumerate(lines) if (beat := progress.observe(line, float(i))) is not None]


def test_chatter_and_a_repeated_counter_never_advance() -> None:
    progress = OutputProgress()
    bar = "Epoch 0:  45%|████▌     | 45/100 [00:{:02d}<00:05, {}it/s]"
    assert progress.observe(bar.format(4, "9.80"), 1.0) is not None
    hung = [bar.format(4 + i, "0.5") for i in range(50)] + ["GPU memory 5.1 GB"] * 50  # a monitor's redraws, a thread
    assert beats(hung, progress) == []
    place = {"phase": "train", "epoch": 0, "batch": 45, "batches": 100, "pattern": "tqdm", "counter": "tqdm:Epoch #:100"}
    assert progress.latest() == (place, 1.0)


def test_a_new_bar_is_progress() -> None:
    lines = ["100%|██████████| 100/100 [00:10<00:00]", "  1%|          | 1/100 [00:00<00:10]"]  # no epoch in the label
    assert [beat["step"] for beat in beats(lines)] == [100, 1]


def test_bars_drawn_in_turn_are_never_compared_with_each_other() -> None:
    outer, inner = "epochs:  50%|█████     | 1/2 [00:01<00:01]", "batches:  75%|███████▌  | 3/4 [00:00<00:00]"
    assert len(beats([outer, inner] * 20)) == 2


def test_a_batch_takes_the_epoch_read_before_it() -> None:
    keras = ["Epoch 3/10", "12/100 ━━━━━━━━━━━━━━━━━━━━ 1s 10ms/step - loss: 0.1"]
    keras_beat = {"epoch": 3, "epochs": 10, "batch": 12, "batches": 100, "pattern": "keras", "counter": "keras::?"}
    assert beats(keras)[-1] == {**keras_beat, "loss": 0.1}, "and the loss the line shows"
    ultralytics = [
        "        3/50      1.2G      1.234      2.345      1.456         16        640: 100% ━━━━━━━━━━━━ 10/10 9.8it/s 1.0s",
        f"{VAL}: 50% ━━━━━━────── 1/2 1.2it/s",
    ]
    expected = {"phase": "val", "epoch": 3, "epochs": 50, "batch": 1, "batches": 2, "pattern": "ultralytics"}
    expected["counter"] = "ultralytics:val:2"
    assert beats(ultralytics)[-1] == expected


def test_the_same_validation_bar_in_the_next_epoch_is_progress() -> None:
    val = f"{VAL}: 100% ━━━━━━━━━━━━ 1/1 12it/s"
    train = "        {}/50      1.2G      1.234      2.345      1.456         16        640: 100% ━━━━━━━━━━━━ 4/4 9.8it/s"
    assert [(b["phase"], b["epoch"]) for b in beats([train.format(1), val, train.format(2), val])] == [
        ("train", 1),
        ("val", 1),
        ("train", 2),
        ("val", 2),
    ]


def test_a_beat_gives_the_supervisor_its_place() -> None:
    beat = beats(["Epoch 3:  45%|████▌     | 45/100 [00:04<00:05, 9.80it/s]"])[0]
    assert position(beat) == "phase train, epoch 3 batch 45"
    assert position(beats(["step=1200 loss=0.1"])[0]) == "step 1200"


def test_how_to_give_progress_is_one_line() -> None:
    assert "\n" not in HOW_TO_GIVE_PROGRESS and "--progress-pattern" in HOW_TO_GIVE_PROGRESS
    assert len(describe().splitlines()) == len(PATTERNS)


# -- user patterns ----------------------------------------------------------------------------------------------


def test_a_user_pattern_comes_before_the_built_ins() -> None:
    progress = OutputProgress(with_user_patterns([r"img (?P<step>\d+) done"]))
    beat = progress.observe("img 7 done, step 3", 0.0)
    assert beat is not None and (beat["step"], beat["pattern"]) == (7, "user")
    assert progress.observe("Epoch 1:  45%|████▌     | 45/100 [00:04<00:05]", 1.0) is not None  # built-ins still read


def test_a_user_pattern_with_total_and_phase() -> None:
    pattern = user_pattern(r"\[(?P<phase>train|valid)\] (?P<batch>\d+)/(?P<total>\d+) in epoch (?P<epoch>\d+)")
    reading = read("[valid] 3/40 in epoch 2", [pattern])
    assert reading is not None
    assert (reading.phase, reading.batch, reading.batches, reading.epoch, reading.epochs) == ("val", 3, 40, 2, None)
    only_epochs = read("round 4 of 9", [user_pattern(r"round (?P<epoch>\d+) of (?P<total>\d+)")])
    assert only_epochs is not None and (only_epochs.epoch, only_epochs.epochs) == (4, 9)


def test_a_user_pattern_that_captures_no_number_reads_nothing() -> None:
    assert read("step abc", [user_pattern(r"step (?P<step>\w+)")]) is None


@pytest.mark.parametrize(
    "text, says",
    [
        ("step (?P<step>\\d+", "not a regular expression"),
        ("(?P<setp>\\d+)", "unknown group 'setp'"),
        ("step \\d+", "no counter in it"),
        ("(?P<step>\\d*)", "matches an empty line"),
    ],
)
def test_a_bad_user_pattern_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ProgressPatternError) as refused:
        with_user_patterns([r"(?P<step>\d+)", text])
    assert isinstance(refused.value, errors.UserError) and refused.value.code == errors.ExitCode.USAGE
    line = errors.line(refused.value)
    assert "\n" not in line and says in line and line.startswith("trainbox: error: --progress-pattern ")


# -- recorded real programs -------------------------------------------------------------------------------------


def recorded(name: str) -> List[Dict[str, Any]]:
    """The beats a run of the fixture ``name`` gives, read from its bytes as the supervisor reads them."""
    progress, lines = OutputProgress(), TerminalLines()
    return beats(lines.feed((FIXTURES / f"{name}.raw").read_bytes()), progress)


def places(name: str) -> List[tuple]:
    return [(b.get("phase"), b.get("epoch"), b.get("batch"), b.get("step"), b["pattern"]) for b in recorded(name)]


RECORDED = {
    "tqdm_loop": [("train", 0, 12, None, "tqdm"), ("val", None, None, 3, "tqdm"), ("train", 1, 12, None, "tqdm")],
    "tqdm_ascii": [("train", 0, 8, None, "tqdm"), ("val", None, None, 3, "tqdm")],
    "tqdm_slow": [(None, None, None, 3, "tqdm"), (None, None, None, 5, "tqdm"), (None, None, None, 4, "tqdm")],
    "rich_progress": [("train", None, None, 100, "rich-percent"), ("train", 1, 15, None, "rich"), ("val", None, None, 5, "rich")],
    "ultralytics": [
        ("setup", None, None, 32, "ultralytics"),
        ("train", 1, 4, None, "ultralytics"),
        ("val", 1, 1, None, "ultralytics"),
        ("train", 2, 4, None, "ultralytics"),
        ("val", 2, 1, None, "ultralytics"),
    ],
    "lightning_tqdm": [
        ("val", None, None, 2, "tqdm"),
        ("train", 0, 20, None, "tqdm"),
        ("val", None, None, 4, "tqdm"),
        ("train", 1, 20, None, "tqdm"),
    ],
    "lightning_rich": [("train", 0, 20, None, "rich"), ("train", 1, 20, None, "rich"), ("val", None, None, 1, "rich")],
    "keras": [(None, 1, 40, None, "keras"), (None, 2, None, None, "keras"), (None, 2, 40, None, "keras")],
    # its log dicts' epochs are kept apart; its evaluation bar (2 steps, no label) is a phase inside step 8
    "hf_trainer": [(None, None, None, 8, "tqdm"), (None, None, None, 16, "tqdm")],
    "pytorch_examples": [
        ("train", 1, 512, None, "pytorch-examples"),
        ("train", 2, 512, None, "pytorch-examples"),
        ("val", 1, 8, None, "pytorch-examples"),  # imagenet's Test: lines, inside the training place they follow
    ],
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_output_advances_through_its_places(name: str) -> None:
    seen = places(name)
    assert set(RECORDED[name]) <= set(seen), f"{name}: missing {set(RECORDED[name]) - set(seen)}"


def test_a_recorded_trainers_evaluation_bar_is_a_phase_inside_its_training_step() -> None:
    beats = recorded("hf_trainer")
    mid_run = [b for b in beats if b["counter"] == "tqdm::2" and "side_step" in b]  # the evaluation after epoch 1
    assert mid_run and {(b["step"], b["side_total"]) for b in mid_run} == {(8, 2)}, mid_run
    assert not any(b["pattern"] == "hf-log" for b in beats), "its log dicts' epoch fractions are kept apart"


def test_recorded_output_is_what_a_terminal_gets() -> None:
    for name in RECORDED:
        raw = (FIXTURES / f"{name}.raw").read_bytes()
        assert b"\r" in raw or name == "pytorch_examples", name
    for name in ("ultralytics", "rich_progress", "keras", "lightning_rich"):
        assert b"\x1b[" in (FIXTURES / f"{name}.raw").read_bytes(), name


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_tail_is_the_same_however_the_bytes_are_cut(name: str) -> None:
    raw = (FIXTURES / f"{name}.raw").read_bytes()
    whole = TerminalLines()
    whole.feed(raw)
    for size in (1, 7, 513):
        cut = TerminalLines()
        for start in range(0, len(raw), size):
            cut.feed(raw[start : start + size])
        assert cut.tail(20) == whole.tail(20), (name, size)


# -- bars drawn by the real libraries, in this process ----------------------------------------------------------


def drawn(raw: str) -> List[Dict[str, Any]]:
    """The beats of what a library drew (``raw``), read as the supervisor reads a terminal's bytes."""
    return beats(TerminalLines().feed(raw.encode()))


def test_nested_tqdm_bars_with_leave_false_are_progress_at_every_step_of_each() -> None:
    tqdm = pytest.importorskip("tqdm")  # .ci/run installs it; in CI a skip fails
    out = io.StringIO()
    for _ in tqdm.tqdm(range(3), desc="epochs", file=out, mininterval=0, miniters=1):
        for _ in tqdm.tqdm(range(5), desc="batches", leave=False, file=out, mininterval=0, miniters=1):
            pass
    seen = [(b["counter"], b.get("side_step", b["step"])) for b in drawn(out.getvalue())]
    assert seen.count(("tqdm:batches:5", 0)) == 3, "the inner bar starts again in each epoch: progress each time"
    assert [n for counter, n in seen if counter == "tqdm:batches:5"] == [0, 1, 2, 3, 4, 5] * 3
    assert [n for counter, n in seen if counter == "tqdm:epochs:3"] == [0, 1, 2, 3], "the outer bar, once a step"


def test_a_rich_progress_with_two_tasks_is_progress_at_every_step_of_each() -> None:
    pytest.importorskip("rich")
    from rich.console import Console
    from rich.progress import Progress

    out = io.StringIO()
    with Progress(console=Console(file=out, force_terminal=True, width=100), auto_refresh=False) as shown:
        epochs = shown.add_task("Epochs", total=3)
        for _ in range(3):
            batches = shown.add_task("Batches", total=4)
            for _ in range(4):
                shown.advance(batches)
                shown.refresh()
            shown.remove_task(batches)
            shown.advance(epochs)
            shown.refresh()  # redraws the epochs line at the same count as well: no progress
    seen = [(b["counter"], b.get("side_step", b["step"])) for b in drawn(out.getvalue())]
    assert [n for counter, n in seen if counter.endswith(":Batches:100")] == [0, 25, 50, 75, 100] * 3
    assert [n for counter, n in seen if counter.endswith(":Epochs:100")] == [0, 33, 67, 100]


def test_the_training_loss_a_line_shows_goes_with_its_beat() -> None:
    reader = OutputProgress()
    reader.observe(" 10%|#         | 4/40 [00:01<00:09, 4.00it/s, loss=0.5]", 0.0)
    beat = reader.observe(" 12%|#         | 5/40 [00:01<00:09, 4.00it/s, loss=0.25, val_loss=9]", 1.0)
    assert beat is not None and beat["loss"] == 0.25
    assert [progress.loss_in(line) for line in ("{'loss': 0.69, 'epoch': 0.5}", "- loss: 1e-3", "val_loss=1.7", "loss=inf")] == [
        0.69,
        0.001,
        None,
        None,
    ]


@given(st.text(max_size=300))
def test_any_line_s_loss_is_a_finite_number_or_none(line: str) -> None:
    loss = progress.loss_in(line)
    assert loss is None or math.isfinite(loss)
