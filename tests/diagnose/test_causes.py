"""The classifier (train/diagnose/causes.py) on real hangs here, and on recorded evidence for what cannot happen here."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.paths import FIXTURES
from tests.sampling import Tree, tree, wait_for_children, wait_for_line, watch  # noqa: F401 - tree is a fixture
from tests.smi import H100, install, recorded
from trainbox import faults, heartbeat
from trainbox.diagnose import evidence, incident
from trainbox.diagnose.causes import Cause, classify, gpu_resets, kernel_time
from trainbox.diagnose.window import Window
from trainbox.rundir.layout import RunDir
from trainbox.system import proctree


def stacks_of(pids: list) -> Dict[int, str]:
    """Real stacks, as the incident collects them (py-spy here)."""
    found = incident.collect_stacks(pids, None)
    return {pid: text for pid, (text, _) in found.items() if text}


def test_python_spin_is_busy_python(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; f.hang_spin()")
    window = watch(child.pid, 3)
    assert window.idle_for_s() == 0.0 and window.demand_cores()[child.pid] > 0.8, window.demand_cores()
    diagnosis = classify(window, stacks_of([child.pid]), child.pid)
    assert diagnosis.cause is Cause.BUSY_PYTHON, diagnosis
    assert "hang_spin" in diagnosis.evidence[0]


def test_lock_deadlock_is_idle(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; print('ready', flush=True); f.hang_lock_deadlock()")
    wait_for_line(child, "ready")
    window = watch(child.pid, 4)
    diagnosis = classify(window, stacks_of([child.pid]), child.pid)
    assert diagnosis.cause is Cause.IDLE, diagnosis
    assert diagnosis.evidence[0].startswith("whole tree idle for")
    assert "hang_lock_deadlock" in diagnosis.evidence[1]
    assert diagnosis.to_dict() == {"cause": "idle", "evidence": list(diagnosis.evidence)}


def test_a_stopped_worker_is_stopped_and_the_waiting_main_thread_told_apart(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; f.hang_on_stopped_worker()")
    wait_for_children(child.pid, 1)
    window = watch(child.pid, 3)
    (worker,) = [p.pid for p in window.last.procs if p.ppid == child.pid]  # type: ignore[union-attr]
    diagnosis = classify(window, stacks_of([child.pid, worker]), child.pid)
    assert diagnosis.cause is Cause.STOPPED, diagnosis
    assert diagnosis.evidence[0].startswith(f"pid {worker} (python") and "stopped (state T" in diagnosis.evidence[0]
    assert diagnosis.evidence[-1].endswith("faults.py:hang_on_stopped_worker (not stopped)"), diagnosis.evidence


def test_a_thread_holding_the_gil_in_c_is_gil_held_and_named_first(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import trainbox.faults as f; print('ready', flush=True); f.hang_holding_the_gil()")
    wait_for_line(child, "ready")
    window = watch(child.pid, 3)
    stacks = stacks_of([child.pid])
    assert "(idle+gil)" in stacks[child.pid], stacks
    diagnosis = classify(window, stacks, child.pid)
    assert diagnosis.cause is Cause.GIL_HELD, diagnosis
    assert "(gil-holder) holds the GIL off the CPU" in diagnosis.evidence[0]
    assert "hold_the_gil_in_c" in diagnosis.evidence[0].split(" in ", 1)[1], "the holder's own frames first"
    assert "the main thread in" in diagnosis.evidence[1], diagnosis.evidence


HANGING_LOADER = """
import torch
from torch.utils.data import DataLoader, Dataset
from trainbox import faults, heartbeat

heartbeat.install_stack_dump()  # faulthandler on SIGUSR1, re-registered in each forked worker

class Hangs(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        faults.point("worker", index=index)
        return torch.zeros(3)

for batch in DataLoader(Hangs(), batch_size=4, num_workers=2, multiprocessing_context="fork"):
    pass
"""


def faulthandler_stacks(run_dir: Path, pids: List[int]) -> Dict[int, str]:
    """Real faulthandler dumps, asked for as the incident's fallback asks (SIGUSR1, trainbox.heartbeat)."""
    for pid in pids:
        os.kill(pid, heartbeat.STACK_DUMP_SIGNAL)
    dumps = {pid: RunDir(run_dir).stack_dump(pid) for pid in pids}
    deadline = time.monotonic() + 30
    while not all(path.exists() and "most recent call first" in path.read_text() for path in dumps.values()):
        assert time.monotonic() < deadline, "no faulthandler dump"
        time.sleep(0.1)
    time.sleep(0.2)  # the dump is written in pieces
    return {pid: path.read_text() for pid, path in dumps.items()}


def test_dataloader_with_blocked_forked_workers_is_loader_deadlock(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    """Read from py-spy's dumps and from faulthandler's: the same cause, the same places."""
    child = tree.python(HANGING_LOADER, env=dict(os.environ, TRAIN_FAULT="sleep@worker", TRAIN_RUN_DIR=str(tmp_path)))
    wait_for_children(child.pid, 2, timeout=120)
    window = watch(child.pid, 4)
    workers = [p.pid for p in window.last.procs if p.ppid == child.pid]  # type: ignore[union-attr]
    diagnosis = classify(window, stacks_of([child.pid, *workers]), child.pid)
    assert diagnosis.cause is Cause.LOADER_DEADLOCK, diagnosis
    assert diagnosis.evidence[0] == "main thread in torch/utils/data/dataloader.py:_MultiProcessingDataLoaderIter._try_get_data"
    assert diagnosis.evidence[1].startswith(f"workers {' '.join(map(str, workers))}: ")
    # py-spy names the file by the path it was imported from (train/ in a checkout, site-packages in an install)
    assert "/faults.py:hang_sleep (from <string>:Hangs.__getitem__)" in diagnosis.evidence[1]

    diagnosis = classify(window, faulthandler_stacks(tmp_path, [child.pid, *workers]), child.pid)
    assert diagnosis.cause is Cause.LOADER_DEADLOCK, diagnosis
    assert diagnosis.evidence[0] == "main thread in torch/utils/data/dataloader.py:_try_get_data"
    assert f"blocked in {faults.__file__}:hang_sleep (from <string>:__getitem__)" in diagnosis.evidence[1]


CAUSES = FIXTURES / "causes"


@pytest.mark.parametrize("name", sorted(p.name for p in CAUSES.iterdir() if (p / "expected.json").exists()))
def test_recorded_evidence_is_classified(name: str) -> None:
    """gpu_wait and io_wait from recorded evidence (tests/fixtures/causes/README.md says where each came from)."""
    fixture = CAUSES / name
    expected = json.loads((fixture / "expected.json").read_text())
    window = Window.from_json(json.loads((fixture / "evidence.json").read_text()))
    stacks = {int(path.stem): path.read_text() for path in (fixture / "stacks").glob("*.txt")}
    diagnosis = classify(window, stacks, expected["main_pid"], (fixture / "kernel.txt").read_text())
    assert diagnosis.cause.value == expected["cause"], diagnosis
    assert expected["first_evidence_has"] in diagnosis.evidence[0], diagnosis
    for absent in expected["no_evidence_has"]:
        assert not any(absent in line for line in diagnosis.evidence), diagnosis


NATIVE_LOOP = """
import torch
torch.set_num_threads(1)
a = torch.randn(400, 400)
print("looping", flush=True)
while True:
    torch.mm(a, a)
"""


def test_native_busy_loop_is_busy_native(tree: Tree) -> None:  # noqa: F811
    child = tree.python(NATIVE_LOOP)
    wait_for_line(child, "looping")
    window = watch(child.pid, 3)
    diagnosis = classify(window, stacks_of([child.pid]), child.pid)
    assert diagnosis.cause is Cause.BUSY_NATIVE, diagnosis
    assert "in native code called from <string>:<module>" in diagnosis.evidence[0]


SLOW_READER = """
import pathlib, sys, torch
from torch.utils.data import DataLoader, Dataset

class RemoteImages(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return len(pathlib.Path(sys.argv[1]).read_bytes())

for batch in DataLoader(RemoteImages(), num_workers=1, multiprocessing_context="fork"):
    pass
"""


def trickle(path: Path, stop: threading.Event) -> None:
    """A slow network filesystem: 128 KiB every 0.25 s into the file the dataset reads.

    A thread of the test, not a process: every other child of the test process would count as
    part of the tree (:class:`trainbox.system.proctree.ProcessTree` adopts them, as a subreaper must).
    """
    try:
        with open(path, "wb", buffering=0) as pipe:
            while not stop.is_set():
                pipe.write(bytes(128 * 1024))
                time.sleep(0.25)
    except BrokenPipeError:
        pass  # the reader was killed at the end of the test


def test_dataloader_worker_in_a_slow_read_is_io_wait(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    fifo = tmp_path / "images.bin"
    os.mkfifo(fifo)
    child = tree.python(SLOW_READER, str(fifo))
    stop = threading.Event()
    writer = threading.Thread(target=trickle, args=(fifo, stop), daemon=True)
    writer.start()
    try:
        wait_for_children(child.pid, 1, timeout=120)
        window = watch(child.pid, 4)
        worker = next(p.pid for p in window.last.procs if p.ppid == child.pid)  # type: ignore[union-attr]
        diagnosis = classify(window, stacks_of([child.pid, worker]), child.pid)
    finally:
        stop.set()
        tree.stop()  # the reader ends, so the writer's next write fails
        writer.join(timeout=10)
    assert diagnosis.cause is Cause.IO_WAIT, diagnosis
    assert diagnosis.evidence[0] == f"pid {worker} reading in pathlib.py:Path.read_bytes"


TORCH_COMPILE = """
import time, torch
print("compiling", flush=True)

@torch.compile
def f(x):
    return (x.sin() * x.cos()).sum(dim=0) + x.mean()

f(torch.randn(64, 64))
# The pool of compile workers Inductor keeps for the process's life when it compiles in parallel
# (for GPU kernels; a CPU-only compile here runs in-process): idle from now on.
from torch._inductor.compile_worker.subproc_pool import SubprocPool
pool = SubprocPool(2)
print("compiled", flush=True)
time.sleep(600)
"""


def test_torch_compile_is_kernel_compile_and_its_idle_worker_pool_is_idle(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    """Real Inductor on the CPU filling TORCHINDUCTOR_CACHE_DIR, then its real compile-worker pool, idle."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    child = tree.python(TORCH_COMPILE, env=env)
    wait_for_line(child, "compiling")
    sampler = evidence.Sampler(proctree.ProcessTree(child.pid), env)
    window = Window()
    deadline = time.monotonic() + 240
    while not window.compile_progress():
        assert time.monotonic() < deadline, "no compile progress seen"
        time.sleep(0.5)
        window.add(sampler.sample())
    diagnosis = classify(window, stacks_of([p.pid for p in window.last.procs]), child.pid)  # type: ignore[union-attr]
    assert diagnosis.cause is Cause.KERNEL_COMPILE, diagnosis
    assert any("TORCHINDUCTOR_CACHE_DIR grew by" in line or "running for" in line for line in diagnosis.evidence)
    wait_for_line(child, "compiled")
    window.clear()
    while window.idle_for_s() < 2:
        assert time.monotonic() < deadline, "the tree never went idle after its compile"
        time.sleep(0.5)
        window.add(sampler.sample())
    workers = [p for p in window.last.procs if p.compiler]  # type: ignore[union-attr]
    assert workers and "torch/_inductor/compile_worker/__main__.py" in workers[0].cmdline
    assert window.compile_progress() == ()


def test_an_idle_tree_on_a_busy_gpu_is_gpu_wait_in_a_container_too(
    tree: Tree,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33 item 11: inside a container nvidia-smi names processes by their host pids (here the real H100
    recording's pid 4230), so the tree "held no memory" and the busy-kernel rule never fired. Now the GPU's used
    memory stands in. The recording never reached full utilisation (a training run); a kernel that never ends keeps
    it at 100 %, so the replay says 100."""
    moment = recorded(H100 / "training-queries.txt")[3]
    install(tmp_path / "bin", [dataclasses.replace(moment, utilisation=100)])
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(evidence, "GPU_EVERY_S", 0.0)  # every sample asks the tool
    child = tree.python("import time; print('ready', flush=True); time.sleep(600)")
    wait_for_line(child, "ready")
    window = watch(child.pid, 4)
    diagnosis = classify(window, {}, child.pid)
    assert diagnosis.cause is Cause.GPU_WAIT, diagnosis
    assert diagnosis.evidence[1] == "the GPU holds 10551 MiB (per-process memory unknown: the tool's pids are the host's)"


def test_kernel_messages_are_dated_in_each_log_format() -> None:
    """dmesg --time-format iso, journalctl's short format (local time) and dmesg's seconds since boot.

    The boot time is made up (ten days ago), not this machine's: a CI machine booted minutes ago would put a line
    "an hour ago" before its boot, at a negative uptime no kernel writes.
    """
    now = time.time()
    boot = now - 10 * 86400
    minute_ago = now - 60
    lines = {
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(minute_ago)) + ",123456+00:00 amdgpu: GPU reset begin!": minute_ago,
        time.strftime("%b %d %H:%M:%S", time.localtime(minute_ago)) + " host kernel: amdgpu: GPU reset begin!": minute_ago,
        f"[{minute_ago - boot:12.6f}] amdgpu: GPU reset begin!": minute_ago,
    }
    for line, logged in lines.items():
        assert abs(kernel_time(line, boot) - logged) < 1.5, line  # type: ignore[operator]
    assert kernel_time("amdgpu: GPU reset begin!", boot) is None
    older = f"[{minute_ago - boot - 3600:12.6f}] amdgpu: GPU reset begin!"
    killed = f"[{minute_ago - boot:12.6f}] NVRM: Xid (PCI:0000:65:00): 45, pid=7, name=python3, Ch 00000010"
    assert gpu_resets("\n".join([*lines, older, killed]), since=now - 120, boot=boot) == [line.strip() for line in lines]


def test_nothing_to_go_on_is_unknown() -> None:
    """A stall judged before the first sample, with py-spy and faulthandler both failing."""
    diagnosis = classify(Window(), {}, os.getpid())
    assert diagnosis.to_dict() == {"cause": "unknown", "evidence": ["no rule matched: no samples of the tree"]}
