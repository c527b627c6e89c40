"""The work done again, counted from where the previous attempt got to and where this one began, as the programs
print them (trainbox.supervise.resume.redone, trainbox.supervise.output.starts): milliseconds, no process."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainbox.supervise.output.progress import OutputProgress
from trainbox.supervise.resume.redone import counter_of, measure


def attempt(lines: Sequence[str]) -> OutputProgress:
    """One attempt's output, read line by line as the reader thread reads it."""
    output = OutputProgress()
    for at, line in enumerate(lines):
        output.observe(line, float(at))
    return output


def counted(before: Sequence[str], after: Sequence[str]) -> Optional[str]:
    """What the restart did again: ``before`` is the attempt that stalled, ``after`` the one that followed."""
    reached, _ = attempt(before).latest()
    following = attempt(after)
    found = measure(reached, following.starts(counter_of(reached, following.counters())))
    return found.words() if found else None


def tqdm(n: int, total: int = 40) -> str:
    return f"{100 * n // total:3d}%|####      | {n}/{total} [00:01<00:03,  9.10it/s]"


def yolo(epoch: int, n: int, batches: int = 4) -> str:
    losses = "3.512      5.102      4.211         24         64"
    return f"      {epoch}/3         0G      {losses}: {25 * n}% ━━━─── {n}/{batches} 1.2it/s"


def mnist(epoch: int, batch: int, size: int = 32, samples: int = 320) -> str:
    return f"Train Epoch: {epoch} [{batch * size}/{samples} ({100 * batch * size // samples}%)]\tLoss: 2.301384"


def nanogpt(iteration: int) -> str:
    return f"iter {iteration}: loss 4.1234, time 31.02ms, mfu -100.00%"


def test_a_trainer_resumed_at_step_10_draws_its_bar_at_0_then_11_and_did_5_steps_again() -> None:
    """Hung at step 15 with checkpoint-10: the bar of the resumed attempt is drawn at 0/40 before any work (the
    first counter the monitor used to take, counting 16), then jumps to 11/40."""
    assert counted([tqdm(n) for n in range(16)], [tqdm(0), tqdm(11), tqdm(12)]) == "5 steps"


def test_a_restart_from_nothing_counts_everything_done_before_it() -> None:
    assert counted([tqdm(n) for n in range(16)], [tqdm(n) for n in range(3)]) == "15 steps"
    assert counted([nanogpt(n) for n in range(15)], [nanogpt(0), nanogpt(1)]) == "15 steps", "iter 0 is printed after it"
    before = [mnist(1, b) for b in range(10)] + [mnist(2, b) for b in range(5)]
    assert counted(before, [mnist(1, 0), mnist(1, 1)]) == "15 batches", "10 of epoch 1 and 5 of epoch 2"


def test_yolo_resumed_from_the_end_of_epoch_1_counts_the_batches_of_epoch_2_done_again() -> None:
    """Not the data set scan that comes first in the resumed attempt's output, but the epoch bar's own start."""
    scan = "val: Scanning /w/data/labels/val.cache... 8 images, 0 backgrounds, 0 corrupt: 100% ━━━━━━━━━━━━ 8/8 1.2Mit/s"
    before = [yolo(1, n) for n in range(5)] + [yolo(2, n) for n in range(3)]
    assert counted(before, [scan, yolo(2, 0), yolo(2, 1)]) == "2 batches"
    assert counted(before, [scan, yolo(1, 0), yolo(1, 1)]) == "6 batches", "from nothing: epoch 1's 4 and 2 of epoch 2"


def test_nanogpt_resumed_at_iteration_10_did_iterations_10_to_14_again() -> None:
    assert counted([nanogpt(n) for n in range(15)], [nanogpt(n) for n in range(10, 13)]) == "5 steps"


def test_mnist_resumed_at_the_start_of_epoch_2_counts_batches_not_samples() -> None:
    before = [mnist(1, b) for b in range(10)] + [mnist(2, b) for b in range(5)]
    assert counted(before, [mnist(2, 0), mnist(2, 1), mnist(2, 2)]) == "5 batches"


def test_a_fast_printer_is_counted_from_its_first_line_not_the_first_the_monitor_looked_at() -> None:
    """200 lines read before the monitor's first look: the start is the first line read, not the latest."""
    after = attempt([nanogpt(n) for n in range(100, 300)])
    assert after.latest()[0]["step"] == 299
    found = measure({"step": 250, "pattern": "words", "counter": after.latest()[0]["counter"]}, after.starts(None))
    assert found is not None and found.words() == "151 steps"


def test_until_where_it_began_is_known_nothing_is_counted() -> None:
    assert counted([tqdm(n) for n in range(16)], [tqdm(0)]) is None, "a bar at 0 alone: nothing done yet"
    assert counted([mnist(2, 3)], [mnist(2, 0)]) is None, "one line of samples: no batch size yet"
    assert counted([], [tqdm(3)]) is None and counted([tqdm(3)], []) is None


@pytest.mark.parametrize(
    "reached, starts, words",
    [
        ({"step": 26}, [{"step": 21}], "6 steps"),
        ({"step": 5}, [{"step": 9}], "0 steps"),
        ({"epoch": 2, "batch": 40}, [{"epoch": 2, "batch": 31}], "10 batches"),
        ({"epoch": 3, "batch": 40}, [{"epoch": 1, "batch": 1}], "2 epochs"),
        ({"epoch": 3}, [{"epoch": 1}], "2 epochs"),
        ({"step": "26"}, [{"step": 1}], None),
        (None, [{"step": 1}], None),
        ({"step": 26, "side_step": 3}, [{"step": 21}], "6 steps"),
    ],
)
def test_beats_are_counted_in_steps_else_batches_within_an_epoch_else_epochs(
    reached: Optional[Dict[str, Any]], starts: List[Dict[str, Any]], words: Optional[str]
) -> None:
    found = measure(reached, starts)
    assert (found.words() if found else None) == words


@given(
    st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["step", "batch", "epoch", "batches", "pattern", "counter"]),
            st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none()),
        ),
    ),
    st.lists(
        st.dictionaries(
            st.sampled_from(["step", "batch", "epoch", "pattern"]),
            st.one_of(st.integers(-5, 10**20), st.sampled_from(["tqdm", "pytorch-examples", "words"])),
        ),
        max_size=3,
    ),
)
def test_any_beats_give_a_count_of_zero_or_more_or_none(reached: Optional[Dict[str, Any]], starts: List[Dict[str, Any]]) -> None:
    found = measure(reached, starts)
    assert found is None or (isinstance(found.count, int) and found.count >= 0 and found.unit in ("step", "batch", "epoch"))


def hf_log(step: int) -> str:
    return f"{{'loss': '4.046', 'grad_norm': '0.6433', 'learning_rate': '3.375e-05', 'epoch': '{step / 32:.4f}'}}"


def test_a_trainer_s_log_dict_after_its_bar_keeps_the_bar_as_the_counter_that_is_counted() -> None:
    """The last beat before the hang came from the log dict (its ``counter``), at the bar's place (its ``pattern``)."""
    before = [line for n in range(1, 16) for line in (tqdm(n), hf_log(n))]
    assert attempt(before).latest()[0]["counter"].startswith("hf-log:"), "the dict moved last"
    after = [tqdm(0), hf_log(11), tqdm(11), hf_log(12), tqdm(12)]
    assert counted([tqdm(0), *before], after) == "5 steps"
