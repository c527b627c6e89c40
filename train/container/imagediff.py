"""What differs between two saved images, layer by layer and file by file, in plain words.

``invoke verify-rebuild`` saves the image it has and the one it rebuilt
(``docker save``) and hands both here when their IDs differ. An image's ID is
the sha256 of its config, and the config lists every layer's sha256
(``rootfs.diff_ids``), so a difference is always in one of two places:

- the config: its settings (environment, labels, entry point, user), the
  steps' commands and times; each differing field is named with both values;
- a layer: only layers whose sha256 differ are read, and each is named by the
  Dockerfile step that made it; then, when dpkg's database differs (a
  distribution update between two builds, the likeliest cause), each package
  whose version differs; then every path that is in one layer only, or whose
  content, type, mode, owner, time, link target or extended attributes
  differ. Two layers with the same entries that still differ were written in
  another order or another tar dialect, which is said too.

The file contents are compared by sha256; for what changed inside a file, run
``diffoscope`` (Debian package) on the two files (``docker cp`` them out).
Nothing here talks to the engine: tests feed it generated layer tarballs.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import tarfile
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Sequence, Tuple

from trainbox.container import layers

#: Per layer, at most this many differing paths are listed; the rest are counted.
MAX_PATHS = 40
#: A step's command is shown up to this many characters.
STEP_WIDTH = 120
READ_BUFFER = 1 << 20
#: dpkg's database: when it differs, the packages whose version differs are named first.
DPKG_STATUS = "/var/lib/dpkg/status"
#: Config fields compared one by one; the rest of the config is compared as a whole.
CONFIG_FIELDS = ("architecture", "os", "created", "author", "docker_version", "container")
TAR_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
}


@dataclass(frozen=True)
class Entry:
    """One path of a layer, as far as it makes the image: what a rebuild must reproduce."""

    kind: str
    mode: int
    owner: Tuple[int, int]
    mtime: int
    size: int
    sha256: str
    link: str
    xattrs: Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class Image:
    """A saved image: its ID, its config and, per layer, a way to open that layer's tar."""

    name: str
    config: Dict[str, Any]
    layers: Sequence[Any]  # callables returning a readable binary stream, one per diff_id


@dataclass
class Listing:
    """A layer's paths, the order they came in and, when the layer holds dpkg's database, the packages in it."""

    entries: Dict[str, Entry]
    order: List[str]
    packages: Dict[str, str]


def entries(layer: IO[bytes]) -> Listing:
    """Every path of a layer tar (``/``-rooted) with what makes it, and the order they came in."""
    listing = Listing({}, [], {})
    with tarfile.open(fileobj=layer, mode="r|") as tar:
        for member in tar:
            name = member.name[2:] if member.name.startswith("./") else member.name
            path = "/" + name.strip("/")
            digest = hashlib.sha256()
            source = tar.extractfile(member) if member.isreg() else None
            kept = bytearray() if path == DPKG_STATUS else None
            for chunk in iter(functools.partial(source.read, READ_BUFFER), b"") if source else ():
                digest.update(chunk)
                if kept is not None:
                    kept += chunk
            if kept is not None:
                listing.packages = packages(kept.decode(errors="replace"))
            xattrs = tuple(sorted((k, v) for k, v in member.pax_headers.items() if k.startswith("SCHILY.xattr.")))
            listing.entries[path] = Entry(
                kind=TAR_KINDS.get(member.type, f"tar type {member.type!r}"),
                mode=member.mode,
                owner=(member.uid, member.gid),
                mtime=int(member.mtime),
                size=member.size,
                sha256=digest.hexdigest() if member.isreg() else "",
                link=member.linkname,
                xattrs=xattrs,
            )
            listing.order.append(path)
    return listing


def packages(status: str) -> Dict[str, str]:
    """``package -> version`` from dpkg's status database (one paragraph per package)."""
    found = {}
    for paragraph in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in paragraph.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields and "Version" in fields:
            found[fields["Package"]] = fields["Version"]
    return found


def package_differences(a: Dict[str, str], b: Dict[str, str]) -> List[str]:
    """What apt installed differently: the first thing to read when a distribution update moved a package."""
    lines = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            lines.append(f"package {name} {a[name]}: only here")
        elif name not in a:
            lines.append(f"package {name} {b[name]}: only in the rebuild")
        elif a[name] != b[name]:
            lines.append(f"package {name}: {a[name]} here, {b[name]} in the rebuild")
    return lines


def when(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def entry_differences(a: Entry, b: Entry) -> List[str]:
    """What differs between one path's two entries, each as 'what: here vs rebuilt'."""
    said: List[str] = []
    if a.kind != b.kind:
        said.append(f"a {a.kind} here, a {b.kind} in the rebuild")
    if a.sha256 != b.sha256 or a.size != b.size:
        said.append(f"content differs ({a.size} bytes, sha256 {a.sha256[:12]} vs {b.size} bytes, sha256 {b.sha256[:12]})")
    if a.link != b.link:
        said.append(f"link target {a.link!r} vs {b.link!r}")
    if a.mode != b.mode:
        said.append(f"mode {a.mode:04o} vs {b.mode:04o}")
    if a.owner != b.owner:
        said.append(f"owner {a.owner[0]}:{a.owner[1]} vs {b.owner[0]}:{b.owner[1]}")
    if a.mtime != b.mtime:
        said.append(f"time {when(a.mtime)} vs {when(b.mtime)}")
    if a.xattrs != b.xattrs:
        said.append("extended attributes differ")
    return said


def layer_differences(here: IO[bytes], rebuilt: IO[bytes]) -> List[str]:
    """Packages whose version differs, then one line per path that differs between two layer tars (at most
    :data:`MAX_PATHS` paths, then a count)."""
    one, two = entries(here), entries(rebuilt)
    a, b = one.entries, two.entries
    lines: List[str] = []
    for path in sorted(set(a) | set(b)):
        if path not in b:
            lines.append(f"{path}: only here, not in the rebuild")
        elif path not in a:
            lines.append(f"{path}: only in the rebuild")
        else:
            said = entry_differences(a[path], b[path])
            if said:
                lines.append(f"{path}: " + "; ".join(said))
    if not lines:
        return ["same files, stored in another order" if one.order != two.order else "same files, written as a different tar"]
    if len(lines) > MAX_PATHS:
        lines = [*lines[:MAX_PATHS], f"... and {len(lines) - MAX_PATHS} more paths"]
    return package_differences(one.packages, two.packages) + lines


def step_names(config: Dict[str, Any]) -> List[str]:
    """The Dockerfile step behind each layer, in layer order (history entries that made no layer are skipped)."""
    names = []
    for step in config.get("history", []):
        if not step.get("empty_layer"):
            command = step.get("created_by", "")
            for shell in ("/bin/bash -euo pipefail -c ", "/bin/sh -c "):
                if shell in command:
                    command = command.split(shell, 1)[1]
                    # The classic builder records COPY, ADD, ENV... as '<shell> #(nop) COPY ...', a RUN as '<shell> CMD'.
                    command = command[len("#(nop) ") :] if command.startswith("#(nop) ") else "RUN " + command
                    break
            command = command.strip()
            names.append(command if len(command) <= STEP_WIDTH else command[: STEP_WIDTH - 3] + "...")
    return names


def config_differences(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    """One line per config field that differs (rootfs aside: the layers are compared on their own)."""
    lines = []
    for key in CONFIG_FIELDS:
        if a.get(key) != b.get(key):
            lines.append(f"config {key}: {a.get(key)!r} vs {b.get(key)!r}")
    settings_a, settings_b = a.get("config") or {}, b.get("config") or {}
    for key in sorted(set(settings_a) | set(settings_b)):
        if settings_a.get(key) != settings_b.get(key):
            lines.append(f"config setting {key}: {json.dumps(settings_a.get(key))} vs {json.dumps(settings_b.get(key))}")
    history_a, history_b = a.get("history") or [], b.get("history") or []
    if len(history_a) != len(history_b):
        lines.append(f"config history: {len(history_a)} steps vs {len(history_b)}")
    for index, (step_a, step_b) in enumerate(zip(history_a, history_b), 1):
        for key in sorted(set(step_a) | set(step_b)):
            if step_a.get(key) != step_b.get(key):
                lines.append(f"config history step {index} {key}: {step_a.get(key)!r} vs {step_b.get(key)!r}")
    rest = (set(a) | set(b)) - {*CONFIG_FIELDS, "config", "history", "rootfs"}
    lines.extend(f"config {key} differs" for key in sorted(rest) if a.get(key) != b.get(key))
    return lines


def differences(here: Image, rebuilt: Image) -> List[str]:
    """Everything that differs between two images, config first, then each differing layer with its paths."""
    lines = config_differences(here.config, rebuilt.config)
    ids_a, ids_b = here.config["rootfs"]["diff_ids"], rebuilt.config["rootfs"]["diff_ids"]
    if len(ids_a) != len(ids_b):
        lines.append(f"{len(ids_a)} layers here, {len(ids_b)} in the rebuild")
    steps = step_names(here.config)
    for index, (id_a, id_b) in enumerate(zip(ids_a, ids_b)):
        if id_a == id_b:
            continue
        step = steps[index] if index < len(steps) else "?"
        lines.append(f"layer {index + 1} of {len(ids_a)} ({step}) differs:")
        with here.layers[index]() as layer_a, rebuilt.layers[index]() as layer_b:
            lines.extend("  " + line for line in layer_differences(layer_a, layer_b))
    return lines


def saved_image(tar: tarfile.TarFile, name: str) -> Image:
    """The image inside ``docker save``'s output (its first, and for ``docker save TAG`` only, image)."""
    manifest, config = layers.saved_manifest(tar)
    return Image(name, config, [lambda path=path: layers.member(tar, path) for path in manifest["Layers"]])
