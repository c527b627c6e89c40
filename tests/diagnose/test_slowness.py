"""Why a run became slow: the rules on readings (recorded GPU output, real stack dumps), in milliseconds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainbox.diagnose.slowness import SUSPECTS, Conditions, explain, loader_wait_share, loader_workers
from trainbox.system.gpu_clocks import GpuClocks, parse_nvidia, parse_rocm
from trainbox.system.memcg import MemoryLimit
from trainbox.system.pressure import OutsideProcess, Pressure, Process, Snapshot

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CLOCKS = FIXTURES / "smi" / "clocks"
GIB = 2**30
MIB = 2**20

#: A run at its pace on a shared 2-core machine: little outside CPU, the run busy, some CPU pressure already.
QUIET = Pressure(
    interval_s=5.0,
    outside=(OutsideProcess(812, "sshd", 2.0),),
    outside_cpu_pct=12.0,
    tree_cpu_pct=180.0,
    psi={"cpu": 8.0, "memory": 0.0, "io": 1.0},
    swap_in_per_s=0.0,
    iowait_pct=1.0,
    tree_rss_bytes=int(2.8 * GIB),
    tree_read_bytes_per_s=45.0 * 2**20,
)


def pressure(**changes: Any) -> Pressure:
    return dataclasses.replace(QUIET, **changes)


#: QUIET with a new busy process outside the run.
HOGGED = pressure(outside=(OutsideProcess(4121, "python", 140.0, 9000), *QUIET.outside), outside_cpu_pct=150.0)


def _h100(line: int) -> GpuClocks:
    return parse_nvidia((CLOCKS / "h100-recorded.txt").read_text())[line]


def test_a_thermal_throttle_against_a_busy_baseline() -> None:
    """Baseline: the real H100 at its power cap; now: the constructed thermal throttle."""
    (hot,) = parse_nvidia((CLOCKS / "h100-thermal.csv").read_text())
    found = explain(Conditions(QUIET, gpus=(_h100(3),)), Conditions(QUIET, gpus=(hot,)))
    assert found.suspect == "thermal" and not found.inside
    assert found.evidence == (
        "GPU 0 at 91 °C, clocks 645 of 1980 MHz, HW_SLOWDOWN, SW_THERMAL_SLOWDOWN, HW_THERMAL_SLOWDOWN"
        " (baseline 1365 MHz at 68 °C)",
    )


def test_a_power_cap_is_not_a_slowdown() -> None:
    busy = _h100(3)
    assert explain(Conditions(QUIET, gpus=(busy,)), Conditions(QUIET, gpus=(busy,))).suspect == "unknown"


def test_a_hot_amd_gpu_that_clocked_down_is_thermal() -> None:
    """rocm-smi gives no reasons: a clock 38 % lower at 94 °C is the throttle."""
    (steady,) = parse_rocm((CLOCKS / "rocm-gfx1010-steady.txt").read_text())
    (hot,) = parse_rocm((CLOCKS / "rocm-gfx1010-hot.txt").read_text())
    found = explain(Conditions(gpus=(steady,)), Conditions(gpus=(hot,)))
    assert found.suspect == "thermal"
    assert found.evidence[0] == "GPU 0 at 94 °C, clocks 1180 of 1905 MHz (baseline 1905 MHz at 71 °C)"


def test_a_starved_gpu_that_clocked_down_is_not_thermal() -> None:
    """The recorded idle H100 (345 MHz, 44 °C) after the busy one: the GPU waits for data, it does not throttle."""
    found = explain(Conditions(QUIET, gpus=(_h100(3),)), Conditions(HOGGED, gpus=(_h100(0),)))
    assert found.suspect == "contention"


def test_swapping_is_memory_and_a_growing_run_is_inside() -> None:
    now = pressure(swap_in_per_s=120.0, tree_rss_bytes=int(5.1 * GIB), psi={"cpu": 8.0, "memory": 35.0, "io": 30.0})
    found = explain(Conditions(QUIET), Conditions(now))
    assert found.suspect == "memory" and found.inside
    assert found.evidence[:3] == (
        "swap-in 120 pages/s (baseline 0)",
        "memory pressure (PSI some avg10) 35 % (baseline 0 %)",
        "the run's RSS 5.1 GiB, +2.3 GiB since the baseline",
    )
    assert "io pressure (PSI some avg10) 30 % (baseline 1 %)" in found.evidence  # swapping shows as I/O too


def test_memory_taken_by_others_is_not_inside() -> None:
    found = explain(Conditions(QUIET), Conditions(pressure(swap_in_per_s=500.0)))
    assert found.suspect == "memory" and not found.inside


def test_busy_processes_outside_the_run_are_contention_named_by_pid() -> None:
    now = pressure(
        outside=(OutsideProcess(4121, "python", 97.0), OutsideProcess(4130, "ffmpeg", 61.0), OutsideProcess(812, "sshd", 2.0)),
        outside_cpu_pct=160.0,
        tree_cpu_pct=40.0,
        psi={"cpu": 64.0, "memory": 0.0, "io": 1.0},
        tree_wait_pct=80.0,
    )
    found = explain(Conditions(pressure(tree_wait_pct=10.0), loader_wait=0.05), Conditions(now, loader_wait=0.9))
    assert found.suspect == "contention" and not found.inside  # the loader starves because the CPU is taken
    assert found.evidence[:6] == (
        "pid 4121 (python) outside the run: 97 % CPU (baseline 0 %)",
        "pid 4130 (ffmpeg) outside the run: 61 % CPU (baseline 0 %)",
        "the run waited for a CPU 80 % of the time (baseline 10 %)",
        "outside the run: 160 % CPU in all (baseline 12 %)",
        "the run's own CPU: 40 % (baseline 180 %)",
        "cpu pressure (PSI some avg10) 64 % (baseline 8 %)",
    )
    assert "main thread in the DataLoader in 90 % of stack samples (baseline 5 %)" in found.evidence


def test_pressure_that_was_already_there_is_not_a_cause() -> None:
    """A shared machine at 70 % CPU pressure and 150 % outside CPU all along: nothing changed."""
    loaded = pressure(outside_cpu_pct=150.0, psi={"cpu": 70.0, "memory": 0.0, "io": 1.0})
    found = explain(Conditions(loaded), Conditions(dataclasses.replace(loaded, outside_cpu_pct=170.0)))
    assert found.suspect == "unknown"
    assert found.evidence[0] == "outside the run: 170 % CPU (baseline 150 %)"


def test_a_run_thrashing_at_its_memory_limit_is_memory_and_its_leak_is_inside() -> None:
    """Measured on this machine: a run at its cgroup's limit with no swap re-reads its mapped data at every step."""
    baseline = pressure(memory_limit=MemoryLimit("/sys/fs/cgroup/memory/run", 300 * MIB, 768 * MIB, 0),
                        limit_hits_per_s=0.0, tree_anon_bytes=40 * MIB)  # fmt: skip
    now = pressure(memory_limit=MemoryLimit("/sys/fs/cgroup/memory/run", 767 * MIB, 768 * MIB, 90000),
                   limit_hits_per_s=5400.0, tree_anon_bytes=700 * MIB, tree_read_bytes_per_s=480.0 * MIB,
                   iowait_pct=30.0)  # fmt: skip
    found = explain(Conditions(baseline), Conditions(now))
    assert found.suspect == "memory" and found.inside
    assert found.evidence[0] == "the run's memory cgroup at 767 of 768 MiB, its limit hit 5400 times/s (baseline 300 MiB)"
    assert "the run's anonymous memory 0.7 GiB, +0.6 GiB since the baseline" in found.evidence


def test_a_full_cgroup_that_was_full_at_pace_is_no_change() -> None:
    full = pressure(memory_limit=MemoryLimit("/g", 767 * MIB, 768 * MIB, 10), limit_hits_per_s=20.0)
    assert explain(Conditions(full), Conditions(full)).suspect == "unknown"


def test_the_run_s_pages_read_back_are_memory() -> None:
    found = explain(Conditions(pressure(tree_major_faults_per_s=0.0)), Conditions(pressure(tree_major_faults_per_s=900.0)))
    assert found.suspect == "memory" and not found.inside
    assert found.evidence[0] == "the run's major page faults 900/s (baseline 0): its pages are read back from disk"


def test_busy_neighbours_do_not_slow_a_run_that_does_not_wait_for_a_cpu() -> None:
    """A sleeping (or GPU-bound) run on a shared machine: others' jobs come and go, its run-queue wait stays."""
    found = explain(Conditions(pressure(tree_wait_pct=2.0)), Conditions(dataclasses.replace(HOGGED, tree_wait_pct=3.0)))
    assert found.suspect == "unknown"


def test_a_cpu_bound_run_that_waits_for_its_cpu_names_the_new_hogs() -> None:
    found = explain(Conditions(pressure(tree_wait_pct=5.0)), Conditions(dataclasses.replace(HOGGED, tree_wait_pct=65.0)))
    assert found.suspect == "contention" and not found.inside
    assert found.evidence[:2] == (
        "pid 4121 (python) outside the run: 140 % CPU (baseline 0 %)",
        "the run waited for a CPU 65 % of the time (baseline 5 %)",
    )


def test_another_run_s_thrashing_does_not_make_a_cpu_starved_run_memory_bound() -> None:
    """Seen in the real-process tests: the machine's memory PSI rose with a neighbour's thrashing, while this run's
    own run-queue wait went from 39 to 92 %: evidence about the run itself outranks the machine's figures."""
    before = pressure(tree_wait_pct=39.0, psi={"cpu": 8.0, "memory": 0.0, "io": 1.0})
    now = dataclasses.replace(HOGGED, tree_wait_pct=92.0, psi={"cpu": 8.0, "memory": 22.0, "io": 1.0})
    found = explain(Conditions(before), Conditions(now))
    assert found.suspect == "contention"
    assert found.evidence[-1] == "memory pressure (PSI some avg10) 22 % (baseline 0 %)"  # said, after the suspect's
    loader = explain(
        Conditions(before, loader_wait=0.0), Conditions(dataclasses.replace(now, tree_wait_pct=40.0), loader_wait=1.0)
    )
    assert loader.suspect == "loader" and loader.evidence[0].startswith("main thread in the DataLoader")
    alone = explain(Conditions(before), Conditions(dataclasses.replace(before, psi=now.psi)))
    assert alone.suspect == "memory" and not alone.inside  # the machine's figures, when nothing about the run fires


def test_the_machine_s_memory_pressure_is_not_a_run_s_whose_own_pages_stay() -> None:
    """Seen in the real-process tests: a neighbour thrashing at its cgroup's limit took the machine's memory PSI from
    0 to 23 %, while the run slowed 3x for another reason entirely and its own major faults stayed at 0."""
    before = pressure(tree_major_faults_per_s=0.0)
    now = pressure(tree_major_faults_per_s=0.0, swap_in_per_s=300.0, psi={"cpu": 8.0, "memory": 23.0, "io": 1.0})
    found = explain(Conditions(before), Conditions(now))
    assert found.suspect == "unknown" and not found.inside
    assert found.evidence[-2:] == (
        "swap-in 300 pages/s (baseline 0)",
        "memory pressure (PSI some avg10) 23 % (baseline 0 %), not this run's: its major page faults 0/s (baseline 0)",
    )
    faulting = explain(Conditions(before), Conditions(dataclasses.replace(now, tree_major_faults_per_s=400.0)))
    assert faulting.suspect == "memory" and faulting.evidence[0].startswith("the run's major page faults 400/s")


def test_a_slow_disk_is_io() -> None:
    now = pressure(iowait_pct=25.0, tree_read_bytes_per_s=2.0 * 2**20)
    found = explain(Conditions(QUIET), Conditions(now))
    assert found.suspect == "io" and not found.inside
    assert found.evidence == ("iowait 25 % of CPU time (baseline 1 %)", "the run reads 2.0 MiB/s from disk (baseline 45.0)")


def test_a_loader_that_keeps_the_main_thread_waiting_is_loader() -> None:
    found = explain(Conditions(QUIET, loader_wait=0.05), Conditions(QUIET, loader_wait=0.8))
    assert found == ("loader", ("main thread in the DataLoader in 80 % of stack samples (baseline 5 %)",), True)


def test_a_worker_gone_is_loader() -> None:
    found = explain(Conditions(QUIET, workers=frozenset({11, 12, 13, 14})), Conditions(QUIET, workers=frozenset({11, 12, 14})))
    assert found.suspect == "loader"
    assert found.evidence == ("DataLoader workers: 3 now, 4 in the baseline (gone: 13)",)


def test_nothing_read_is_unknown_and_says_so() -> None:
    assert explain(Conditions(), Conditions()) == ("unknown", ("no machine readings to compare (pressure not sampled)",), False)


def test_loader_wait_share_from_real_stack_dumps() -> None:
    in_loader = (FIXTURES / "causes/loader_deadlock_supervised/stacks/32099.txt").read_text()
    elsewhere = (FIXTURES / "causes/gpu_wait_cuda_sync/stacks/10432.txt").read_text()
    assert loader_wait_share([in_loader, in_loader, elsewhere, ""], 32099) == pytest.approx(2 / 3)
    assert loader_wait_share(["", "garbage"], 1) is None


def test_loader_workers_are_the_tree_s_pt_data_workers() -> None:
    processes = {1: Process("python", 1, 0), 2: Process("pt_data_worker", 2, 0), 3: Process("pt_data_worker", 3, 0)}
    snapshot = Snapshot(0.0, frozenset({1, 2, 9}), 0, processes, {}, None, None, None)
    assert loader_workers(snapshot) == frozenset({2})  # 3 is not the run's; 9 has ended


_MAYBE = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
_PRESSURES = st.builds(
    Pressure,
    interval_s=st.floats(0.01, 1e6),
    outside=st.lists(
        st.builds(OutsideProcess, st.integers(1, 2**22), st.text(max_size=15), st.floats(0, 1e4), st.integers(0, 9)), max_size=5
    ).map(tuple),
    outside_cpu_pct=st.floats(0, 1e4),
    tree_cpu_pct=st.floats(0, 1e4),
    psi=st.dictionaries(st.sampled_from(["cpu", "memory", "io"]), _MAYBE),
    swap_in_per_s=_MAYBE,
    iowait_pct=_MAYBE,
    tree_rss_bytes=st.one_of(st.none(), st.integers(0, 2**50)),
    tree_read_bytes_per_s=_MAYBE,
    tree_major_faults_per_s=_MAYBE,
    tree_anon_bytes=st.one_of(st.none(), st.integers(0, 2**50)),
    memory_limit=st.one_of(
        st.none(),
        st.builds(
            MemoryLimit,
            st.text(max_size=5),
            st.integers(0, 2**40),
            st.one_of(st.none(), st.integers(0, 2**40)),
            st.one_of(st.none(), st.integers(0, 2**40)),
        ),
    ),
    limit_hits_per_s=_MAYBE,
    tree_wait_pct=_MAYBE,
)
_REASONS = st.lists(st.sampled_from(["HW_SLOWDOWN", "SW_POWER_CAP", "0x1000"])).map(tuple)
_GPUS = st.lists(st.builds(GpuClocks, st.integers(0, 7), _MAYBE, _MAYBE, _MAYBE, _MAYBE, _MAYBE, _REASONS), max_size=3).map(tuple)
_CONDITIONS = st.builds(
    Conditions,
    pressure=st.one_of(st.none(), _PRESSURES),
    gpus=_GPUS,
    workers=st.one_of(st.none(), st.frozensets(st.integers(1, 100), max_size=6)),
    loader_wait=st.one_of(st.none(), st.floats(0, 1)),
)


@given(_CONDITIONS, _CONDITIONS)
def test_any_readings_give_one_suspect_with_evidence(before: Conditions, now: Conditions) -> None:
    found = explain(before, now)
    assert found.suspect in SUSPECTS and found.evidence and all(isinstance(line, str) for line in found.evidence)


def test_on_a_machine_already_busy_the_three_biggest_rises_are_named() -> None:
    """Three hogs started beside work that was already running get under half a core each (none rose by a quarter
    of a core): still, the processes whose CPU rose most are named, the biggest first, and not the ones that fell or
    barely moved."""
    busy = (OutsideProcess(700, "make", 60.0), OutsideProcess(701, "cc1", 48.0), OutsideProcess(812, "sshd", 2.0))
    before = pressure(outside=busy, outside_cpu_pct=110.0, tree_wait_pct=11.0)
    hogs = (OutsideProcess(5001, "python", 24.0), OutsideProcess(5002, "python", 25.0), OutsideProcess(5003, "python", 23.0))
    now_outside = (OutsideProcess(700, "make", 30.0), OutsideProcess(701, "cc1", 25.0), OutsideProcess(812, "sshd", 3.0))
    now = pressure(outside=hogs + now_outside, outside_cpu_pct=130.0, tree_wait_pct=30.0)
    found = explain(Conditions(before), Conditions(now))
    assert found.suspect == "contention"
    assert found.evidence[:4] == (
        "pid 5002 (python) outside the run: 25 % CPU (baseline 0 %)",
        "pid 5001 (python) outside the run: 24 % CPU (baseline 0 %)",
        "pid 5003 (python) outside the run: 23 % CPU (baseline 0 %)",
        "the run waited for a CPU 30 % of the time (baseline 11 %)",
    )
