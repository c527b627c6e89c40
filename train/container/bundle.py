"""``invoke bundle`` / ``invoke restore``: carry the exact environment to a second machine as one tar file.

A bundle is an uncompressed tar: ``compose.yaml``, every file under ``env/``
(the lock included), ``fingerprint.json`` (the image and host it was made
on), ``image.tar`` (``docker save`` of the image by name, so its tag comes
back on load) and, last, ``manifest.json`` with the size and sha256 of every
other member. The image is streamed from the engine into the bundle and from
the bundle into the engine: nothing image-sized is ever held in memory.

Restoring checks the manifest and every member's size and sha256 *before*
anything is loaded; a truncated or damaged bundle is refused with one line.
``docker load`` drops registry digests, so the loaded image is confirmed by
its image ID (the digest of its config), which survives save and load.

The manifest vouches only for itself: whoever can edit a bundle can write a
matching one. ``--sha256`` (the manifest's digest, printed by ``invoke
bundle``) is what proves a bundle is the one that was made; without it the
restore goes on, says in a warning and in its summary that the bundle is
unverified, and takes nothing from it that reaches beyond its image:

- from its env files only the pins this checkout's ``env/stack.env`` defines
  (and the container-side paths its runtime env files define); UID/GID, host
  paths and devices always come from this host, as ``invoke setup`` computes
  them;
- a compose.yaml that differs from this checkout's is printed as a diff and
  refused unless ``--accept-compose`` is given;
- every part is read once: the small files are hashed and written from the
  same bytes, and ``image.tar`` is hashed again while it streams into
  ``docker load``. If those bytes differ from the manifest's (the file was
  rewritten after the check), whatever the load brought is removed by image ID
  and the tags it took are given back to the images that had them.

The image itself is whatever an unverified bundle holds; only ``--sha256`` vouches for it.

A stop signal (``trainbox.interrupt``) ends either command within moments:
the half-written bundle's temp file is removed on the way out, and one left
by a killed run is removed by the next bundle to the same path. An
interrupted restore has written nothing; the engine drops a half-sent load.
"""

from __future__ import annotations

import datetime
import difflib
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
        try:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                if meter is not None:
                    meter.advance(len(chunk))
                yield chunk
        except (tarfile.TarError, OSError) as exc:
            raise UserError(f"bundle {self.path} is truncated inside {name} ({exc})") from None

    def part(self, name: str) -> Dict[str, Any]:
        return next(part for part in self.parts if part["name"] == name)

    def read_files(self) -> Dict[str, bytes]:
        """Every part but the image, read once and checked: these bytes are written, never a second read."""
        files = {}
        for part in self.parts:
            if part["name"] != IMAGE_PART:
                files[part["name"]] = data = self.read_part(part["name"])
                self.check_digest(part["name"], hashlib.sha256(data).hexdigest())
        return files

    def verify_image(self, progress: TextIO) -> None:
        """image.tar's sha256 against the manifest, before anything is loaded."""
        meter = Progress(progress, f"verifying {IMAGE_PART}", self.part(IMAGE_PART)["size"])
        digest = hashlib.sha256()
        for chunk in self.stream(IMAGE_PART, meter):
            digest.update(chunk)
        meter.finish()
        self.check_digest(IMAGE_PART, digest.hexdigest())

    def check_digest(self, name: str, digest: str) -> None:
        if digest != self.part(name).get("sha256"):
            raise UserError(f"bundle {self.path} was corrupted or tampered with: sha256 of {name} does not match its manifest")

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
    #: Whether the manifest's digest was given (``--sha256``) and matched.
    verified: bool = False


def _file_conflicts(opened: Bundle, target: Path) -> List[str]:
    conflicts = []
    for part in opened.parts:
        name = part["name"]
        path = target / name
        if name != IMAGE_PART and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() != part["sha256"]:
            conflicts.append(name)
    return conflicts


def _check_compose(bundled: bytes, accept: bool, progress: TextIO) -> None:
    """The bundle's compose.yaml decides mounts, devices and privileges: a different one is shown, and used only when
    accepted."""
    local = compose.COMPOSE_FILE.read_bytes()
    if bundled == local:
        return
    diff = difflib.unified_diff(
        local.decode(errors="replace").splitlines(),
        bundled.decode(errors="replace").splitlines(),
        f"{compose.COMPOSE_FILE} (this checkout)",
        f"{COMPOSE_PART} (the bundle's)",
        lineterm="",
    )
    progress.write("\n".join(diff) + "\n")
    if not accept:
        raise UserError(
            "the bundle's compose.yaml differs from this checkout's (diff above): "
            "read it, and restore with --accept-compose to use it"
        )
    progress.write(f"note: using the bundle's {COMPOSE_PART} (--accept-compose)\n")


def _images(client: docker.APIClient) -> Dict[str, str]:
    """Every image on the engine: its ID and each of its tags, mapped to its ID."""
    found = {}
    for image in client.images(all=True):
        found[image["Id"]] = image["Id"]
        found.update({tag: image["Id"] for tag in image.get("RepoTags") or [] if tag != "<none>:<none>"})
    return found


def _undo_load(client: docker.APIClient, before: Dict[str, str], loaded: List[str]) -> None:
    """Put the engine's images back as they were before a load that is not accepted: remove each image the load
    brought (by ID, with the tags it took), give every tag it moved back to its image, untag new names of older
    images. Only what the engine said it loaded is new: an image that another process built meanwhile on the same
    engine (a build beside, a CI job) stays."""
    now = _images(client)
    for image_id in {now[ref] for ref in loaded if ref in now and now[ref] not in before}:
        client.remove_image(image_id, force=True)
    now = _images(client)
    for ref, image_id in before.items():
        if ref != image_id and now.get(ref) != image_id:
            repository, _, tag = ref.rpartition(":")
            client.tag(image_id, repository, tag)
    for ref in loaded:
        if ref not in before and ref in now:
            client.remove_image(ref, noprune=True)


def _load(client: docker.APIClient, opened: Bundle, progress: TextIO, loaded: List[str]) -> str:
    """docker load the image part, streamed and hashed on the way; append what the engine says it loaded to
    ``loaded`` and return the sha256 of the bytes the engine got."""
    meter = Progress(progress, "loading image", opened.part(IMAGE_PART)["size"])
    digest = hashlib.sha256()

    def hashed() -> Iterator[bytes]:
        for chunk in opened.stream(IMAGE_PART, meter):
            digest.update(chunk)
            yield chunk

    try:
        for message in client.load_image(hashed()):
            if "error" in message:
                raise UserError(f"docker load failed: {message['error'].strip()}")
            text = str(message.get("stream", "")).strip()
            if text.startswith("Loaded image"):
                loaded.append(text.split(":", 1)[1].strip())
    except APIError as exc:
        raise UserError(f"docker load failed: {exc.explanation or exc}") from None
    meter.finish()
    return digest.hexdigest()


def _load_accepted(client: docker.APIClient, opened: Bundle, progress: TextIO) -> None:
    """Load the image and accept it only if the bytes loaded are the manifest's and every tag is the manifest's image;
    otherwise undo the load (:func:`_undo_load`) and refuse in one line."""
    image = opened.manifest["image"]
    before = _images(client)
    loaded: List[str] = []
    try:
        digest = _load(client, opened, progress, loaded)
        if digest != opened.part(IMAGE_PART)["sha256"]:
            raise UserError(
                f"bundle {opened.path} changed while it was read: the {IMAGE_PART} loaded is not the one checked"
                " (the load was undone)"
            )
        for tag in image["tags"]:
            found = client.inspect_image(tag)["Id"]
            if found != image["id"]:
                raise UserError(f"after docker load, {tag} is image {found}, not the bundle's {image['id']} (undone)")
    except Exception:
        _undo_load(client, before, loaded)
        raise


def _dotenv_values(flavor: str, target: Path) -> Dict[str, str]:
    """This host's .env values with the bundle's pins, container paths, lock digest and source commit
    (TRAINBOX_<KEY> wins).

    Only keys this checkout's own env files define are taken from the bundle's: a bundle cannot set UID/GID, host
    paths or devices, which always come from this host (:func:`dotenv.settings`).
    """
    values = dotenv.settings(flavor)
    pins = envfiles.read_env_file(envfiles.STACK_FILE)
    bundled = {
        key: value for key, value in envfiles.read_env_file(target / ENV_DIR / envfiles.STACK_FILE.name).items() if key in pins
    }
    for path in flavors.get(flavor).env_paths():
        # The container-side paths compose.yaml names (volume targets), as the bundle's image has them.
        paths = {key for key in envfiles.read_env_file(path) if key in values}
        runtime = envfiles.read_env_file(target / ENV_DIR / path.name)
        bundled.update({key: value for key, value in runtime.items() if key in paths})
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
    accept_compose: bool = False,
) -> Restored:
    """Verify bundle ``path``, load its image, confirm the image ID, write its files and this host's .env into ``target``.

    ``checkout`` is the directory of the tasks.py that runs the printed ``invoke verify`` (default: ``target``).
    Without ``expected_digest`` the bundle is unverified (see the module's docstring): it is said, and restored.
    """
    progress = progress or sys.stderr
    target = Path(target)
    # Named from the opening on: opening reads the whole bundle for its digest, and a stop there loaded nothing either.
    with on_stop(f"checking {path} (nothing was loaded or written)"), Bundle(path) as opened:
        if expected_digest is not None and opened.digest != expected_digest.lower():
            raise UserError(f"bundle {path} has manifest sha256 {opened.digest}, not the expected {expected_digest}")
        if expected_digest is None:
            progress.write(
                f"warning: bundle {path} is unverified: without --sha256 its manifest vouches for itself, so damage is"
                " detected but not tampering; pass --sha256 with the digest `invoke bundle` printed\n"
            )
        image = opened.manifest.get("image") or {}
        flavor, tags, image_id = image.get("flavor"), list(image.get("tags") or []), image.get("id")
        if flavor not in flavors.FLAVORS or not tags or not image_id:
            raise UserError(f"bundle {path}: manifest lacks the image's flavor, tags or ID")
        files = opened.read_files()
        _check_compose(files[COMPOSE_PART], accept_compose, progress)
        conflicts = _file_conflicts(opened, target)
        if conflicts:
            raise UserError(
                f"{target / conflicts[0]} differs from the bundle's copy ({len(conflicts)} file(s)):"
                " restore into an empty directory (--into DIR)"
            )
        opened.verify_image(progress)
        with on_stop(f"loading the image of {path} (the engine drops a half-sent load; nothing was written)"):
            client = client or engine.api()
            _load_accepted(client, opened, progress)
    for name, data in files.items():
        remove_stale_temps(target / name)
        with atomic_writer(target / name, "wb") as handle:
            handle.write(data)
    values = _dotenv_values(flavor, target)
    dotenv_path = dotenv.write(target, values)
    next_commands = _next_commands(tags, flavor, values, target, target if checkout is None else checkout)
    return Restored(image_id, tags, flavor, target, dotenv_path, next_commands, verified=expected_digest is not None)


def report(restored: Restored, out: Optional[TextIO] = None) -> None:
    """Tell the user what was restored and what to run next."""
    out = out or sys.stdout
    unverified = "" if restored.verified else "; UNVERIFIED: no --sha256 was given, so it may not be the bundle that was made"
    out.write(
        f"restored {', '.join(restored.tags)} = {restored.image_id} ({restored.flavor}); wrote {restored.dotenv_path}"
        f"{unverified}\n"
    )
    flavor = flavors.get(restored.flavor)
    if flavor.host_device is not None and not flavor.host_device.exists():
        out.write(f"note: this host has no {flavor.host_device}: {flavor.no_gpu_fix}\n")
    for command in restored.next_commands:
        out.write(f"next: {command}\n")
