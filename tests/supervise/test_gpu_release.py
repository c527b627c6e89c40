"""The gpu_wait retry's wait for the killed tree's GPU memory, against stand-in SMI tools on PATH (no GPU here:
the tools print what nvidia-smi --query-compute-apps and rocm-smi --showpids print), and against a real H100
recording whose pids are the host's, as a container sees them (tests/smi.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from tests.smi import H100, install, recorded
from tests.supervised import wait_for
from trainbox.supervise import gpu_release


def tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with only the stand-in tools (and sh)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}:/bin:/usr/bin")
    for name in ("nvidia-smi", "rocm-smi"):
        if any((Path(p) / name).exists() for p in ("/bin", "/usr/bin")):
            pytest.fail(f"a real {name} is installed: this test's stand-in would not be the one found")
    return directory


@pytest.fixture
def killed() -> Iterator[int]:
    """A process of this machine standing in for the killed tree's (the tools list it as ``sleep``)."""
    proc = subprocess.Popen(["sleep", "600"])
    wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep", 30, "the exec of sleep")
    yield proc.pid
    proc.kill()
    proc.wait()


def no_sleep(slept: List[float]) -> Callable[[float], bool]:
    """A sleep that only records how long it was asked for (and is never stopped)."""

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return False

    return sleep


def test_waits_until_the_killed_pids_hold_no_memory(bin_dir: Path, tmp_path: Path, killed: int) -> None:
    counter = tmp_path / "calls"
    other = f"{os.getpid()}, {Path('/proc/self/comm').read_text().strip()}, 900"  # another program's, here too
    # The killed pid holds 512 MiB for the first two looks, then the driver has freed it.
    tool(
        bin_dir,
        "nvidia-smi",
        f'echo x >> {counter}\nif [ $(wc -l < {counter}) -le 2 ]; then echo "{killed}, sleep, 512"; fi\necho "{other}"\n',
    )
    slept: List[float] = []
    result = gpu_release.wait([killed, killed + 1], no_sleep(slept))

    assert result["gpu_release"] == "released"
    assert slept == [gpu_release.POLL_S, gpu_release.POLL_S]


def test_in_a_container_the_devices_memory_stands_in_for_the_killed_pids(bin_dir: Path, killed: int) -> None:
    """Issue 33 item 11: the real H100 answers name the training process by its host pid (4230), which is no process
    here. The wait must not call that "released" while 10,551 MiB are used: it waits until the device is back under
    512 MiB (no level before the attempt given) in the recording's idle moments."""
    busy = recorded(H100 / "training-queries.txt")[3]
    idle = recorded(H100 / "idle-queries.txt")[0]
    assert busy.used_mib == 10551 and busy.processes[0][0] == 4230 and idle.used_mib == 0
    install(bin_dir, [busy, busy, idle])
    slept: List[float] = []
    result = gpu_release.wait([killed], no_sleep(slept))

    assert result["gpu_release"] == "released", result
    assert slept == [gpu_release.POLL_S, gpu_release.POLL_S], "two looks saw the 10,551 MiB still used"


def test_in_a_container_memory_that_was_there_before_the_attempt_is_not_waited_for(bin_dir: Path, killed: int) -> None:
    busy = recorded(H100 / "training-queries.txt")[3]
    install(bin_dir, [busy])
    assert gpu_release.wait([killed], no_sleep([]), before_mib=busy.used_mib)["gpu_release"].startswith("released (10551 MiB")
    held = gpu_release.wait([killed], lambda s: time.sleep(s) or False, limit_s=0.2, before_mib=None)
    assert held["gpu_release"].startswith("10551 MiB on the GPU (per-process memory unknown"), held


def test_gives_up_after_its_limit_and_says_what_is_held(bin_dir: Path, killed: int) -> None:
    header = 'echo "KFD process information:"\necho "PID\tPROCESS NAME\tGPU(s)\tVRAM USED"\n'
    tool(bin_dir, "rocm-smi", header + f'echo "{killed}\tsleep\t1\t1073741824\t0\t0"\n')
    started = time.monotonic()
    result = gpu_release.wait([killed], lambda s: time.sleep(s) or False, limit_s=0.5)

    assert result["gpu_release"] == "1024 MiB still held after 0.5 s"
    assert result["gpu_release_s"] >= 0.5 and time.monotonic() - started < 10


def test_without_a_gpu_tool_there_is_nothing_to_wait_for(bin_dir: Path) -> None:
    assert gpu_release.baseline() is None
    assert gpu_release.wait([os.getpid()], no_sleep([]))["gpu_release"] == "no GPU tool answered: nothing to wait for"


def test_a_stop_signal_ends_the_wait(bin_dir: Path, killed: int) -> None:
    tool(bin_dir, "nvidia-smi", f'echo "{killed}, sleep, 512"\n')
    assert gpu_release.wait([killed], lambda s: True)["gpu_release"] == "stopped while 512 MiB were held"
