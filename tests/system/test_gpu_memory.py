"""Whose GPU memory it is (train/system/gpu_memory.py): the tools' answers, and host pids as a container sees them,
against a real H100 recording replayed by a stand-in nvidia-smi (tests/smi.py; no GPU here)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.paths import FIXTURES
from tests.smi import H100, install, recorded
from tests.supervised import wait_for
from trainbox.system import gpu_memory
from trainbox.system.gpu_memory import GpuMemory, GpuProcess


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose nvidia-smi is the stand-in (and no rocm-smi)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}:/bin:/usr/bin")
    for name in ("nvidia-smi", "rocm-smi"):
        if any((Path(p) / name).exists() for p in ("/bin", "/usr/bin")):
            pytest.fail(f"a real {name} is installed: this test's stand-in would not be the one found")
    return directory


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep", 30, "the exec of sleep")
    yield proc
    proc.kill()
    proc.wait()


def test_both_tools_answers_are_read() -> None:
    """nvidia-smi's CSV (pid, process name, MiB) and rocm-smi's KFD table (layout: tests/fixtures/causes/README.md)."""
    rows = gpu_memory.nvidia_processes("4121, /usr/bin/python3, 2048\n4188, a, b, 16\n4121, python3, 512\nNo data\n")
    assert rows == [GpuProcess(4121, "/usr/bin/python3", 2048), GpuProcess(4188, "a, b", 16), GpuProcess(4121, "python3", 512)]
    assert gpu_memory.by_pid(rows) == {4121: 2560, 4188: 16}
    table = (FIXTURES / "causes" / "smi" / "rocm-smi-showpids.txt").read_text()
    assert gpu_memory.by_pid(gpu_memory.rocm_processes(table)) == {4121: 2048, 4188: 0}
    assert gpu_memory.nvidia_used("10551\n27\n") == 10578 and gpu_memory.nvidia_used("") is None
    assert gpu_memory.rocm_used("GPU[0]\t\t: VRAM Total Used Memory (B): 1073741824\n") == 1024


def test_a_listed_process_is_here_only_with_its_pid_and_its_name(sleeper: subprocess.Popen) -> None:
    assert gpu_memory.is_here(GpuProcess(sleeper.pid, "/usr/bin/sleep", 1))
    assert gpu_memory.is_here(GpuProcess(sleeper.pid, "sleep", 1))
    assert not gpu_memory.is_here(GpuProcess(sleeper.pid, "/opt/torch/.venv/bin/python3", 1)), "the pid, not the process"
    assert not gpu_memory.is_here(GpuProcess(sleeper.pid, "", 1))


def test_the_recorded_host_pid_makes_per_process_memory_unknown(bin_dir: Path) -> None:
    """Issue 33 item 11: nvidia-smi names the H100 run's process 4230, a host pid; here it is no such process."""
    training = recorded(H100 / "training-queries.txt")[3]  # 10540 MiB held by pid 4230, 10551 MiB used
    assert training.processes == ((4230, "/opt/torch/.venv/bin/python3", 10540),) and training.used_mib == 10551
    if gpu_memory.is_here(GpuProcess(*training.processes[0])):
        pytest.fail("this machine runs a python3 as pid 4230: the recording's host pid is one of ours here")
    install(bin_dir, [training])
    assert gpu_memory.read(3.0) == GpuMemory("nvidia-smi", None, 10551), "unknown per process, the device's total known"
    assert gpu_memory.device_used_mib(3.0) == 10551


def test_pids_of_this_machine_are_counted_per_process(bin_dir: Path, sleeper: subprocess.Popen) -> None:
    """The same answer with the pid of a process here (no container): memory per pid, as before."""
    moment = recorded(H100 / "training-queries.txt")[3]
    install(bin_dir, [type(moment)(moment.utilisation, moment.used_mib, ((sleeper.pid, "/usr/bin/sleep", 10540),))])
    assert gpu_memory.read(3.0) == GpuMemory("nvidia-smi", {sleeper.pid: 10540}, None)


def test_without_a_tool_or_its_answer_nothing_is_known(bin_dir: Path) -> None:
    assert gpu_memory.read(1.0) is None and gpu_memory.device_used_mib(1.0) is None
    assert os.environ["PATH"].startswith(str(bin_dir))
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 30\n")  # a driver that no longer answers
    (bin_dir / "nvidia-smi").chmod(0o755)
    started = time.monotonic()
    assert gpu_memory.read(0.5) is None and time.monotonic() - started < 10
