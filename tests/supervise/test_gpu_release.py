"""The gpu_wait retry's wait for the killed tree's GPU memory, against stand-in SMI tools on PATH (no GPU here:
the tools print what nvidia-smi --query-compute-apps and rocm-smi --showpids print)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, List

import pytest

from trainbox.diagnose import evidence
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


def no_sleep(slept: List[float]) -> Callable[[float], bool]:
    """A sleep that only records how long it was asked for (and is never stopped)."""

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return False

    return sleep


def test_waits_until_the_killed_pids_hold_no_memory(bin_dir: Path, tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    # Pid 4242 holds 512 MiB for the first two looks, then the driver has freed it; pid 77 is someone else's.
    tool(
        bin_dir,
        "nvidia-smi",
        f'echo x >> {counter}\nif [ $(wc -l < {counter}) -le 2 ]; then echo "4242, 512"; fi\necho "77, 900"\n',
    )
    slept: List[float] = []
    result = gpu_release.wait([4242, 4243], no_sleep(slept))

    assert result["gpu_release"] == "released"
    assert slept == [gpu_release.POLL_S, gpu_release.POLL_S]
    assert evidence.gpu_memory_by_pid() == {77: 900}


def test_gives_up_after_its_limit_and_says_what_is_held(bin_dir: Path) -> None:
    header = 'echo "KFD process information:"\necho "PID\tPROCESS NAME\tGPU(s)\tVRAM USED"\n'
    tool(bin_dir, "rocm-smi", header + 'echo "4242\tpython\t1\t1073741824\t0\t0"\n')
    started = time.monotonic()
    result = gpu_release.wait([4242], lambda s: time.sleep(s) or False, limit_s=0.5)

    assert result["gpu_release"] == "1024 MiB still held after 0.5 s"
    assert result["gpu_release_s"] >= 0.5 and time.monotonic() - started < 10


def test_without_a_gpu_tool_there_is_nothing_to_wait_for(bin_dir: Path) -> None:
    assert evidence.gpu_memory_by_pid() is None
    assert gpu_release.wait([os.getpid()], no_sleep([]))["gpu_release"] == "no GPU tool answered: nothing to wait for"


def test_a_stop_signal_ends_the_wait(bin_dir: Path) -> None:
    tool(bin_dir, "nvidia-smi", 'echo "4242, 512"\n')
    assert gpu_release.wait([4242], lambda s: True)["gpu_release"] == "stopped while 512 MiB were held"
