"""The pressure readers against this machine's real /proc, with real processes; the parsers fuzzed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainbox.system import pressure
from trainbox.system.pressure import Process, Snapshot, compare, take

#: Seconds between the two snapshots of a test: long enough for a busy process to show on a loaded 2-core machine.
INTERVAL_S = 1.5
#: A process spinning on a core shows at least this % of one core (a loaded machine shares its two cores).
BUSY_PCT = 20.0


@pytest.fixture
def spinner() -> Iterator[subprocess.Popen]:
    """A real busy process: Python spinning on one core."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.2)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _measure(tree: List[int]) -> pressure.Pressure:
    before = take(tree)
    time.sleep(INTERVAL_S)
    return compare(before, take(tree))


def test_a_busy_process_outside_the_run_is_named(spinner: subprocess.Popen, sleeper: subprocess.Popen) -> None:
    found = _measure([sleeper.pid])
    named = {p.pid: p for p in found.outside}
    assert spinner.pid in named, found.outside
    assert named[spinner.pid].name.startswith("python")
    assert named[spinner.pid].cpu_pct >= BUSY_PCT
    assert found.outside_cpu_pct >= named[spinner.pid].cpu_pct
    assert found.tree_cpu_pct < BUSY_PCT  # the run (a sleep) did nothing
    assert len(found.outside) <= pressure.TOP_OUTSIDE
    assert [p.cpu_pct for p in found.outside] == sorted((p.cpu_pct for p in found.outside), reverse=True)


def test_the_run_s_own_cpu_and_memory_are_its_own(spinner: subprocess.Popen) -> None:
    found = _measure([spinner.pid])
    assert spinner.pid not in {p.pid for p in found.outside}
    assert found.tree_cpu_pct >= BUSY_PCT
    assert found.tree_rss_bytes is not None and found.tree_rss_bytes > 1024 * 1024  # an interpreter holds MiBs
    assert found.interval_s >= INTERVAL_S


def test_the_observer_is_not_outside_the_run() -> None:
    """The process that takes the snapshots (the supervisor) spins here: it is not named as contention."""
    before = take([])
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        pass
    assert os.getpid() not in {p.pid for p in compare(before, take([])).outside}


def test_the_tree_s_disk_reads_are_counted(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    """A tree process reads a file dropped from the page cache: its reads reach the disk and are counted."""
    data = tmp_path / "data.bin"
    size = 8 * 1024 * 1024
    _dropped_from_cache(data, size)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        found = _across_its_work(reader, [reader.pid, sleeper.pid])
    finally:
        reader.kill()
        reader.wait()
    assert found.tree_read_bytes_per_s is not None
    assert found.tree_read_bytes_per_s * found.interval_s >= size / 2


def _dropped_from_cache(path: Path, size: int) -> None:
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _across_its_work(worker: subprocess.Popen, tree: List[int]) -> pressure.Pressure:
    """Snapshots before and after ``worker`` does its work (it says "ready", is told "go", says "done").

    The second snapshot waits for "done", not for a fixed interval: reads from a slow disk under load took longer than
    1.5 s on a CI machine (729 of 2048 faults in), and a count taken mid-work proves nothing either way.
    """
    assert worker.stdout is not None and worker.stdin is not None and worker.stdout.readline() == "ready\n"
    before = take(tree)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline() == "done\n"
    return compare(before, take(tree))


#: What the reader below does: wait for "go", read a file that is not in the page cache, and stay alive.
READER = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
open(sys.argv[1], "rb").read()
print("done", flush=True)
time.sleep(30)
"""

#: What the mapper below does: map a file that is not in the page cache and touch each page, without readahead
#: (as a randomly read dataset is): every touch reads the disk, a major fault; and hold 64 MiB of its own.
MAPPER = """
import mmap, sys, time
data = open(sys.argv[1], "rb")
pages = mmap.mmap(data.fileno(), 0, prot=mmap.PROT_READ)
pages.madvise(mmap.MADV_RANDOM)
held = bytearray(64 * 2**20)
for at in range(0, len(held), 4096):
    held[at] = 1
print("ready", flush=True)
sys.stdin.readline()
total = sum(pages[at] for at in range(0, len(pages), 4096))
print("done", flush=True)
time.sleep(30)
"""


def test_the_tree_s_major_faults_and_anonymous_memory_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "mapped.bin"
    _dropped_from_cache(data, 8 * 2**20)
    mapper = subprocess.Popen([sys.executable, "-c", MAPPER, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        found = _across_its_work(mapper, [mapper.pid])
    finally:
        mapper.kill()
        mapper.wait()
    assert found.tree_major_faults_per_s is not None
    assert found.tree_major_faults_per_s * found.interval_s >= 8 * 2**20 / 4096 / 2
    assert found.tree_anon_bytes is not None and found.tree_anon_bytes >= 64 * 2**20
    assert found.tree_rss_bytes is not None and found.tree_rss_bytes >= found.tree_anon_bytes


def test_the_run_s_wait_for_a_cpu_is_counted() -> None:
    """Two spinners on one CPU: each waits in the run queue about half the time, the run's among them."""
    pin = "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", pin]) for _ in range(2)]
    try:
        time.sleep(0.3)
        found = _measure([spinners[0].pid])
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert found.tree_wait_pct is not None and found.tree_wait_pct >= 25.0
    assert spinners[1].pid in {p.pid for p in found.outside}


def test_machine_wide_readings_are_in_range() -> None:
    found = _measure([])
    assert set(found.psi) == set(pressure.PSI_RESOURCES)
    for name, value in found.psi.items():
        assert value is None or 0.0 <= value <= 100.0, name
    if Path("/proc/pressure/cpu").exists():
        assert found.psi["cpu"] is not None
    assert found.swap_in_per_s is not None and found.swap_in_per_s >= 0.0
    assert found.iowait_pct is not None and 0.0 <= found.iowait_pct <= 100.0
    assert found.tree_rss_bytes is None and found.tree_read_bytes_per_s is None  # no tree given


def test_a_proc_without_files_gives_nothing_and_does_not_raise(tmp_path: Path) -> None:
    (tmp_path / "123").mkdir()  # a process whose files are gone
    snap = take([123, 456], proc=str(tmp_path))
    assert snap.processes == {} and snap.pswpin is None and snap.cpu is None and snap.tree_rss_bytes is None
    assert snap.psi == {name: None for name in pressure.PSI_RESOURCES}
    found = compare(snap, snap)
    assert found.outside == () and found.swap_in_per_s is None and found.iowait_pct is None


def _snapshot(ts: float, processes: dict) -> Snapshot:
    return Snapshot(ts, frozenset(), -1, processes, {}, None, None, None)


def test_a_recycled_pid_is_a_new_process() -> None:
    """Same pid, later start: its whole CPU time is new (not a negative delta against the old process)."""
    before = _snapshot(0.0, {7: Process("old", started=100, cpu_ticks=5000)})
    after = _snapshot(2.0, {7: Process("new", started=900, cpu_ticks=pressure.CLOCK_TICKS)})
    (process,) = compare(before, after).outside
    assert (process.pid, process.name, process.cpu_pct) == (7, "new", 50.0)


def test_parse_stat_takes_the_name_between_the_outer_parentheses() -> None:
    line = "4121 (my (odd) name) R 1 2 3 0 -1 0 0 0 7 0 150 50 0 0 20 0 1 0 987654 0 0"
    assert pressure.parse_stat(line) == ("my (odd) name", 987654, 200, 7)
    assert pressure.parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text()) is not None


def test_parsers_read_the_kernel_s_formats() -> None:
    assert pressure.parse_psi_some_avg10("some avg10=12.50 avg60=3.00 avg300=1.00 total=9\nfull avg10=1.00") == 12.5
    assert pressure.parse_key_value("pgpgin 5\npswpin 120\npswpout 3\n", "pswpin") == 120
    assert pressure.parse_key_value("Name:\tpython\nVmRSS:\t  2048 kB\n", "VmRSS") == 2048
    assert pressure.parse_key_value("rchar: 10\nread_bytes: 4096\n", "read_bytes") == 4096
    assert pressure.parse_cpu_line("cpu  10 0 5 80 5 0 0 0 7 0\ncpu0 1 2 3\n") == (100, 5)


@given(st.text())
def test_parsers_never_raise_on_any_text(text: str) -> None:
    parsed = pressure.parse_stat(text)
    assert parsed is None or isinstance(parsed[0], str)
    psi = pressure.parse_psi_some_avg10(text)
    assert psi is None or isinstance(psi, float)
    for key in ("pswpin", "VmRSS", "read_bytes"):
        value = pressure.parse_key_value(text, key)
        assert value is None or value >= 0
    cpu = pressure.parse_cpu_line(text)
    assert cpu is None or len(cpu) == 2


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20), st.integers(0, 2**40), st.integers(0, 2**40))
def test_parse_stat_reads_any_name(name: str, utime: int, started: int) -> None:
    line = f"99 ({name}) S 1 1 1 0 -1 0 0 0 0 0 {utime} 0 0 0 20 0 1 0 {started} 0 0"
    assert pressure.parse_stat(line) == (name, started, utime, 0)
