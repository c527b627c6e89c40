"""Reading Conditions a step per poll: on a fake clock with fake snapshots and recorded stacks, and once for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import pytest

from trainbox.diagnose import conditions
from trainbox.diagnose.conditions import ConditionsProbe, GpuReader
from trainbox.diagnose.slowness import explain
from trainbox.system.gpu_clocks import GpuClocks, Reading
from trainbox.system.pressure import Process, Snapshot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
IN_LOADER = (FIXTURES / "causes/loader_deadlock_supervised/stacks/32099.txt").read_text()
ELSEWHERE = (FIXTURES / "causes/gpu_wait_cuda_sync/stacks/10432.txt").read_text()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_take(clock: Clock) -> Any:
    """Snapshots on ``clock`` of a tree whose two DataLoader workers each used a tenth of a second per call."""
    calls: List[Sequence[int]] = []

    def take(tree: Sequence[int], root: Optional[int] = None) -> Snapshot:
        calls.append(tree)
        ticks = 10 * len(calls)
        processes = {pid: Process("pt_data_worker" if pid != 32099 else "python", 1, ticks) for pid in tree}
        return Snapshot(clock(), frozenset(tree), 0, processes, {}, 0, (1000 * len(calls), 0), 2**30)

    return take


def test_a_reading_takes_its_interval_a_step_per_poll_and_samples_the_loader() -> None:
    clock = Clock()
    dumps = iter([IN_LOADER, IN_LOADER, ELSEWHERE, IN_LOADER, None])
    probe = ConditionsProbe(GpuReader(lambda: None), lambda pid: next(dumps), fake_take(clock), clock)
    tree = [32099, 32100, 32101]
    probe.begin(tree, 32099, 32099, loader=True, wall=1000.0)
    results = []
    while clock.now < 100.0 + conditions.PRESSURE_INTERVAL_S + 1:
        results.append(probe.step(tree, 32099))
        clock.now += 0.5
    done = [r for r in results if r is not None]
    assert len(done) == 1 and not probe.busy
    began, found = done[0]
    assert began == 1000.0
    assert found.workers == frozenset({32100, 32101})
    assert found.loader_wait == 0.75  # 3 of the 4 dumps that came show the main thread in the DataLoader
    assert found.pressure is not None and found.pressure.interval_s >= conditions.PRESSURE_INTERVAL_S
    assert found.gpus == ()


def test_a_reading_without_the_loader_takes_no_dumps_and_can_be_cancelled() -> None:
    clock = Clock()
    probe = ConditionsProbe(
        GpuReader(lambda: None), lambda pid: (_ for _ in ()).throw(AssertionError("no dump")), fake_take(clock), clock
    )
    probe.begin([1], 1, 1, loader=False, wall=5.0)
    clock.now += conditions.PRESSURE_INTERVAL_S
    done = probe.step([1], 1)
    assert done is not None and done[1].loader_wait is None
    probe.begin([1], 1, 1, loader=False, wall=6.0)
    probe.cancel()
    assert not probe.busy and probe.step([1], 1) is None


def test_the_gpu_tool_is_given_up_once_missing_or_hung() -> None:
    gpu = GpuClocks(0, 60.0, 1500.0, 1980.0, 300.0, 700.0)
    answers = iter([Reading("nvidia-smi", gpus=(gpu,)), Reading("nvidia-smi", error="x: no answer", hung=True)])
    reader = GpuReader(lambda: next(answers))
    assert reader.read() == (gpu,)
    assert reader.read() == () and reader.given_up
    assert reader.read() == ()  # not asked again (the iterator is spent: asking would raise)
    missing = GpuReader(lambda: None)
    assert missing.read() == () and missing.given_up


def test_a_real_reading_of_a_real_process() -> None:
    """This machine's /proc and py-spy: a sleeping Python process, read as the supervisor reads it."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        time.sleep(0.5)
        probe = ConditionsProbe(GpuReader(lambda: None))
        probe.begin([child.pid], child.pid, child.pid, loader=True, wall=time.time())
        deadline = time.monotonic() + conditions.PRESSURE_INTERVAL_S + 10
        done = None
        while done is None and time.monotonic() < deadline:
            done = probe.step([child.pid], child.pid)
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait()
    assert done is not None
    found = done[1]
    assert found.pressure is not None and found.pressure.tree_rss_bytes and found.pressure.tree_cpu_pct < 50
    assert found.loader_wait == 0.0  # py-spy saw the main thread, in time.sleep: never in a DataLoader
    assert found.workers == frozenset()
    assert probe.spent_s > 0 and os.getpid() not in {p.pid for p in found.pressure.outside}


CLOCKS = FIXTURES / "smi" / "clocks"


def _tool(directory: Path, name: str, first: str, then: Path) -> None:
    """A fake ``name`` on PATH: ``first`` on its first call (the pace), the recorded ``then`` ever after."""
    script = directory / name
    script.write_text(
        f"#!/bin/sh\nif [ -e {directory}/{name}.seen ]; then cat {then}; else touch {directory}/{name}.seen; {first}; fi\n"
    )
    script.chmod(0o755)


@pytest.mark.parametrize(
    ("tool", "first", "then", "evidence"),
    [
        (
            "nvidia-smi",
            f"sed -n 15p {CLOCKS / 'h100-recorded.txt'}",  # the real H100, busy at its power cap
            CLOCKS / "h100-thermal.csv",
            "GPU 0 at 91 °C, clocks 645 of 1980 MHz, HW_SLOWDOWN, SW_THERMAL_SLOWDOWN, HW_THERMAL_SLOWDOWN"
            " (baseline 1365 MHz at 68 °C)",
        ),
        (
            "rocm-smi",
            f"cat {CLOCKS / 'rocm-gfx1010-steady.txt'}",
            CLOCKS / "rocm-gfx1010-hot.txt",
            "GPU 0 at 94 °C, clocks 1180 of 1905 MHz (baseline 1905 MHz at 71 °C)",
        ),
    ],
)
def test_a_throttling_gpu_read_from_its_tool_is_thermal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str, first: str, then: Path, evidence: str
) -> None:
    """The recorded tool output, through the reader and a reading at pace and one now, to the suspect."""
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/bin{os.pathsep}/usr/bin")
    _tool(tmp_path, tool, first, then)
    clock = Clock()
    probe = ConditionsProbe(GpuReader(), lambda pid: None, fake_take(clock), clock)
    readings = []
    for _ in range(2):
        probe.begin([7], 7, 7, loader=False, wall=clock.now)
        clock.now += conditions.PRESSURE_INTERVAL_S
        done = probe.step([7], 7)
        assert done is not None
        readings.append(done[1])
    found = explain(*readings)
    assert found.suspect == "thermal" and not found.inside
    assert found.evidence[0] == evidence
