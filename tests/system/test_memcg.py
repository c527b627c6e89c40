"""The memory cgroup reader: recorded v1, v2 and container layouts, and this machine's own cgroup, for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from trainbox.system import memcg

#: This development machine (hybrid: v1 controllers, the unified hierarchy beside them), two lines of a pure v2 host,
#: and a container that sees only its own part of a v2 hierarchy (root /docker/abc mounted at /sys/fs/cgroup).
HYBRID = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PURE_V2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
CONTAINER = "612 598 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"


def test_mounts_and_paths_are_read_from_both_hierarchies() -> None:
    assert memcg.mounts(HYBRID) == {"v1": ("/", "/sys/fs/cgroup/memory"), "v2": ("/", "/sys/fs/cgroup/unified")}
    assert memcg.mounts(PURE_V2) == {"v2": ("/", "/sys/fs/cgroup")}
    assert memcg.paths("9:name=systemd:/\n4:memory:/process_api/e2\n1:cpu:/\n0::/\n") == {"v1": "/process_api/e2", "v2": "/"}
    assert memcg.paths("0::/user.slice/run.scope\n") == {"v2": "/user.slice/run.scope"}


def test_a_v2_limit_is_the_lower_of_max_and_high_and_its_hits_are_counted(tmp_path: Path) -> None:
    """A container's view: the hierarchy's /docker/abc is mounted at its /sys/fs/cgroup, the process is in train/."""
    proc, point = tmp_path / "proc", tmp_path / "sys" / "fs" / "cgroup"
    (proc / "7").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text(CONTAINER.replace("/sys/fs/cgroup", str(point)))
    (proc / "7" / "cgroup").write_text("0::/docker/abc/train\n")
    group = point / "train"
    group.mkdir(parents=True)
    for name, text in (("memory.current", str(700 * 2**20)), ("memory.max", "max"), ("memory.high", str(768 * 2**20))):
        (group / name).write_text(text + "\n")
    (group / "memory.events").write_text("low 0\nhigh 40\nmax 2\noom 0\noom_kill 0\n")
    assert memcg.read(7, str(proc)) == memcg.MemoryLimit(str(group), 700 * 2**20, 768 * 2**20, 42)


def test_no_limit_and_missing_files_read_as_none(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "self").mkdir()
    point = tmp_path / "memory"
    (point / "g").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(f"35 31 0:32 / {point} rw - cgroup cgroup rw,memory\n")
    (proc / "7" / "cgroup").write_text("4:memory:/g\n")
    (point / "g" / "memory.usage_in_bytes").write_text("4096\n")
    (point / "g" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memcg.read(7, str(proc)) == memcg.MemoryLimit(str(point / "g"), 4096, None, None)
    assert memcg.read(8, str(proc)) is None  # a process that is gone
    (proc / "self" / "mountinfo").write_text("")
    assert memcg.read(7, str(proc)) is None  # no hierarchy mounted


def test_this_machine_s_own_cgroup_reads_as_what_the_kernel_says() -> None:
    """The test's own process: a usage that holds at least this interpreter, and a limit above it (or none)."""
    found = memcg.read(os.getpid())
    if found is None:  # a machine whose cgroups are not mounted: nothing to read, and that is all
        assert not memcg.mounts(Path("/proc/self/mountinfo").read_text())
        return
    assert found.usage_bytes > 2**20
    assert found.limit_bytes is None or found.limit_bytes >= found.usage_bytes
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(open('/proc/self/cgroup').read())"], capture_output=True, text=True
    )
    assert memcg.paths(child.stdout)  # a child shares the reader's view


@given(st.text())
def test_parsers_never_raise(text: str) -> None:
    assert isinstance(memcg.mounts(text), dict)
    assert isinstance(memcg.paths(text), dict)
