"""Fail-slow with real processes: supervised children slowed by real faults, real busy processes and a real memory limit.

Every run starts at once (one module fixture) and each test judges one of them: they are timing tests that mostly
sleep, so they share the machine well and the module costs the wall time of its longest run (about 4 minutes, in
one xdist worker) rather than the sum. Each run keeps its pace for :data:`PACE_S` first: the detector skips 30 s of
warm-up and learns the pace from a minute of beats, and the supervisor reads the conditions it will compare with.

* ``steady``: +-30 % jitter per step for 4 minutes, never called slow;
* ``three_x``: steps 3x as long from step :data:`CHANGE_STEP` (``slow@step``): flagged within 60 s, no stall, no
  restart;
* ``contention``: CPU-bound steps pinned to CPU 0, and then busy processes started outside the run on the same
  CPU: the ``slow`` event names their pids, and ``--on-slow restart`` leaves the run alone;
* ``loader``: a torch DataLoader whose ``__getitem__`` becomes 120x slower from step :data:`LOADER_CHANGE_STEP`
  (``slow@getitem``; its two workers then deliver a batch every 1.2 s to a loop that takes one every 0.1 s, so the
  main thread waits in the DataLoader 92 % of the time: 2 or fewer of the reading's 5 stack samples there, under the
  rule's bar of half, has a chance under 0.5 %; at 40x it waited 75 % of the time, and that chance was 10 %): named
  ``loader``;
* ``memory``: a child in a memory cgroup that leaks 640 MiB into its limit (``leak@step``) and then re-reads its
  memory-mapped dataset at every step: named ``memory``, asked for a checkpoint and restarted by ``--on-slow
  restart``, and its next attempt (which does not leak) resumes from that checkpoint and recovers the pace;
* ``output``: a plain tqdm loop that never beats (tests/fixtures/output/programs/tqdm_loop.py), its pace read from
  its bar, whose draws become 3x as far apart from bar step :data:`CHANGE_STEP` (``slow@output``, through
  tests/fixtures/uninstrumented/sitecustomize.py): flagged within 60 s from the output counters alone;
* ``two_bars``: Hugging Face Trainer's two bars, neither with a label (tests/fixtures/output/programs/nested_bars.py):
  the training bar at 10 steps/s, and from step :data:`EVAL_STEP` an evaluation bar of another total at a third of
  that, for 90 s: a phase of its own, never called slow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from tests.supervised import REPO, cli_env, faulty_child, memory_cgroup, read_events, spawn
from trainbox.rundir.layout import RunDir
from trainbox.rundir.progress import read_samples

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pace-runs")]

#: Seconds at pace before a slowdown: warm-up (30 s), a baseline (12 blocks of 5 s), the first reading of the
#: conditions (5 s), and a margin for a loaded machine's slower start.
PACE_S = 110.0
#: The step a 10 steps/s child reaches after PACE_S (0.1 s steps take about 0.107 s with their beat and print).
CHANGE_STEP = 1000
#: The loader run slows later: its explanation needs the loader share of the first reading at pace (the only one
#: with stack samples in its first 5 minutes), and that reading must have ended a block before the slowdown began.
#: At CHANGE_STEP the margin was a few seconds, less than a loaded machine's slower warm-up takes away.
LOADER_CHANGE_STEP = CHANGE_STEP + 300
#: Busy processes pinned with the contention run on CPU 0, each in a session of its own (another terminal's program)
#: at nice -10: its process's nice, and its session's where the kernel groups processes by session
#: (``/proc/<pid>/autogroup``, CONFIG_SCHED_AUTOGROUP: there a CPU is shared between sessions first, so the busy
#: processes of one session take no more than one other session would, whatever their own nice). Measured on this
#: machine at a load of 20: three in the test's own session slowed a pinned CPU-bound loop 1.4x, three in sessions
#: of their own at nice -10 3.7x.
HOGS, HOG_NICE = 3, -10
#: How long the busy processes run at most: the slowdown is flagged within a minute, and a restart would come 10 s
#: later. The run (and with it the busy processes) ends sooner, RESTART_WINDOW_S after its ``slow`` event.
HOG_S = 75.0
#: ``--slow-restart-after`` of the runs with ``--on-slow restart``, and how long after a ``slow`` event the contention
#: run goes on: long enough that a restart for contention, wrongly decided, would have come.
SLOW_RESTART_AFTER_S = 10
RESTART_WINDOW_S = SLOW_RESTART_AFTER_S + 5.0
#: The memory run's cgroup: its 256 MiB dataset and 640 MiB of leak do not fit, the dataset alone does.
MEMORY_LIMIT = 768 * 2**20
#: No run takes longer than this.
LIMIT_S = 420.0
#: The open-ended runs' steps: more than they take within LIMIT_S (steps of 0.1 s at most), and few enough that a run
#: whose test was killed (its runs are sessions of their own, out of reach of the worker's end) ends within the limit.
OPEN_ENDED_STEPS = str(int(LIMIT_S / 0.1))
#: The step at which the two-bar run evaluates, at pace by then (as CHANGE_STEP), and its evaluation bar's steps.
EVAL_STEP, EVAL_STEPS = 1100, 300
#: The programs of the uninstrumented tests, and the folder that arms the ``output`` fault site in them.
PROGRAMS = REPO / "tests" / "fixtures" / "output" / "programs"
ARMS_OUTPUT = REPO / "tests" / "fixtures" / "uninstrumented"
OPTIONS = ["--stall-timeout", "60", "--startup-timeout", "120"]


@dataclass
class Scenario:
    name: str
    child: List[str]
    fault: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    options: List[str] = field(default_factory=list)
    #: Stop the run (SIGTERM) once this holds for its run directory; None: it runs to its end.
    enough: Optional[Callable[[Path], bool]] = None
    run_dir: Path = Path()
    process: Optional[subprocess.Popen] = None
    code: Optional[int] = None
    hogs: List[int] = field(default_factory=list)

    @property
    def events(self) -> List[Dict[str, Any]]:
        return read_events(self.run_dir)

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def _recovered(run_dir: Path) -> bool:
    return any(e["event"] == "recovered" for e in read_events(run_dir))


def _restart_window_passed(run_dir: Path) -> bool:
    """The run was flagged slow and a restart for it would have come by now."""
    return any(e["event"] == "slow" and time.time() - e["ts"] >= RESTART_WINDOW_S for e in read_events(run_dir))


def scenarios(cgroup: Path) -> Dict[str, Scenario]:
    steps = ["--interval", "0.1", "--jitter", "0.3"]
    # In the memory cgroup, resumable from a file in its run directory (which only the child's TRAIN_RUN_DIR names).
    in_cgroup = ["sh", "-c", f'echo $$ > {cgroup} && exec "$@" --checkpoint "$TRAIN_RUN_DIR/fault-step"', "sh"]
    return {
        s.name: s
        for s in (
            Scenario("steady", faulty_child("--steps", "950", "--interval", "0.25", "--jitter", "0.3", "--seed", "1")),
            Scenario("three_x", faulty_child("--steps", "1300", *steps), f"slow@step,step>={CHANGE_STEP}"),
            Scenario(
                "contention",
                ["taskset", "-c", "0", *faulty_child("--steps", OPEN_ENDED_STEPS, "--interval", "0.05", "--work", "0.05")],
                options=["--on-slow", "restart", "--slow-restart-after", str(SLOW_RESTART_AFTER_S)],
                enough=_restart_window_passed,
            ),
            Scenario(
                "loader",
                faulty_child(
                    "--steps", str(LOADER_CHANGE_STEP + 100), "--interval", "0.1", "--loader-workers", "2", "--item-s", "0.005"
                ),
                f"slow@getitem,index>={4 * LOADER_CHANGE_STEP}",  # four items a step
                env={"TRAIN_FAULT_FACTOR": "120"},
            ),
            Scenario(
                "memory",
                [*in_cgroup, *faulty_child("--steps", OPEN_ENDED_STEPS, *steps, "--dataset-mb", "256")],
                f"leak@step,attempt=0,step>={CHANGE_STEP},step<{CHANGE_STEP + 20}",
                options=["--on-slow", "restart", "--slow-restart-after", str(SLOW_RESTART_AFTER_S)],
                enough=_recovered,
            ),
            Scenario(
                "output",
                [sys.executable, str(PROGRAMS / "tqdm_loop.py"), "--epochs", "1", "--steps", "1300", "--delay", "0.1"],
                f"slow@output,lines>={CHANGE_STEP}",  # a draw of the bar starts with \r: bar step N is line end N
                env={"PYTHONPATH": os.pathsep.join(filter(None, [str(ARMS_OUTPUT), os.environ.get("PYTHONPATH")]))},
            ),
            Scenario(
                "two_bars",
                [
                    *[sys.executable, str(PROGRAMS / "nested_bars.py"), "--steps", str(EVAL_STEP + 200), "--delay", "0.1"],
                    *["--every", str(EVAL_STEP), "--inner-steps", str(EVAL_STEPS), "--inner-delay", "0.3"],
                ],
            ),
        )
    }


def _start(scenario: Scenario, base: Path) -> None:
    scenario.run_dir = base / scenario.name
    env = dict(scenario.env, **({"TRAIN_FAULT": scenario.fault} if scenario.fault else {}))
    argv = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(scenario.run_dir), *OPTIONS, *scenario.options]
    log = open(base / f"{scenario.name}.log", "wb")  # noqa: SIM115  (kept open for the run)
    # A session of its own, as from a terminal of its own: where the kernel shares a CPU between sessions first
    # (CONFIG_SCHED_AUTOGROUP, see HOGS), the run is not one process among the test workers' many in pytest's session,
    # whose load (Ultralytics training, image builds) then comes and goes in bursts that no baseline can learn.
    scenario.process = spawn([*argv, "--", *scenario.child], new_session=True, env=cli_env(env), cwd=REPO, stdout=log, stderr=log)


@contextlib.contextmanager
def hogs_on_cpu0(count: int) -> Iterator[List[int]]:
    """``count`` busy Python processes outside any run, pinned to CPU 0, each its own session at nice HOG_NICE."""
    # Busy for HOG_S and a margin, then gone: a killed test cannot leave them burning CPU 0 for the rest of the suite.
    busy_loop = f"import time\nend = time.monotonic() + {HOG_S + 30}\nwhile time.monotonic() < end: pass"
    spin = ["nice", "-n", str(HOG_NICE), "taskset", "-c", "0", sys.executable, "-c", busy_loop]
    busy = [subprocess.Popen(spin, start_new_session=True) for _ in range(count)]
    try:
        time.sleep(0.2)  # nice and taskset have exec'd python
        for process in busy:
            with contextlib.suppress(OSError):  # no autogroups in this kernel: the process nice is what counts
                Path(f"/proc/{process.pid}/autogroup").write_text(str(HOG_NICE))
        yield [process.pid for process in busy]
    finally:
        for process in busy:
            process.kill()
            process.wait()


def _run_all(runs: Dict[str, Scenario], base: Path) -> None:
    started = time.monotonic()
    for scenario in runs.values():
        _start(scenario, base)
    contention = runs["contention"]
    # The busy processes end with the contention run: left to the end of the longest run they burnt CPU 0 for two
    # more minutes, beside the other runs' timings and the rest of the suite.
    with contextlib.ExitStack() as hogs:
        while any(s.code is None for s in runs.values()) and time.monotonic() - started < LIMIT_S:
            elapsed = time.monotonic() - started
            if not contention.hogs and elapsed >= PACE_S:
                contention.hogs = hogs.enter_context(hogs_on_cpu0(HOGS))
            if contention.hogs and elapsed >= PACE_S + HOG_S and contention.code is None and contention.process:
                contention.process.send_signal(signal.SIGTERM)
            if contention.code is not None:
                hogs.close()
            for scenario in runs.values():
                assert scenario.process is not None
                scenario.code = scenario.process.poll()
                if scenario.code is None and scenario.enough is not None and scenario.enough(scenario.run_dir):
                    scenario.process.send_signal(signal.SIGTERM)
                    scenario.enough = None
            time.sleep(1.0)
    for scenario in runs.values():
        if scenario.code is None and scenario.process is not None:
            scenario.process.kill()
            scenario.code = scenario.process.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Scenario]]:
    base = tmp_path_factory.mktemp("pace")
    with memory_cgroup(MEMORY_LIMIT) as cgroup:
        found = scenarios(cgroup)
        _run_all(found, base)
        yield found


def change_ts(run_dir: Path, step: int, key: str = "step") -> float:
    """When the run reached ``step`` (its ``key``), from its progress samples (one every 5 s), interpolated."""
    samples = [(s["ts"], s[key]) for s in read_samples(RunDir(run_dir).progress).records if isinstance(s.get(key), int)]
    for (t0, s0), (t1, s1) in zip(samples, samples[1:]):
        if s0 < step <= s1:
            return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    raise AssertionError(f"no progress sample around step {step}")


def timeline(slow: Dict[str, Any], began: float) -> str:
    """Where a flag's latency went: the detector's (to the end of the block that confirmed it, in the child's beat
    time) and the explanation's (reading the conditions, then the event)."""
    return (
        f"flagged {slow['ts'] - began:.1f} s after the change: its since_ts {slow['since_ts'] - began:+.1f} s, "
        f"detected at {slow['detected_ts'] - began:.1f} s, explained {slow['ts'] - slow['detected_ts']:.1f} s later; {slow}"
    )


def describe(scenario: Scenario) -> str:
    log = scenario.run_dir.parent / f"{scenario.name}.log"
    return f"{scenario.name}: exit {scenario.code}, events {[e['event'] for e in scenario.events]}\n" + log.read_text()[-3000:]


def test_a_steady_run_with_jitter_is_never_called_slow(runs: Dict[str, Scenario]) -> None:
    steady = runs["steady"]
    assert steady.code == 0, describe(steady)
    assert steady.of("slow") == [], describe(steady)
    assert steady.of("exit")[0]["slow_s"] == 0.0


def test_a_run_three_times_slower_is_flagged_within_a_minute_without_a_stall_or_restart(runs: Dict[str, Scenario]) -> None:
    three_x = runs["three_x"]
    assert three_x.code == 0, describe(three_x)
    (slow,) = three_x.of("slow")
    began = change_ts(three_x.run_dir, CHANGE_STEP)
    latency = slow["ts"] - began
    assert latency <= 60.0, timeline(slow, began)
    assert 0.2 <= slow["ratio"] <= 0.5 and slow["phase"] == "train"
    assert not three_x.of("stall") and not three_x.of("restart")
    print(f"3x slowdown {timeline(slow, began)}")


def test_busy_processes_outside_the_run_are_named_and_not_restarted_for(runs: Dict[str, Scenario]) -> None:
    contention = runs["contention"]
    slows = contention.of("slow")
    assert slows, describe(contention)
    slow = slows[-1]
    assert slow["suspect"] == "contention" and not slow["inside"] and slow["action"] == "report", slow
    named = " ".join(slow["evidence"])
    assert all(f"pid {pid} (python" in named for pid in contention.hogs), (contention.hogs, slow["evidence"])
    assert not contention.of("restart"), "--on-slow restart never restarts for contention"


def test_a_data_loader_that_slows_is_named_loader(runs: Dict[str, Scenario]) -> None:
    loader = runs["loader"]
    assert loader.code == 0, describe(loader)
    (slow,) = loader.of("slow")
    assert slow["suspect"] == "loader" and slow["inside"], f"{slow['suspect']}: {slow['evidence']}\n{describe(loader)}"
    assert "main thread in the DataLoader" in slow["evidence"][0]


def test_a_leak_into_a_memory_limit_is_restarted_and_the_pace_comes_back(runs: Dict[str, Scenario]) -> None:
    memory = runs["memory"]
    slow = memory.of("slow")
    assert slow, describe(memory)
    assert slow[0]["suspect"] == "memory" and slow[0]["inside"] and slow[0]["action"] == "restart", slow[0]
    assert "memory cgroup at" in " ".join(slow[0]["evidence"])
    (restart,) = memory.of("restart")
    assert (
        restart["after"] == "slow"
        and restart["reason"] == "slow (memory): the same command again, from the checkpoint it wrote on request"
    )
    saved = int((memory.run_dir / "fault-step").read_text())  # the step attempt 1 started from
    assert saved >= CHANGE_STEP + 20  # written at the request, after the leak
    assert read_samples(RunDir(memory.run_dir).progress).records[-1]["step"] > saved, "attempt 1 went on from there"
    (recovered,) = memory.of("recovered")
    assert recovered["attempt"] == 1 and recovered["reason"] == "pace"
    assert os.path.exists(memory.run_dir / "fault-dataset-256.bin")


def test_an_uninstrumented_loop_three_times_slower_is_flagged_from_its_output_alone(runs: Dict[str, Scenario]) -> None:
    output = runs["output"]
    assert output.code == 0, describe(output)
    state = json.loads((output.run_dir / "state.json").read_text())
    assert state["progress_source"] == "output" and state["heartbeat"]["pattern"] == "tqdm", "it never beat"
    (slow,) = output.of("slow")
    began = change_ts(output.run_dir, CHANGE_STEP, key="batch")
    assert slow["ts"] - began <= 60.0, timeline(slow, began)
    assert 0.2 <= slow["ratio"] <= 0.5 and slow["phase"] == "train", slow
    assert not output.of("stall") and not output.of("restart")
    print(f"uninstrumented 3x slowdown {timeline(slow, began)}")


def test_an_evaluation_bar_without_a_label_is_never_pooled_with_the_training_pace(runs: Dict[str, Scenario]) -> None:
    two_bars = runs["two_bars"]
    assert two_bars.code == 0, describe(two_bars)
    assert two_bars.of("slow") == [], describe(two_bars)
    samples = read_samples(RunDir(two_bars.run_dir).progress).records
    evaluating = [s["ts"] for s in samples if s.get("step") == EVAL_STEP]  # a sample every 5 s while the bar moves
    assert evaluating and max(evaluating) - min(evaluating) >= 0.7 * EVAL_STEPS * 0.3, "a phase inside step 1100"
