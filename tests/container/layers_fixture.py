"""Layer tarballs and image configs made up in memory, as the engine writes them, for the millisecond tests."""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

#: 2026-01-02 03:04:05 UTC: the commit time of the made-up builds.
EPOCH = 1767323045


@dataclass
class Item:
    """One entry of a made-up layer."""

    name: str
    data: Optional[bytes] = b""
    kind: bytes = tarfile.REGTYPE
    mode: int = 0o644
    mtime: int = EPOCH - 86400
    uid: int = 0
    link: str = ""
    xattrs: Dict[str, str] = field(default_factory=dict)


def layer(items: Sequence[Item], uname: str = "root") -> bytes:
    """A layer tar in pax format with the given entries, in the given order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for item in items:
            entry = tarfile.TarInfo(item.name)
            entry.type, entry.mode, entry.mtime, entry.uid, entry.gid = item.kind, item.mode, item.mtime, item.uid, item.uid
            entry.uname = entry.gname = uname
            entry.linkname = item.link
            entry.pax_headers = {f"SCHILY.xattr.{key}": value for key, value in item.xattrs.items()}
            data = item.data if item.kind == tarfile.REGTYPE else None
            entry.size = len(data) if data is not None else 0
            tar.addfile(entry, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def config(diff_ids: List[str], created: str = "2026-11-29T02:47:11.123456789Z", steps: int = 2) -> dict:
    """A classic-builder config: one base step, then ``steps`` steps of this build, with build-only keys."""
    history = [{"created": "2025-06-01T00:00:00Z", "created_by": "bootstrap"}]
    history += [{"created": created, "created_by": f"/bin/bash -euo pipefail -c step {index}"} for index in range(1, steps + 1)]
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "container": "0123456789ab",
        "docker_version": "20.10.24+dfsg1",
        "container_config": {"Hostname": "0123456789ab"},
        "config": {"Env": ["PATH=/usr/bin"], "Image": "sha256:intermediate", "Hostname": "", "Labels": {"a": "1"}},
        "history": history,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
