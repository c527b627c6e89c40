"""Running the real CLI as a subprocess and reading what it left behind (shared by tests)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import psutil
import pytest

from tests.paths import REPO
from trainbox.system import proctree
from trainbox.yolo.demo_data import Images

#: Events that measure what happened rather than say what happened next: left out of :meth:`Finished.kinds`.
MEASUREMENTS = ("redone",)


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def events(self) -> List[Dict[str, Any]]:
        path = self.run_dir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def kinds(self) -> List[str]:
        """The run's course: its events but the measurements taken on the way (``redone``: read with :meth:`of`)."""
        return [e["event"] for e in self.events if e["event"] not in MEASUREMENTS]

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def incident(self, stall: int = 0) -> Path:
        """The report of the ``stall``-th stall, as its event names it."""
        return Path(self.of("stall")[stall]["incident"])

    def stacks(self, stall: int = 0) -> str:
        directory = self.incident(stall) / "stacks"
        return "\n".join(p.read_text() for p in sorted(directory.glob("*.txt")))

    def cost_decisions(self, hanging_rung: str) -> List[Dict[str, Any]]:
        """The cost policy's decisions of a run whose hangs are armed on ``hanging_rung`` alone, checked: at least one
        stall, all on that rung, and every ``ladder`` retry weighed (stay or down, with a reason). A stall whose cause
        retries the same rung (busy_python: "once more") asks the policy nothing."""
        rung_of = {start["attempt"]: start["profile"] for start in self.of("start")}
        stalls = self.of("stall")
        assert stalls, "no hang was drawn: the seeded draws changed"
        assert {rung_of[stall["attempt"]] for stall in stalls} == {hanging_rung}, [s["attempt"] for s in stalls]
        decisions = [restart["ladder"] for restart in self.of("restart") if restart["retry"] == "ladder"]
        assert decisions, [restart["reason"] for restart in self.of("restart")]
        for decision in decisions:
            assert decision["policy"] == "cost" and decision["kind"] in ("stay", "down") and decision["reason"], decision
        return decisions


#: ``demo-data`` for the tests that train on it: the 32 + 8 images at 96 px the tests have always used (their stall
#: budgets were set on it), not the demo's own (trainbox.yolo.demo_data.DEMO_IMAGES, sized for a person to watch it
#: learn), so their epochs stay as short.
TEST_IMAGES = Images(train=32, val=8, imgsz=96)
SMALL_DEMO_DATA = ("--train", str(TEST_IMAGES.train), "--val", str(TEST_IMAGES.val), "--imgsz", str(TEST_IMAGES.imgsz))


def cli_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    full_env = dict(os.environ)
    full_env.pop("TRAIN_FAULT", None)
    full_env.update(env or {})
    return full_env


#: The processes tests started in the background (:func:`spawn`): each leads a process group that :func:`end_started`
#: ends when the test session ends, however it ends (a Ctrl-C included: tests/conftest.py), and the kernel kills each
#: one if the process that started it dies first.
STARTED: List[subprocess.Popen] = []
#: How long a started supervisor has after SIGTERM to stop its run (its --grace included) before its group is killed.
END_GRACE_S = 15.0


def spawn(argv: Sequence[str], new_session: bool = False, **popen: Any) -> subprocess.Popen:
    """Start ``argv`` in the background in a process group of its own (a session of its own with ``new_session``),
    ended with the test session (see :data:`STARTED`)."""
    tie = proctree.die_with_parent()

    def own_group() -> None:
        if not new_session:
            os.setpgid(0, 0)
        tie()

    process = subprocess.Popen(list(argv), start_new_session=new_session, preexec_fn=own_group, **popen)
    STARTED.append(process)
    return process


def end_started() -> List[int]:
    """End every process :func:`spawn` started that still runs, with its group: SIGTERM (a supervisor stops its run),
    then SIGKILL after :data:`END_GRACE_S`; the pids that were running."""
    running = [process for process in STARTED if process.poll() is None]
    for process in running:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + END_GRACE_S
    for process in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    STARTED.clear()
    return [process.pid for process in running]


def start_cli(args: Sequence[str], env: Optional[Dict[str, str]] = None, stderr: Any = None) -> subprocess.Popen:
    """Start ``python -m trainbox ARGS`` in the background (the test signals or waits for it; :func:`spawn`)."""
    return spawn([sys.executable, "-m", "trainbox", *args], env=cli_env(env), cwd=REPO, stderr=stderr)


def train_cli(
    args: Sequence[str],
    run_dir: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 600,
    cwd: Path = REPO,
) -> Finished:
    """Run ``python -m trainbox ARGS`` to completion, in ``cwd`` (the checkout unless told)."""
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        capture_output=True,
        text=True,
        env=cli_env(env),
        timeout=timeout,
        cwd=cwd,
    )
    return Finished(done.returncode, done.stdout, done.stderr, run_dir or Path("."))


def faulty_child(*args: str) -> List[str]:
    """The beating child from trainbox.faults, as a command line."""
    return [sys.executable, "-m", "trainbox.faults", *args]


def survivors(run_dir: Path) -> List[psutil.Process]:
    """Processes still alive that were started for this run (their environment names it)."""
    marker = str(run_dir)
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("TRAIN_RUN_DIR") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def program(*names: str, package: str) -> str:
    """The first of ``names`` on PATH (or in /usr/sbin, where sendmail lives); fails the test, never skips it, naming
    the Debian package to install (.ci/docker-setup.sh installs each one a test names; tests/container checks that)."""
    for name in names:
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if found:
            return found
    pytest.fail(f"this test needs {names[0]}: apt-get install -y {package}")


def wait_for(condition: Any, timeout: float = 30, what: str = "the condition") -> None:
    """Poll ``condition()`` until it is true; fail the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def read_events(run_dir: Path) -> List[Dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


#: Where cgroup v1's freezer is mounted on most hosts (the test mounts its own where it is not).
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")


@contextlib.contextmanager
def freezer_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A cgroup v1 freezer group (root only): a process in it that is FROZEN sits in D state and survives SIGKILL.

    That is the one real way to get a process that SIGKILL cannot end without a
    hung driver: the kernel's freezer holds it in ``__refrigerator`` (state D)
    until the group is thawed, exactly like a process stuck in amdgpu/kfd. On
    exit the group is thawed, its processes are killed and it is removed. Fails
    the test (never skips) where the freezer cannot be had.
    """
    root, mounted = FREEZER_ROOT, False
    if not (root / "cgroup.procs").exists():
        root = tmp_path / "freezer"
        root.mkdir()
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "freezer", "freezer", str(root)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"this test needs root and cgroup v1's freezer: mount failed: {done.stderr.strip()}")
        mounted = True
    group = root / f"trainbox-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.fail(f"this test needs root and cgroup v1's freezer: cannot create {group}: {exc}")
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        for pid in map(int, (group / "cgroup.procs").read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 10, "the thawed processes to die")
        group.rmdir()
        if mounted:
            subprocess.run(["umount", str(root)], check=True)


def freeze(group: Path, pid: int) -> None:
    """Move ``pid`` into the freezer ``group`` and freeze it (it enters D state)."""
    (group / "cgroup.procs").write_text(str(pid))
    (group / "freezer.state").write_text("FROZEN")
    wait_for(lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10, "the group to freeze")


@contextlib.contextmanager
def small_disk(where: Path, size: str = "1m") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (root only; fails the test, never skips, if it cannot mount)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"this test needs root to mount a small tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(disk: Path) -> Path:
    """Write a file into ``disk`` until it is full (ENOSPC); return the file (delete it to free the space)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


#: Where cgroup v1's memory controller is mounted on most v1 and hybrid hosts, and the unified (v2) hierarchy.
MEMORY_V1_ROOT, UNIFIED_ROOT = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")


def _memory_v2_root() -> Optional[Path]:
    """The v2 hierarchy where it holds the memory controller (a pure v2 host), else None."""
    controllers = UNIFIED_ROOT / "cgroup.controllers"
    return UNIFIED_ROOT if controllers.exists() and "memory" in controllers.read_text().split() else None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A memory cgroup (root only) with a hard limit and no swap: yields its ``cgroup.procs``.

    cgroup v1's memory controller where it is mounted (this development machine, hybrid), else v2's
    (``memory.max``, ``memory.swap.max`` 0). A process moved into it that grows past the limit has its page
    cache reclaimed and reads it back at every step, then is OOM-killed. On exit its processes are killed and the
    group removed. Fails the test (never skips) where no memory cgroup can be made.
    """
    name = f"trainbox-test-{os.getpid()}-{time.monotonic_ns()}"
    v2 = None if (MEMORY_V1_ROOT / "memory.limit_in_bytes").exists() else _memory_v2_root()
    group = (v2 or MEMORY_V1_ROOT) / name
    try:
        group.mkdir()
        if v2 is None:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (group / "memory.max").write_text(str(limit_bytes))
            (group / "memory.swap.max").write_text("0")
    except OSError as exc:
        pytest.fail(f"this test needs root and a memory cgroup (v1 at {MEMORY_V1_ROOT}, or v2 with memory): {exc}")
    try:
        yield group / "cgroup.procs"
    finally:
        for pid in map(int, (group / "cgroup.procs").read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), 10, "the cgroup's processes to die")
        group.rmdir()
