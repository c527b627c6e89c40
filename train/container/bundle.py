"""``invoke bundle`` / ``invoke restore``: carry the exact environment to a second machine as one tar file.

A bundle is an uncompressed tar: ``compose.yaml``, every file under ``env/``
(the lock included), ``fingerprint.json`` (the image and host it was made
on), ``image.tar`` (``docker save`` of the image by name, so its tag comes
back on load) and, last, ``manifest.json`` with the size and sha256 of every
other member. The image is streamed from the engine into the bundle and from
the bundle into the engine: nothing image-sized is ever held in memory.

Restoring checks the manifest and every member's size and sha256 *before*
anything is loaded; a tampered or truncated bundle is refused with one line.
``docker load`` drops registry digests, so the loaded image is confirmed by
its image ID (the digest of its config), which survives save and load.

A stop signal (``trainbox.interrupt``) ends either command within moments:
the half-written bundle's temp file is removed on the way out, and one left
by a killed run is removed by the next bundle to the same path. An
interrupted restore has written nothing; the engine drops a half-sent load.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import posixpath
import shlex
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Dict, Iterable, Iterator, List, Optional, TextIO

import docker
from docker.errors import APIError, ImageNotFound

from trainbox.atomic import atomic_writer, remove_stale_temps
from trainbox.container import compose, dotenv, engine, envfiles, fingerprint, flavors, locks
from trainbox.errors import UserError
from trainbox.interrupt import on_stop

FORMAT = "trainbox-bundle/1"
MANIFEST = "manifest.json"
IMAGE_PART = "image.tar"
FINGERPRINT_PART = "fingerprint.json"
COMPOSE_PART = "compose.yaml"
ENV_DIR = "env"
FLAVOR_LABEL = "io.trainbox.flavor"
REVISION_LABEL = "org.opencontainers.image.revision"
CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE


class Progress:
    """Bytes done of a (possibly estimated) total, redrawn in place on a terminal, else a line every 10 s."""

    def __init__(self, out: TextIO, label: str, total: int, estimated: bool = False) -> None:
        self.out, self.label, self.total, self.estimated = out, label, total, estimated
        self.done = 0
        self.started = self.shown = time.monotonic()
        self.tty = out.isatty()

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self.shown >= (1.0 if self.tty else 10.0):
            self.shown = now
            self._show("\r" if self.tty else "\n")

    def finish(self) -> None:
        self.total = self.done
        self.estimated = False
        self._show("\n")

    def _show(self, end: str) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        total = f"{'~' if self.estimated else ''}{self.total / 1e9:.2f} GB"
        percent = f" ({min(100, 100 * self.done // max(self.total, 1))}%)" if self.total else ""
        line = f"{self.label}: {self.done / 1e9:.2f} of {total}{percent}, {self.done / 1e6 / elapsed:.0f} MB/s"
        self.out.write(("\r" if self.tty else "") + line + ("" if end == "\r" else end))
        self.out.flush()


class _TarWriter:
    """Writes a tar member by member; a streamed member's header is written once its size is known."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.mtime = int(time.time())

    def _header(self, name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, self.mtime, 0o644
        header = info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        if len(header) != BLOCK:
            raise ValueError(f"tar member name too long: {name}")
        return header

    def _pad(self, size: int) -> None:
        self.handle.write(b"\0" * (-size % BLOCK))

    def add_bytes(self, name: str, data: bytes) -> Dict[str, Any]:
        self.handle.write(self._header(name, len(data)))
        self.handle.write(data)
        self._pad(len(data))
        return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def add_stream(self, name: str, chunks: Iterable[bytes], progress: Progress) -> Dict[str, Any]:
        start = self.handle.tell()
        self.handle.write(self._header(name, 0))
        digest, size = hashlib.sha256(), 0
        for chunk in chunks:
            self.handle.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            progress.advance(len(chunk))
        self._pad(size)
        end = self.handle.tell()
        self.handle.seek(start)
        self.handle.write(self._header(name, size))
        self.handle.seek(end)
        return {"name": name, "size": size, "sha256": digest.hexdigest()}

    def close(self) -> None:
        self.handle.write(b"\0" * (2 * BLOCK))
        self.handle.write(b"\0" * (-self.handle.tell() % tarfile.RECORDSIZE))


def file_parts(root: Path) -> List[str]:
    """compose.yaml and every file under env/, as bundle member names."""
    names = [COMPOSE_PART]
    for path in sorted((root / ENV_DIR).rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and "__pycache__" not in relative.parts:
            names.append(relative.as_posix())
    return names


def _lock_part(flavor: str) -> str:
    """The member that pins the image's packages: the flavor's hash lock."""
    return locks.lock_path(flavor, Path(ENV_DIR, "requirements")).as_posix()


def _inspect(client: docker.APIClient, ref: str) -> Dict[str, Any]:
    try:
        return client.inspect_image(ref)
    except ImageNotFound:
        raise UserError(f"image {ref} not found: build it first (`invoke build`)") from None


def bundle(
    out: Path,
    ref: str,
    root: Path,
    client: Optional[docker.APIClient] = None,
    progress: Optional[TextIO] = None,
) -> Dict[str, Any]:
    """Write the bundle of image ``ref`` and ``root``'s compose.yaml and env/ to ``out`` atomically; return its manifest."""
    client = client or engine.api()
    progress = progress or sys.stderr
    attrs = _inspect(client, ref)
    flavor = ((attrs.get("Config") or {}).get("Labels") or {}).get(FLAVOR_LABEL)
    if flavor not in flavors.FLAVORS:
        raise UserError(f"image {ref} has no {FLAVOR_LABEL} label: bundle an image built by `invoke build`")
    out = Path(out)
    if not out.parent.is_dir():
        raise UserError(f"directory {out.parent} does not exist")
    for stale in remove_stale_temps(out):
        progress.write(f"removed {stale}, left by an earlier bundle that was killed\n")
    progress.write(f"fingerprinting {ref}\n")
    recorded = fingerprint.collect(ref, client)
    with on_stop(f"writing {out} (its temporary file is removed)"), atomic_writer(out, "wb") as handle:
        writer = _TarWriter(handle)
        parts = [writer.add_bytes(name, (root / name).read_bytes()) for name in file_parts(root)]
        parts.append(writer.add_bytes(FINGERPRINT_PART, fingerprint.dumps(recorded).encode()))
        meter = Progress(progress, f"saving {ref}", int(attrs.get("Size") or 0), estimated=True)
        try:
            parts.append(writer.add_stream(IMAGE_PART, client.get_image(ref, chunk_size=CHUNK), meter))
        except APIError as exc:
            raise UserError(f"docker save of {ref} failed: {exc.explanation or exc}") from None
        meter.finish()
        if _inspect(client, ref)["Id"] != attrs["Id"]:
            raise UserError(f"image {ref} was rebuilt while it was being saved: run the bundle again")
        manifest = {
            "format": FORMAT,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "image": {
                "ref": ref,
                "id": attrs["Id"],
                "flavor": flavor,
                "tags": [ref],
                "repo_digests": attrs.get("RepoDigests") or [],
            },
            "lock": _lock_part(flavor),
            "parts": parts,
        }
        manifest_bytes = (json.dumps(manifest, indent=2) + "\n").encode()
        writer.add_bytes(MANIFEST, manifest_bytes)
        writer.close()
    progress.write(
        f"wrote {out} ({out.stat().st_size / 1e9:.2f} GB), manifest sha256 {hashlib.sha256(manifest_bytes).hexdigest()}\n"
    )
    return manifest


def _safe_name(name: str) -> bool:
    normal = posixpath.normpath(name)
    inside_env = normal.startswith(ENV_DIR + "/") and not normal.startswith("/") and ".." not in normal.split("/")
    return normal == name and (name in (COMPOSE_PART, FINGERPRINT_PART, IMAGE_PART) or inside_env)


class Bundle:
    """An opened bundle whose manifest and member sizes have been checked (not yet the hashes)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            # Open for the Bundle's lifetime; closed by close() / the with block.
            self.tar = tarfile.open(self.path, "r:")  # noqa: SIM115
            self.members = {member.name: member for member in self.tar.getmembers()}
            if MANIFEST not in self.members:
                raise UserError(f"bundle {self.path} has no manifest: it is truncated or not a trainbox bundle")
            self.manifest_bytes = self.read_part(MANIFEST)
            self.manifest = json.loads(self.manifest_bytes)
        except (tarfile.TarError, OSError, ValueError) as exc:
            raise UserError(f"bundle {self.path} is unreadable, truncated or not a bundle ({exc})") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            raise UserError(f"bundle {self.path}: manifest is not a {FORMAT} manifest")
        self._check_members()

    @property
    def digest(self) -> str:
        """sha256 of manifest.json: one value that pins every part of the bundle."""
        return hashlib.sha256(self.manifest_bytes).hexdigest()

    @property
    def parts(self) -> List[Dict[str, Any]]:
        return list(self.manifest.get("parts") or [])

    def read_part(self, name: str) -> bytes:
        """A small member's bytes, checked for truncation."""
        handle = self.tar.extractfile(self.members[name])
        if handle is None:
            raise UserError(f"bundle {self.path}: {name} is not a file")
        data = handle.read()
        if len(data) != self.members[name].size:
            raise UserError(f"bundle {self.path} is truncated inside {name}")
        return data

    def _check_members(self) -> None:
        size = self.path.stat().st_size
        named = {part.get("name") for part in self.parts}
        extra = sorted(set(self.members) - named - {MANIFEST})
        if extra:
            raise UserError(f"bundle {self.path} was tampered with: {extra[0]} is not in its manifest")
        for part in self.parts:
            name = part.get("name")
            if not isinstance(name, str) or not _safe_name(name):
                raise UserError(f"bundle {self.path} was tampered with: manifest names unsafe path {name!r}")
            member = self.members.get(name)
            if member is None or not member.isfile():
                raise UserError(f"bundle {self.path} is incomplete: {name} is missing")
            if member.size != part.get("size") or member.offset_data + member.size > size:
                raise UserError(f"bundle {self.path} is truncated or tampered with: {name} has the wrong size")
        if IMAGE_PART not in named:
            raise UserError(f"bundle {self.path} is incomplete: no {IMAGE_PART}")

    def stream(self, name: str, meter: Optional[Progress] = None) -> Iterator[bytes]:
        """The member's bytes in chunks."""
        handle = self.tar.extractfile(self.members[name])
        if handle is None:
            raise UserError(f"bundle {self.path}: {name} is not a file")
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            if meter is not None:
                meter.advance(len(chunk))
            yield chunk

    def verify(self, progress: TextIO) -> None:
        """Every part's sha256 against the manifest; a mismatch is a one-line refusal."""
        for part in self.parts:
            name = part["name"]
            meter = Progress(progress, f"verifying {name}", part["size"]) if name == IMAGE_PART else None
            digest = hashlib.sha256()
            try:
                for chunk in self.stream(name, meter):
                    digest.update(chunk)
            except (tarfile.TarError, OSError) as exc:
                raise UserError(f"bundle {self.path} is truncated inside {name} ({exc})") from None
            if meter is not None:
                meter.finish()
            if digest.hexdigest() != part.get("sha256"):
                raise UserError(
                    f"bundle {self.path} was corrupted or tampered with: sha256 of {name} does not match its manifest"
                )

    def close(self) -> None:
        self.tar.close()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Restored:
    """What ``restore`` did: the image now on the engine and where compose.yaml, env/ and .env are."""

    image_id: str
    tags: List[str]
    flavor: str
    target: Path
    dotenv_path: Path
    next_commands: List[str]


def _file_conflicts(opened: Bundle, target: Path) -> List[str]:
    conflicts = []
    for part in opened.parts:
        name = part["name"]
        path = target / name
        if name != IMAGE_PART and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != part["sha256"]:
            conflicts.append(name)
    return conflicts


def _load(client: docker.APIClient, opened: Bundle, progress: TextIO) -> List[str]:
    """docker load the image part, streamed; return what the engine says it loaded."""
    size = next(part["size"] for part in opened.parts if part["name"] == IMAGE_PART)
    meter = Progress(progress, "loading image", size)
    loaded = []
    try:
        for message in client.load_image(opened.stream(IMAGE_PART, meter)):
            if "error" in message:
                raise UserError(f"docker load failed: {message['error'].strip()}")
            text = str(message.get("stream", "")).strip()
            if text.startswith("Loaded image"):
                loaded.append(text.split(":", 1)[1].strip())
    except APIError as exc:
        raise UserError(f"docker load failed: {exc.explanation or exc}") from None
    meter.finish()
    return loaded


def _dotenv_values(flavor: str, target: Path) -> Dict[str, str]:
    """This host's .env values with the bundle's pins, runtime paths, lock digest and source commit (TRAINBOX_<KEY> wins)."""
    values = dotenv.settings(flavor)
    bundled = envfiles.read_env_file(target / ENV_DIR / envfiles.STACK_FILE.name)
    for path in flavors.get(flavor).env_paths():
        runtime = envfiles.read_env_file(target / ENV_DIR / path.name)
        bundled.update({key: value for key, value in runtime.items() if key in values})
    lock = target / _lock_part(flavor)
    bundled[f"{flavor.upper()}_LOCK_SHA256"] = locks.lock_digest(lock) if lock.is_file() else ""
    image = fingerprint.load(target / FINGERPRINT_PART).get("image") or {}
    bundled["SOURCE_COMMIT"] = (image.get("labels") or {}).get(REVISION_LABEL, "unknown")
    for key, value in bundled.items():
        if os.environ.get(key if key.startswith(dotenv.OVERRIDE_PREFIX) else dotenv.OVERRIDE_PREFIX + key) is None:
            values[key] = value
    return values


def _next_commands(restored_tags: List[str], flavor: str, values: Dict[str, str], target: Path, checkout: Path) -> List[str]:
    """Shell lines that work as printed, from where restore ran; ``invoke -r`` names the checkout's tasks.py."""
    cd = "" if target.resolve() == Path.cwd().resolve() else f"cd {shlex.quote(str(target))} && "
    tasks = "" if target.resolve() == checkout.resolve() else f" -r {shlex.quote(str(checkout))}"
    commands = []
    expected = compose.service(flavor, dotenv.variables(values), target).image
    if expected not in restored_tags:
        commands.append(f"docker tag {shlex.quote(restored_tags[0])} {shlex.quote(expected)}")
    commands.append(f"{cd}docker compose up")
    commands.append(f"{cd}invoke{tasks} verify {FINGERPRINT_PART}   # differences from the machine that made the bundle")
    return commands


def restore(
    path: Path,
    target: Path,
    client: Optional[docker.APIClient] = None,
    progress: Optional[TextIO] = None,
    expected_digest: Optional[str] = None,
    checkout: Optional[Path] = None,
) -> Restored:
    """Verify bundle ``path``, load its image, confirm the image ID, write its files and this host's .env into ``target``.

    ``checkout`` is the directory of the tasks.py that runs the printed ``invoke verify`` (default: ``target``).
    """
    progress = progress or sys.stderr
    target = Path(target)
    with Bundle(path) as opened:
        if expected_digest is not None and opened.digest != expected_digest.lower():
            raise UserError(f"bundle {path} has manifest sha256 {opened.digest}, not the expected {expected_digest}")
        image = opened.manifest.get("image") or {}
        flavor, tags, image_id = image.get("flavor"), list(image.get("tags") or []), image.get("id")
        if flavor not in flavors.FLAVORS or not tags or not image_id:
            raise UserError(f"bundle {path}: manifest lacks the image's flavor, tags or ID")
        conflicts = _file_conflicts(opened, target)
        if conflicts:
            raise UserError(
                f"{target / conflicts[0]} differs from the bundle's copy ({len(conflicts)} file(s)):"
                " restore into an empty directory (--into DIR)"
            )
        with on_stop(f"checking {path} (nothing was loaded or written)"):
            opened.verify(progress)
        client = client or engine.api()
        with on_stop(f"loading the image of {path} (the engine drops a half-sent load; nothing was written)"):
            loaded = _load(client, opened, progress)
        for tag in tags:
            found = client.inspect_image(tag)["Id"]
            if found != image_id:
                raise UserError(f"after docker load, {tag} is image {found}, not the bundle's {image_id} (loaded: {loaded})")
        for part in opened.parts:
            if part["name"] != IMAGE_PART:
                remove_stale_temps(target / part["name"])
                with atomic_writer(target / part["name"], "wb") as handle:
                    handle.write(opened.read_part(part["name"]))
    values = _dotenv_values(flavor, target)
    dotenv_path = dotenv.write(target, values)
    next_commands = _next_commands(tags, flavor, values, target, target if checkout is None else checkout)
    return Restored(image_id, tags, flavor, target, dotenv_path, next_commands)


def report(restored: Restored, out: Optional[TextIO] = None) -> None:
    """Tell the user what was restored and what to run next."""
    out = out or sys.stdout
    out.write(f"restored {', '.join(restored.tags)} = {restored.image_id} ({restored.flavor}); wrote {restored.dotenv_path}\n")
    flavor = flavors.get(restored.flavor)
    if flavor.host_device is not None and not flavor.host_device.exists():
        out.write(f"note: this host has no {flavor.host_device}: {flavor.no_gpu_fix}\n")
    for command in restored.next_commands:
        out.write(f"next: {command}\n")
