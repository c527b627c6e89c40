"""An image's layers and config, rewritten so that they depend only on what was built, not on when.

Pure functions over tar streams and JSON (no engine): :mod:`trainbox.container.reproducible`
feeds them ``docker save``'s output and loads what they write.

A layer is rewritten entry by entry, in the order the engine wrote it (a walk of
the layer's directory, sorted by name, so the same files come in the same order;
a hard link stays after the file it names). Each entry keeps its name, type,
mode, owner, size, link target and extended attributes (file capabilities live
there); its time is clamped to ``epoch`` (a file newer than the commit was made
by the build; an older one came from a package and keeps its time), and the
owner's names, access and change times (which record the build machine, not the
image) are dropped. The engine computes a layer's ``diff_id`` from these bytes,
so equal files give equal layers.

The config keeps everything the image runs with (environment, entry point,
labels, user, health check) and the steps' commands, and loses what only
records the build: the containers the steps ran in (``container``,
``container_config``, the intermediate image in ``config.Image``), the
engine's version and every time after the base image's, which become the
commit's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import tarfile
from typing import IO, Any, Dict, List, Sequence, Tuple

#: Extended attributes are kept (security.capability, for one); pax's times, names and sizes are redone.
KEPT_PAX_PREFIX = "SCHILY.xattr."
#: Config keys that record the build, not the image (the builder's container and version).
BUILD_ONLY_KEYS = ("container", "container_config", "docker_version")
#: ``config`` keys that name the build's own container or intermediate image.
BUILD_ONLY_CONFIG_KEYS = ("Hostname", "Image")
COPY_BUFFER = 1 << 20


class HashingWriter:
    """A write-only stream that passes bytes on and keeps their sha256 (a layer's ``diff_id``)."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.target.write(data)

    def digest(self) -> str:
        return "sha256:" + self.sha256.hexdigest()


def timestamp(epoch: int) -> str:
    """``epoch`` as the config writes times (RFC 3339, UTC)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def clamped(member: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    """A copy of ``member`` with its time clamped to ``epoch`` and only what belongs to the file kept."""
    entry = tarfile.TarInfo(member.name)
    entry.type, entry.mode, entry.size, entry.linkname = member.type, member.mode, member.size, member.linkname
    entry.uid, entry.gid, entry.uname, entry.gname = member.uid, member.gid, "", ""
    entry.devmajor, entry.devminor = member.devmajor, member.devminor
    entry.mtime = min(int(member.mtime), epoch)
    entry.pax_headers = {key: value for key, value in member.pax_headers.items() if key.startswith(KEPT_PAX_PREFIX)}
    return entry


def rewrite_layer(source: IO[bytes], target: IO[bytes], epoch: int) -> str:
    """Write ``source``'s layer to ``target`` with clamped entries (see the module's notes); return its diff_id."""
    writer = HashingWriter(target)
    with tarfile.open(fileobj=source, mode="r|") as layer, tarfile.open(
        fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8"
    ) as out:
        for member in layer:
            entry = clamped(member, epoch)
            out.addfile(entry, layer.extractfile(member) if member.isreg() else None)
    return writer.digest()


def rewrite_config(config: Dict[str, Any], base_history: int, diff_ids: Sequence[str], epoch: int) -> bytes:
    """The image config with build-only keys dropped, times after the base's set to ``epoch`` and ``diff_ids``.

    ``base_history``: how many history entries the base image brought (its own times are kept, as pinned).
    Returns the bytes the engine hashes into the image ID (sorted keys, no spaces: one spelling for one content).
    """
    rewritten = {key: value for key, value in config.items() if key not in BUILD_ONLY_KEYS}
    rewritten["created"] = timestamp(epoch)
    rewritten["config"] = {k: v for k, v in config.get("config", {}).items() if k not in BUILD_ONLY_CONFIG_KEYS}
    history: List[Dict[str, Any]] = [dict(step) for step in config.get("history", [])]
    for step in history[base_history:]:
        step["created"] = timestamp(epoch)
    rewritten["history"] = history
    rewritten["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    return json.dumps(rewritten, sort_keys=True, separators=(",", ":")).encode()


def config_id(config: bytes) -> str:
    """The image ID the engine gives a config: its sha256."""
    return "sha256:" + hashlib.sha256(config).hexdigest()


def copy(source: IO[bytes], target: IO[bytes]) -> None:
    while True:
        chunk = source.read(COPY_BUFFER)
        if not chunk:
            return
        target.write(chunk)


def saved_manifest(image: tarfile.TarFile) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The first image of ``docker save``'s output: its manifest entry (config and layer paths) and its config."""
    manifest = json.load(member(image, "manifest.json"))[0]
    return manifest, json.load(member(image, manifest["Config"]))


def member(image: tarfile.TarFile, name: str) -> IO[bytes]:
    extracted = image.extractfile(name)
    if extracted is None:
        raise ValueError(f"the saved image has no file {name}")
    return extracted
