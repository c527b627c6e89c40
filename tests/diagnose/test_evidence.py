"""The sampler (train/diagnose/evidence.py) on real process trees: compilers, cache growth, sleep, spin."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest

from tests.sampling import Tree, tree, wait_for_children, wait_for_line, watch  # noqa: F401 - tree is a fixture
from trainbox.diagnose import evidence
from trainbox.diagnose.causes import Cause, classify
from trainbox.diagnose.window import IDLE_CPU_CORES, Window, interval
from trainbox.system import proctree

SLEEPING_TREE = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        time.sleep(600)
time.sleep(600)
"""


def test_sleeping_tree_is_idle_and_idleness_grows(tree: Tree) -> None:  # noqa: F811
    child = tree.python(SLEEPING_TREE)
    wait_for_children(child.pid, 3)
    root = psutil.Process(child.pid)  # the fast /proc/PID/task/*/children walk finds what psutil finds
    assert {p.pid for p in proctree.descendants(root)} == {p.pid for p in root.children(recursive=True)}
    sampler = evidence.Sampler(proctree.ProcessTree(child.pid), os.environ)
    window = Window()
    window.add(sampler.sample())
    assert window.idle_for_s() == 0.0  # one sample says nothing yet
    deadline = time.monotonic() + 30
    while window.idle_for_s() == 0.0:  # the interpreter's start-up CPU falls out of the intervals
        assert time.monotonic() < deadline, "a sleeping tree never became idle"
        time.sleep(0.5)
        window.add(sampler.sample())
    idle: List[float] = []
    for _ in range(3):
        time.sleep(0.5)
        window.add(sampler.sample())
        idle.append(window.idle_for_s())
    assert idle == sorted(idle) and idle[-1] >= idle[0] + 1.0, idle
    assert len(window.last.procs) == 4  # type: ignore[union-attr]
    assert all(p.state == "S" for p in window.last.procs)  # type: ignore[union-attr]
    assert window.compile_progress() == ()
    window.clear()
    assert window.idle_for_s() == 0.0 and window.samples == []


def test_to_json_holds_every_sample(tree: Tree) -> None:  # noqa: F811
    child = tree.python("import time; time.sleep(600)")
    window = watch(child.pid, 1)
    rows = window.to_json()
    assert len(rows) == len(window.samples) >= 2
    assert rows[0]["procs"][0]["pid"] == child.pid and "cpu_s" in rows[0]["procs"][0]


def big_c_file(path: Path, functions: int) -> Path:
    """A C file that keeps ``cc -O2`` busy for seconds (each function a loop the optimiser works on)."""
    body = [
        f"int f{i}(int x) {{ int s = 0; for (int i = 0; i < x; i++) s += i * {i} ^ (s >> 3); return s; }}"
        for i in range(functions)
    ]
    path.write_text("\n".join(body) + "\nint main(void) { return 0; }\n")
    return path


def test_real_compiler_is_recognised_and_its_cpu_counted(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    source = big_c_file(tmp_path / "big.c", 2500)
    compile_it = ["cc", "-O2", "-c", str(source), "-o", str(tmp_path / "big.o")]
    code = f"import subprocess, time; subprocess.run({compile_it!r}); time.sleep(600)"
    child = tree.python(code)
    sampler = evidence.Sampler(proctree.ProcessTree(child.pid), os.environ)
    window = Window()
    progress: List[str] = []
    deadline = time.monotonic() + 60
    while not progress and time.monotonic() < deadline:
        window.add(sampler.sample())
        progress = [line for line in window.compile_progress() if " running for " in line]
        time.sleep(0.5)
    assert progress, [p.name for p in window.last.procs]  # type: ignore[union-attr]
    # gcc's driver runs cc1 (clang compiles in its own process): the busy one is named.
    busy = next(p for p in window.last.procs if progress[0].startswith(f"{p.name} (pid {p.pid}) "))  # type: ignore[union-attr]
    assert busy.name in ("cc1", "clang") and busy.compiler and busy.cpu_s > 0, busy
    assert window.idle_for_s() == 0.0
    assert progress[0].endswith("% CPU")
    assert classify(window, {}, child.pid).cause is Cause.KERNEL_COMPILE  # from the samples alone, no stacks


#: An in-process compile (MIOpen through comgr, Inductor's own codegen): CPU work, then a kernel in the cache.
GROWING_CACHE = """
import os, time
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
for n in range(10_000):
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        pass
    os.makedirs(os.path.join(cache, f"k{n % 7}"), exist_ok=True)
    with open(os.path.join(cache, f"k{n % 7}", f"kernel{n}.so"), "wb") as handle:
        handle.write(b"x" * 4096)
"""


def test_growing_inductor_cache_is_compile_progress(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    child = tree.python(GROWING_CACHE, env=env)
    window = watch(child.pid, 3, env=env)
    progress = window.compile_progress()
    assert any(line.startswith("TORCHINDUCTOR_CACHE_DIR grew by ") for line in progress), progress
    assert window.idle_for_s() == 0.0
    cache = next(c for c in window.last.caches if c.var == "TORCHINDUCTOR_CACHE_DIR")  # type: ignore[union-attr]
    assert cache.path == env["TORCHINDUCTOR_CACHE_DIR"] and cache.files > 0 and cache.bytes == 4096 * cache.files


def test_a_cache_grown_by_others_leaves_a_sleeping_tree_idle(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    """The default caches are shared: another program compiling into one is not this tree's compile."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "shared"))
    child = tree.python("import time; print('ready', flush=True); time.sleep(600)")
    wait_for_line(child, "ready")
    stop = threading.Event()

    def other_compiler() -> None:
        for n in range(10_000):
            if stop.wait(0.2):
                return
            (tmp_path / "shared").mkdir(exist_ok=True)
            (tmp_path / "shared" / f"kernel{n}.so").write_bytes(b"x" * 4096)

    writer = threading.Thread(target=other_compiler, daemon=True)  # a thread: not part of the child's tree
    writer.start()
    try:
        window = watch(child.pid, 3, env=env)
    finally:
        stop.set()
        writer.join()
    shared = next(c for c in window.last.caches if c.var == "TORCHINDUCTOR_CACHE_DIR")  # type: ignore[union-attr]
    assert shared.files > 5
    assert window.compile_progress() == ()
    assert window.idle_for_s() > 1.0


def test_a_cache_grown_by_others_is_not_a_spinning_trees_compile(tree: Tree, tmp_path: Path) -> None:  # noqa: F811
    """Issue 33 item 10: a tree that uses CPU (a spin, a CUDA sync spinning on a hung GPU) while another program
    writes a shared cache is not compiling: the growth is not this tree's (its write counters did not grow as much,
    none of its processes has the cache open, it runs no compiler)."""
    env = dict(os.environ, MIOPEN_CUSTOM_CACHE_DIR=str(tmp_path / "shared"))
    # Started first: a child of this test started after the root would be taken for an orphan the tree adopted.
    other = tree.python(
        "import os, sys, time\nfor n in range(100000):\n"
        "    os.makedirs(sys.argv[1], exist_ok=True); open(os.path.join(sys.argv[1], f'k{n}'), 'wb').write(b'x' * 4096)\n"
        "    time.sleep(0.2)",
        str(tmp_path / "shared"),
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "shared" / "k0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # running: started clock ticks (10 ms) before the root, it is no orphan of the root's
    child = tree.python("print('ready', flush=True)\nwhile True: pass")
    wait_for_line(child, "ready")
    window = watch(child.pid, 3, env=env)
    shared = next(c for c in window.last.caches if c.var == "MIOPEN_CUSTOM_CACHE_DIR")  # type: ignore[union-attr]
    assert shared.files > 5 and other.poll() is None
    assert window.compile_progress() == (), "another program's kernels are not this tree's progress"
    assert sum(window.cpu_cores().values()) > IDLE_CPU_CORES, "the tree used more CPU than an idle one"
    assert classify(window, {}, child.pid).cause is not Cause.KERNEL_COMPILE


def test_a_cache_too_big_to_count_still_shows_growth(tmp_path: Path) -> None:
    for d in range(4):
        (tmp_path / f"old{d}").mkdir()
        for f in range(50):
            (tmp_path / f"old{d}" / f"{f}.bin").write_bytes(b"x")
    before = evidence.walk_cache("TRITON_CACHE_DIR", str(tmp_path), limit=60)
    time.sleep(0.05)  # a later mtime on filesystems with coarse timestamps
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "kernel.bin").write_bytes(b"y")
    after = evidence.walk_cache("TRITON_CACHE_DIR", str(tmp_path), limit=60)
    assert before is not None and after is not None and before.capped and after.capped
    assert after.newest > before.newest  # what interval() reads as growth when the count is capped
    assert evidence.walk_cache("x", str(tmp_path / "absent")) is None


def test_sample_cost_on_a_ten_process_tree(tree: Tree) -> None:  # noqa: F811
    child = tree.python(SLEEPING_TREE.replace("range(3)", "range(9)"))
    wait_for_children(child.pid, 9)
    sampler = evidence.Sampler(proctree.ProcessTree(child.pid), os.environ)
    costs = [sampler.sample().cost_s for _ in range(20)]
    assert len(sampler.sample().procs) == 10
    median = sorted(costs)[len(costs) // 2]
    print(f"sampler cost per sample, 10-process tree: median {1000 * median:.2f} ms CPU, max {1000 * max(costs):.2f} ms")
    assert median < 0.2  # generous: the figure is for bench/, this only catches a sampler gone pathological


def stand_in_tool(directory: Path, name: str, script: str) -> None:
    """A stand-in for a GPU tool this machine does not have (no GPU here): a shell script on PATH."""
    tool = directory / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)


def test_gpu_tools_are_asked_within_a_time_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(evidence, "GPU_TIMEOUT_S", 0.5)
    me, name = os.getpid(), Path("/proc/self/comm").read_text().strip()  # a process here, as the tool names it
    stand_in_tool(tmp_path, "nvidia-smi", f'case "$1" in --query-compute-apps*) echo "{me}, {name}, 2048";; *) echo 37;; esac\n')
    poller = evidence._GpuPoller()
    assert poller.poll(100.0) == {"source": "nvidia-smi", "memory_mib": {me: 2048}, "utilisation_pct": [37]}

    stand_in_tool(tmp_path, "nvidia-smi", "exec sleep 30\n")  # a driver that no longer answers
    started = time.monotonic()
    hung = evidence._GpuPoller()
    assert "no answer within 0.5 s" in hung.poll(100.0)["error"]  # type: ignore[index]
    assert hung.poll(200.0) == hung.poll(300.0) and hung.given_up  # not asked again
    assert time.monotonic() - started < 10


#: Process 7 with one thread on a CPU: the made-up samples below change what their tests need of it.
PROC = evidence.ProcSample(
    pid=7, ppid=1, started=1.0, name="python", cmdline="python train.py", cpu_s=0.0, demand_s=0.0, state="R",
    threads={"R": 1}, wchan="", blocked=(), io_chars=0, io_disk=0, compiler=False, io_written=0,
)  # fmt: skip


def _sample(ts: float, written: int, cache_bytes: int, opened: Tuple[int, ...] = ()) -> evidence.Sample:
    proc = dataclasses.replace(PROC, cpu_s=ts, demand_s=ts, io_chars=written, io_written=written)
    cache = evidence.CacheSample("MIOPEN_CUSTOM_CACHE_DIR", "/c", cache_bytes // 4096, cache_bytes, ts, False, opened)
    return evidence.Sample(ts=ts, procs=(proc,), caches=(cache,), gpu=None, cost_s=0.0)


@pytest.mark.parametrize(
    "written, opened, ours",
    [(0, (), False), (4096, (), False), (8192, (), True), (0, (7,), True)],
    ids=["wrote-nothing", "wrote-less", "wrote-as-much", "has-it-open"],
)
def test_a_caches_growth_is_the_trees_only_when_the_tree_wrote_it(written: int, opened: Tuple[int, ...], ours: bool) -> None:
    """Issue 33 item 10, the rule alone: 8 KiB more in the cache, a tree at a full core (a spin) that wrote ``written``
    characters or holds a file there open."""
    change = interval(_sample(0.0, 0, 0), _sample(1.0, written, 8192, opened))
    assert bool(change.cache_growth) is ours


def _spin(ts: float, demand_s: float, runnable: int) -> evidence.Sample:
    """Process 7 at ``ts``: ``demand_s`` of schedstat demand so far, ``runnable`` of its two threads in state R."""
    threads = {"R": runnable, "S": 2 - runnable}
    proc = dataclasses.replace(PROC, cpu_s=demand_s / 2, demand_s=demand_s, state="R" if runnable else "S", threads=threads)
    return evidence.Sample(ts=ts, procs=(proc,), caches=(), gpu=None, cost_s=0.0)


def window_of(*samples: evidence.Sample) -> Window:
    window = Window()
    for sample in samples:
        window.add(sample)
    return window


def test_a_process_runnable_at_every_sample_wants_a_core_though_its_open_wait_is_not_counted_yet() -> None:
    """ci29's spin behind three nice -10 hogs: schedstat grew 1.03 s, then 0.52 s (the wait it was in at the third
    sample not added yet), 0.75 cores over the window; it was in R at all three samples."""
    starved = window_of(_spin(0.0, 0.0, 1), _spin(1.03, 1.03, 1), _spin(2.06, 1.55, 1))
    assert starved.demand_cores() == {7: 1.0}
    assert starved.demand_cores(since_s=1.5) == {7: pytest.approx(0.52 / 1.03)}  # two samples: schedstat alone


@pytest.mark.parametrize(
    "runnable, demand_s, cores",
    [((1, 1, 0), 1.2, 0.6), ((0, 1, 1), 1.2, 0.6), ((2, 2, 2), 1.2, 2.0), ((2, 1, 2), 1.2, 1.0), ((1, 1, 1), 3.0, 1.5)],
    ids=["not-at-the-last", "not-at-the-first", "two-threads-always", "fewest-counts", "schedstat-above"],
)
def test_the_runnable_floor_counts_only_threads_runnable_at_every_sample(
    runnable: Tuple[int, int, int], demand_s: float, cores: float
) -> None:
    window = window_of(*(_spin(float(i), demand_s * i / 2, r) for i, r in enumerate(runnable)))
    assert window.demand_cores() == {7: pytest.approx(cores)}


def test_a_process_that_started_within_the_window_gets_no_floor() -> None:
    newcomer = dataclasses.replace(PROC, pid=8, started=1.5, cpu_s=0.05, demand_s=0.1)
    last = _spin(2.0, 0.6, 1)
    window = window_of(_spin(0.0, 0.0, 1), _spin(1.0, 0.3, 1), dataclasses.replace(last, procs=last.procs + (newcomer,)))
    assert window.demand_cores() == {7: 1.0, 8: pytest.approx(0.05)}  # 8: its 0.1 s over the window's 2 s
