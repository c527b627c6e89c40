"""train/supervise/stalls/busy.py: busy or hung, from made-up samples and dumps, in milliseconds (the supervisor
against real busy and hung programs is tests/supervise/stalls/test_busy_silences.py)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from trainbox.diagnose.evidence import ProcSample, Sample
from trainbox.diagnose.window import Window
from trainbox.rundir.events import Cause
from trainbox.supervise.stalls import busy

MAIN = 4242


def proc(cpu_s: float, io: int = 0, state: str = "S") -> ProcSample:
    return ProcSample(MAIN, 1, 10.0, "python", "python train.py", cpu_s, cpu_s, state, {state: 1}, "", (), io, 0, False, io)


def window(cores: float, io_per_s: float = 0.0, state: str = "S", gpu: Optional[Dict[str, Any]] = None) -> Window:
    """Ten samples 2 s apart of one process using ``cores`` of CPU and doing ``io_per_s`` of I/O."""
    found = Window()
    for i in range(10):
        found.add(
            Sample(ts=2.0 * i, procs=(proc(2.0 * i * cores, int(2 * i * io_per_s), state),), caches=(), gpu=gpu, cost_s=0.0)
        )
    return found


def dump(function: str, file: str, line: int, k: int) -> str:
    """A ``py-spy dump --json --locals`` of one main thread at ``function`` with a loop variable ``k``."""
    frame = {"name": function, "filename": file, "short_filename": file, "line": line, "locals": [{"name": "k", "repr": str(k)}]}
    caller = {"name": "<module>", "filename": "train.py", "short_filename": "train.py", "line": 9, "locals": []}
    thread: Dict[str, Any] = {"thread_id": 1, "thread_name": "MainThread", "os_thread_id": MAIN, "active": True}
    thread.update(owns_gil=False, frames=[frame, caller])
    return json.dumps([thread])


SYNC = ("synchronize", "torch/cuda/__init__.py", 801)


def test_an_idle_tree_shows_no_sign_of_work() -> None:
    activity = busy.assess(window(0.0), MAIN, (None, None))
    assert activity.signs == () and not activity.busy


def test_cpu_io_and_a_busy_gpu_are_signs_of_work() -> None:
    assert busy.signs(window(1.0)) == (f"pid {MAIN} (python) wants 100 % CPU",)
    assert busy.signs(window(0.0, io_per_s=8 << 20)) == ("the tree reads and writes 8.0 MiB/s",)
    gpu = {"source": "nvidia-smi", "utilisation_pct": [97], "memory_mib": {str(MAIN): 900}}
    assert busy.signs(window(1.0, gpu=gpu))[-1] == "GPU at 97 % utilisation"
    assert busy.signs(window(0.0, gpu=gpu)) == (), "a busy GPU beside an idle tree is a kernel that does not end"


def test_a_busy_tree_without_a_stack_is_busy() -> None:
    activity = busy.assess(window(1.0), MAIN, (None, None))
    assert activity.busy and activity.guess == "computing"
    assert busy.assess(window(0.0, io_per_s=8 << 20), MAIN, (None, None)).guess == "reading or writing"


def test_a_frozen_device_wait_is_a_hang_whatever_its_cpu() -> None:
    """CUDA's synchronise spins a core on a kernel that never ends: the stack, the same in both dumps, says so."""
    same = dump(*SYNC, k=3)
    activity = busy.assess(window(1.0), MAIN, (same, same))
    assert not activity.busy and activity.hang is not None and activity.hang.cause is Cause.GPU_WAIT
    assert activity.to_dict()["hang"]["cause"] == "gpu_wait"


def test_an_evaluation_waiting_on_the_gpu_between_batches_is_busy() -> None:
    """A healthy evaluation waits in ``loss.item()`` most of the time too, but its loop goes on between two dumps."""
    activity = busy.assess(window(1.0), MAIN, (dump(*SYNC, k=3), dump(*SYNC, k=9)))
    assert activity.busy and activity.hang is None


def test_the_guess_comes_from_the_stack() -> None:
    evaluating = dump("estimate_loss", "train.py", 70, k=1)
    assert busy.assess(window(1.0), MAIN, (evaluating, dump("estimate_loss", "train.py", 71, k=2))).guess == "evaluation?"
    saving = dump("_save", "torch/serialization.py", 900, k=1)
    assert (
        busy.assess(window(0.0, io_per_s=8 << 20), MAIN, (saving, dump("_save", "torch/serialization.py", 901, 2))).guess
        == "save?"
    )


def test_frozen_needs_two_equal_dumps() -> None:
    assert busy.frozen(dump(*SYNC, 1), dump(*SYNC, 1))
    assert not busy.frozen(dump(*SYNC, 1), dump(*SYNC, 2))
    for broken in (None, "", "not json", "{}", "[]"):
        assert not busy.frozen(broken, broken)


def test_look_dumps_the_busiest_process_twice_and_an_idle_tree_never() -> None:
    asked: List[int] = []

    def fake_dump(pid: int) -> Optional[str]:
        asked.append(pid)
        return dump(*SYNC, k=1)

    assert busy.look(window(0.0), fake_dump, lambda s: None).signs == () and asked == []
    assert busy.look(window(1.0), fake_dump, lambda s: None).hang is not None and asked == [MAIN, MAIN]
