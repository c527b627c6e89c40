"""The memory cgroup a process runs in: how much it holds, its limit, and how often it hit that limit.

A run whose memory grows into a limit does not always die: before the OOM
killer comes, the kernel reclaims the cgroup's page cache (the pages of a
memory-mapped dataset, the run's own code), and every step reads them back
from disk. A container's ``mem_limit`` (trainbox's compose file sets one), a
systemd unit's ``MemoryMax=`` or a hand-made cgroup all do this. The cgroup says
it plainly, where the machine-wide figures (PSI, swap-in) may not: on this
development machine a run thrashing at its limit showed a machine-wide memory
PSI of only 10 %, and no swap-in at all (it has no swap).

Both hierarchies are read (Linux ``Documentation/admin-guide/cgroup-v1/memory.rst``
and ``cgroup-v2.rst``):

* **v1** (the ``memory`` controller's own mount): ``memory.usage_in_bytes``,
  ``memory.limit_in_bytes`` (a number near 2^63 means no limit) and
  ``memory.failcnt``, how many times a charge hit the limit;
* **v2** (the ``cgroup2`` mount, where the memory controller lives on a v2 or
  unified host): ``memory.current``, the lower of ``memory.max`` and
  ``memory.high`` (``max`` means no limit), and the ``high`` + ``max`` counts of
  ``memory.events``.

Where the cgroup lives: ``/proc/<pid>/cgroup`` names its path (``4:memory:/a/b``
for v1, ``0::/a/b`` for v2) relative to the hierarchy's root, and
``/proc/self/mountinfo`` says where that root (or, in a container, the part of
it that is visible) is mounted. Everything here answers None where a file is
missing or unreadable and never raises.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

#: A v1 limit at or above this is "no limit" (the kernel's PAGE_COUNTER_MAX in bytes: 2^63 rounded to pages).
NO_LIMIT_BYTES = 2**62
#: The most read of one file here (mountinfo on a host with many containers: tens of KiB).
_READ_LIMIT = 256 * 1024


@dataclass(frozen=True)
class MemoryLimit:
    """One memory cgroup at one moment. ``limit_bytes`` None: no limit; ``hits``: times its limit was hit so far."""

    path: str
    usage_bytes: int
    limit_bytes: Optional[int]
    hits: Optional[int]


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(_READ_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None


def _whole(text: Optional[str]) -> Optional[int]:
    """A file's one whole number; None for "max", garbage or a missing file."""
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def mounts(mountinfo: str) -> Dict[str, Tuple[str, str]]:
    """``{"v1": (root, mount point), "v2": (...)}``: where the memory controller's hierarchies are mounted."""
    found: Dict[str, Tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup" and "memory" in options:
            found.setdefault("v1", (root, point))
        elif fstype == "cgroup2":
            found.setdefault("v2", (root, point))
    return found


def paths(cgroup: str) -> Dict[str, str]:
    """``{"v1": path, "v2": path}`` from ``/proc/<pid>/cgroup``: the memory controller's group, and the unified one."""
    found: Dict[str, str] = {}
    for line in cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            found["v1"] = path
        elif number == "0" and controllers == "":
            found["v2"] = path
    return found


def _folder(mount: Tuple[str, str], path: str) -> str:
    """Where cgroup ``path`` is on disk under a mount of its hierarchy's ``root``."""
    root, point = mount
    inside = path[len(root) :] if root != "/" and path.startswith(root) else path
    return os.path.join(point, inside.lstrip("/"))


def _v1(folder: str) -> Optional[MemoryLimit]:
    usage = _whole(_read(f"{folder}/memory.usage_in_bytes"))
    if usage is None:
        return None
    limit = _whole(_read(f"{folder}/memory.limit_in_bytes"))
    return MemoryLimit(folder, usage, limit if limit is not None and limit < NO_LIMIT_BYTES else None,
                       _whole(_read(f"{folder}/memory.failcnt")))  # fmt: skip


def _v2(folder: str) -> Optional[MemoryLimit]:
    usage = _whole(_read(f"{folder}/memory.current"))
    if usage is None:
        return None
    limits = [value for value in (_whole(_read(f"{folder}/memory.{name}")) for name in ("max", "high")) if value is not None]
    events: Dict[str, int] = {}
    for line in (_read(f"{folder}/memory.events") or "").splitlines():
        name, _, count = line.partition(" ")
        value = _whole(count)
        if value is not None:
            events[name] = value
    hits = events["high"] + events["max"] if {"high", "max"} <= events.keys() else None
    return MemoryLimit(folder, usage, min(limits) if limits else None, hits)


def read(pid: int, proc: str = "/proc") -> Optional[MemoryLimit]:
    """The memory cgroup of ``pid`` (v1's memory controller where it is mounted, else v2's); None where unreadable."""
    where = paths(_read(f"{proc}/{pid}/cgroup") or "")
    mounted = mounts(_read(f"{proc}/self/mountinfo") or "")
    if "v1" in where and "v1" in mounted:
        return _v1(_folder(mounted["v1"], where["v1"]))
    if "v2" in where and "v2" in mounted:
        return _v2(_folder(mounted["v2"], where["v2"]))
    return None
