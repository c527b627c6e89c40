"""A hostile bundle: one made from a real bundle by editing its parts and writing a matching manifest.

Without ``--sha256`` such a bundle passes every hash check, so what restore
takes from it must be harmless by itself: only version pins reach ``.env``
(never UID/GID, host paths or devices), a compose.yaml that differs from the
checkout's is shown and refused unless accepted, the bundle is reported as
unverified, and the image accepted is the one whose bytes were hashed, even
when ``image.tar`` is rewritten between the check and the load.

Every edit is made in place with the same size (so the shared session bundle
is not copied) and undone afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Dict, Iterator

import docker
import pytest

from tests.container.bundle.conftest import ROOT, TEST_TAG
from tests.container.bundle.test_bundle import has_image, remove_from
from trainbox.container import bundle, dotenv
from trainbox.errors import UserError

#: An image another process imports on the engine while a refused load is undone: it must stay.
BYSTANDER = "trainbox-bystander:load"


def hostile_values(victim: Path) -> Dict[str, str]:
    """What a hostile env file would like .env to say: the issue's examples, with an owner other than this host's
    user (the tests run as root) and host directories of the test's own (``/etc`` and ``/root`` in the issue)."""
    return {
        "TRAINBOX_UID": str(os.getuid() + 4242),
        "TRAINBOX_GID": str(os.getgid() + 4242),
        "TRAINBOX_RUNS_HOST": str(victim / "etc"),
        "TRAINBOX_DATA_HOST": str(victim / "root"),
        "TRAINBOX_DRI_DEVICE": "/dev/sda",
        "TRAINBOX_KFD_DEVICE": "/dev/sda",
        "TRAINBOX_VIDEO_GID": "4243",
    }


def same_size_with(original: bytes, extra: bytes) -> bytes:
    """``original`` with ``extra`` lines appended, comment lines dropped to keep the size (padded with a comment)."""
    lines = original.decode().splitlines(keepends=True)
    kept = list(lines)
    while len("".join(kept).encode()) + len(extra) + 2 > len(original):
        kept.remove(next(line for line in kept if line.startswith("#")))
    body = "".join(kept).encode() + extra
    padding = len(original) - len(body)
    assert padding >= 2
    return body + b"#" + b"x" * (padding - 2) + b"\n"


@contextlib.contextmanager
def rewritten(path: Path, edits: Dict[str, bytes]) -> Iterator[None]:
    """Replace bundle members (same size) and their sha256 in manifest.json, in place; undo afterwards."""
    with bundle.Bundle(path) as opened:
        members = {name: (opened.members[name].offset_data, opened.members[name].size) for name in edits}
        manifest_at = opened.members[bundle.MANIFEST].offset_data
        manifest = opened.manifest_bytes
    new_manifest = manifest
    for name, data in edits.items():
        assert len(data) == members[name][1], name
        part = next(p for p in json.loads(manifest)["parts"] if p["name"] == name)
        new_manifest = new_manifest.replace(part["sha256"].encode(), hashlib.sha256(data).hexdigest().encode())
    assert len(new_manifest) == len(manifest)
    writes = [(offset, data) for name, data in edits.items() for offset in [members[name][0]]] + [(manifest_at, new_manifest)]
    fd = os.open(path, os.O_RDWR)
    try:
        originals = [(offset, os.pread(fd, len(data), offset)) for offset, data in writes]
        try:
            for offset, data in writes:
                os.pwrite(fd, data, offset)
            yield
        finally:
            for offset, data in originals:
                os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def hostile_env_file(path: Path, name: str, hostile: Dict[str, str]) -> bytes:
    with bundle.Bundle(path) as opened:
        original = opened.read_part(name)
    return same_size_with(original, "".join(f"{k}={v}\n" for k, v in hostile.items()).encode())


def hostile_compose(path: Path) -> bytes:
    with bundle.Bundle(path) as opened:
        original = opened.read_part(bundle.COMPOSE_PART)
    assert original.count(b"network_mode: none") == 1
    return original.replace(b"network_mode: none", b"network_mode: host")


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRAINBOX_<KEY> overrides: whatever .env says comes from the host or the bundle."""
    for key in list(os.environ):
        if key.startswith(dotenv.OVERRIDE_PREFIX) and key != "TRAINBOX_CA_CERTS":
            monkeypatch.delenv(key)


def test_hostile_env_files_do_not_reach_dotenv(
    bundle_path: Path, engine2: docker.APIClient, tmp_path: Path, host_env: None
) -> None:
    """Pins only: the bundle's UID/GID, host paths and devices are ignored; .env has this host's values. Its differing
    compose.yaml is used only because --accept-compose says so."""
    remove_from(engine2, TEST_TAG)
    target = tmp_path / "machine2"
    victim = tmp_path / "victim"
    hostile = hostile_values(victim)
    for key in ("TRAINBOX_RUNS_HOST", "TRAINBOX_DATA_HOST"):
        Path(hostile[key]).mkdir(parents=True)
    edits = {name: hostile_env_file(bundle_path, name, hostile) for name in ("env/stack.env", "env/runtime.env")}
    edits[bundle.COMPOSE_PART] = hostile_compose(bundle_path)
    progress = io.StringIO()
    with rewritten(bundle_path, edits):
        restored = bundle.restore(bundle_path, target, engine2, progress=progress, checkout=ROOT, accept_compose=True)
    assert (target / bundle.COMPOSE_PART).read_bytes() == edits[bundle.COMPOSE_PART]
    assert "note: using the bundle's compose.yaml (--accept-compose)" in progress.getvalue().splitlines()
    values = dict(line.split("=", 1) for line in restored.dotenv_path.read_text().splitlines() if "=" in line)
    host = dotenv.settings("cpu")
    for key in hostile:
        assert values[key] == host[key], key
    for key in ("TRAINBOX_RUNS_HOST", "TRAINBOX_DATA_HOST"):
        owner = Path(hostile[key]).stat()
        assert (owner.st_uid, owner.st_gid) == (os.getuid(), os.getgid()), f"restore chowned {hostile[key]}"
    assert values["TORCH_VERSION"] == host["TORCH_VERSION"]  # pins still come from the bundle (same as here)
    assert (target / "runs").is_dir() and (target / "data").is_dir()
    # Unverified (no --sha256): said once while restoring and again in the summary.
    warning = f"warning: bundle {bundle_path} is unverified"
    assert [line for line in progress.getvalue().splitlines() if line.startswith(warning)] != []
    summary = io.StringIO()
    bundle.report(restored, summary)
    assert "UNVERIFIED" in summary.getvalue().splitlines()[0]
    remove_from(engine2, TEST_TAG)


def test_differing_compose_is_refused_without_accept_compose(
    bundle_path: Path, engine2: docker.APIClient, tmp_path: Path
) -> None:
    remove_from(engine2, TEST_TAG)
    target = tmp_path / "machine2"
    progress = io.StringIO()
    with rewritten(bundle_path, {bundle.COMPOSE_PART: hostile_compose(bundle_path)}), pytest.raises(UserError) as caught:
        bundle.restore(bundle_path, target, engine2, progress=progress)
    message = str(caught.value)
    assert "\n" not in message and "--accept-compose" in message
    diff = progress.getvalue().splitlines()
    assert "-  network_mode: none" in diff and "+  network_mode: host" in diff
    assert not has_image(engine2, TEST_TAG)
    assert not target.exists() or list(target.iterdir()) == []


def tiny_rootfs() -> bytes:
    """A one-file root file system, as ``docker import`` takes it."""
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        info = tarfile.TarInfo("evil")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    return rootfs.getvalue()


def evil_image_tar(engine2: docker.APIClient, size: int) -> bytes:
    """A tiny image tagged TEST_TAG, as `docker save` writes it, plus a padding member so that it is ``size`` bytes
    (docker load ignores files it does not know); its end-of-archive is left to the original's last blocks."""
    repository, tag = TEST_TAG.split(":")
    engine2.import_image_from_data(tiny_rootfs(), repository=repository, tag=tag)
    saved = b"".join(engine2.get_image(TEST_TAG))
    engine2.remove_image(TEST_TAG, force=True)
    members, offset = io.BytesIO(saved), 0
    with tarfile.open(fileobj=members, mode="r:") as tar:
        for member in tar.getmembers():
            offset = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    body = saved[:offset]
    pad = tarfile.TarInfo("pad")
    pad.size = size - len(body) - tarfile.BLOCKSIZE - 2 * tarfile.BLOCKSIZE
    return body + pad.tobuf(tarfile.GNU_FORMAT)


class SwapAfterCheck(io.StringIO):
    """Progress output that, the moment image.tar's check is complete, rewrites it in place (a real concurrent write);
    and once the load has begun, imports an image of its own on the same engine (another process's build beside)."""

    def __init__(self, path: Path, offset: int, data: bytes, engine: docker.APIClient) -> None:
        super().__init__()
        self.path, self.offset, self.data, self.engine = path, offset, data, engine
        self.original = b""
        self.bystander = ""

    def write(self, text: str) -> int:
        if not self.original and f"verifying {bundle.IMAGE_PART}: " in text and "(100%)" in text:
            fd = os.open(self.path, os.O_RDWR)
            try:
                self.original = os.pread(fd, len(self.data), self.offset)
                os.pwrite(fd, self.data, self.offset)
            finally:
                os.close(fd)
        if not self.bystander and "loading image" in text:
            repository, tag = BYSTANDER.split(":")
            self.engine.import_image_from_data(tiny_rootfs(), repository=repository, tag=tag)
            self.bystander = self.engine.inspect_image(BYSTANDER)["Id"]
        return super().write(text)

    def undo(self) -> None:
        if self.original:
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.pwrite(fd, self.original, self.offset)
            finally:
                os.close(fd)
        remove_from(self.engine, BYSTANDER)


def test_image_swapped_after_its_check_is_not_accepted(bundle_path: Path, engine2: docker.APIClient, tmp_path: Path) -> None:
    """image.tar rewritten between the hash check and docker load: nothing of the new bytes stays on the engine, and
    nothing else is touched (an image imported on the engine during the load stays)."""
    remove_from(engine2, TEST_TAG)
    with bundle.Bundle(bundle_path) as opened:
        member = opened.members[bundle.IMAGE_PART]
        opened.tar.fileobj.seek(member.offset_data + member.size - 2 * tarfile.BLOCKSIZE)
        tail = opened.tar.fileobj.read(2 * tarfile.BLOCKSIZE)
    assert tail == b"\0" * 1024  # the original's end-of-archive, which the swapped content reuses
    evil = evil_image_tar(engine2, member.size)
    images_before = {image["Id"] for image in engine2.images(all=True)}
    progress = SwapAfterCheck(bundle_path, member.offset_data, evil, engine2)
    try:
        with pytest.raises(UserError) as caught:
            bundle.restore(bundle_path, tmp_path / "machine2", engine2, progress=progress)
        images_after = {image["Id"] for image in engine2.images(all=True)}
    finally:
        progress.undo()
    assert progress.original and progress.bystander, "the swap or the import beside never happened"
    assert "\n" not in str(caught.value)
    assert not has_image(engine2, TEST_TAG), f"the swapped image stayed ({caught.value})"
    assert images_after == images_before | {progress.bystander}
    assert not (tmp_path / "machine2" / ".env").exists()
