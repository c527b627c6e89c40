"""Which mount a path lives on (``/proc/self/mountinfo``), and whether it outlives the container.

A container's root is an ``overlay`` mount that ``docker compose`` discards
whenever it recreates the container; tmpfs/ramfs vanish at every stop. Named
volumes and bind mounts are separate mount points on a disk filesystem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import List, Optional

MOUNTINFO = Path("/proc/self/mountinfo")
VOLATILE_FSTYPES = frozenset({"tmpfs", "ramfs"})
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str
    root: str

    @property
    def persistent(self) -> bool:
        """Survives the container: not tmpfs/ramfs, and not the container's own overlay root."""
        if self.fstype in VOLATILE_FSTYPES:
            return False
        return not (self.mount_point == "/" and self.fstype == "overlay")

    def describe(self) -> str:
        kind = "persistent" if self.persistent else "NOT persistent"
        return f"{kind} {self.fstype} mount at {self.mount_point} (source {self.source}, root {self.root})"


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> List[Mount]:
    """Mounts in file order (a later mount on the same point hides an earlier one)."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 2:
            continue
        mounts.append(Mount(_unescape(fields[4]), after[0], _unescape(after[1]), _unescape(fields[3])))
    return mounts


def mount_of(path: str, mounts: List[Mount]) -> Optional[Mount]:
    """The mount ``path`` (absolute, need not exist yet) is on: the longest mount point containing it, last one wins."""
    target = PurePosixPath(path)
    best: Optional[Mount] = None
    for mount in mounts:
        point = PurePosixPath(mount.mount_point)
        if (target == point or point in target.parents) and (
            best is None or len(point.parts) >= len(PurePosixPath(best.mount_point).parts)
        ):
            best = mount
    return best
