"""Bundle on engine 1, restore on engine 2 (the second machine); refuse damaged bundles; name differences.

Test order matters for one thing only: the refusals run before the good
restore, and each first makes sure engine 2 lacks the image, so "nothing
loaded" is a real check.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import docker
import pytest
from docker.errors import ImageNotFound

from tests.container.bundle.conftest import MEASURED, ROOT, TEST_TAG
from tests.container.bundle.engine2 import SecondEngine
from trainbox.container import bundle, fingerprint, locks
from trainbox.errors import UserError


def has_image(client: docker.APIClient, ref: str) -> bool:
    try:
        client.inspect_image(ref)
    except ImageNotFound:
        return False
    return True


def remove_from(client: docker.APIClient, ref: str) -> None:
    if has_image(client, ref):
        client.remove_image(ref, force=True)


def refusal(path: Path, target: Path, client: docker.APIClient) -> str:
    """restore's one-line refusal of ``path``; asserts nothing was loaded or written."""
    remove_from(client, TEST_TAG)
    with pytest.raises(UserError) as caught:
        bundle.restore(path, target, client, progress=io.StringIO())
    message = str(caught.value)
    assert "\n" not in message
    assert not has_image(client, TEST_TAG)
    assert not (target / ".env").exists() and not (target / "compose.yaml").exists()
    return message


@contextlib.contextmanager
def flipped(path: Path, offset: int, count: int = 16) -> Iterator[None]:
    """Invert ``count`` bytes of ``path`` at ``offset`` in place; put them back afterwards."""
    fd = os.open(path, os.O_RDWR)
    try:
        original = os.pread(fd, count, offset)
        os.pwrite(fd, bytes(b ^ 0xFF for b in original), offset)
        try:
            yield
        finally:
            os.pwrite(fd, original, offset)
    finally:
        os.close(fd)


def copy_prefix(source: Path, target: Path, size: int) -> None:
    with source.open("rb") as src, target.open("wb") as dst:
        remaining = size
        while remaining:
            chunk = src.read(min(remaining, 1 << 20))
            dst.write(chunk)
            remaining -= len(chunk)


def test_manifest_names_every_part_with_its_hash(bundle_path: Path, cpu_image: str) -> None:
    with bundle.Bundle(bundle_path) as opened:
        names = [part["name"] for part in opened.parts]
        assert set(names) == {*bundle.file_parts(ROOT), bundle.FINGERPRINT_PART, bundle.IMAGE_PART}
        assert opened.manifest["lock"] == "env/requirements/cpu.lock"
        assert {"env/requirements/cpu.lock", "env/stack.env", "compose.yaml"} <= set(names)
        assert all(len(part["sha256"]) == 64 and part["size"] > 0 for part in opened.parts)
        assert opened.manifest["image"] == {
            "ref": TEST_TAG,
            "id": cpu_image,
            "flavor": "cpu",
            "tags": [TEST_TAG],
            "repo_digests": opened.manifest["image"]["repo_digests"],
        }
        saved = json.loads(opened.read_part(bundle.FINGERPRINT_PART))
        assert saved["image"]["id"] == cpu_image


def test_corrupted_image_part_is_refused_and_nothing_loaded(bundle_path: Path, engine2: docker.APIClient, tmp_path: Path) -> None:
    with bundle.Bundle(bundle_path) as opened:
        member = opened.members[bundle.IMAGE_PART]
    with flipped(bundle_path, member.offset_data + member.size // 2):
        message = refusal(bundle_path, tmp_path / "machine2", engine2)
    assert message == (f"bundle {bundle_path} was corrupted or tampered with: sha256 of image.tar does not match its manifest")


@pytest.mark.parametrize("fraction", [0.6, 0.0001])
def test_truncated_bundle_is_refused_and_nothing_loaded(
    bundle_path: Path, engine2: docker.APIClient, tmp_path: Path, fraction: float
) -> None:
    truncated = tmp_path / "truncated.tar"
    copy_prefix(bundle_path, truncated, int(bundle_path.stat().st_size * fraction))
    try:
        message = refusal(truncated, tmp_path / "machine2", engine2)
    finally:
        truncated.unlink()
    assert message.startswith(f"bundle {truncated} ")
    assert "truncated" in message


def test_tampered_file_part_is_refused(bundle_path: Path, engine2: docker.APIClient, tmp_path: Path) -> None:
    with bundle.Bundle(bundle_path) as opened:
        member = opened.members["env/stack.env"]
    with flipped(bundle_path, member.offset_data, 1):
        message = refusal(bundle_path, tmp_path / "machine2", engine2)
    assert "sha256 of env/stack.env does not match" in message


def test_restore_refuses_to_overwrite_different_files(bundle_path: Path, engine2: docker.APIClient, tmp_path: Path) -> None:
    target = tmp_path / "machine2"
    target.mkdir()
    (target / "compose.yaml").write_text("services: {}\n")
    remove_from(engine2, TEST_TAG)
    with pytest.raises(UserError, match="compose.yaml differs from the bundle's copy"):
        bundle.restore(bundle_path, target, engine2, progress=io.StringIO())
    assert not has_image(engine2, TEST_TAG)
    assert (target / "compose.yaml").read_text() == "services: {}\n"


def test_restore_on_second_engine_gives_same_image_and_fingerprint(
    bundle_path: Path,
    engine1: docker.APIClient,
    engine2: docker.APIClient,
    second_engine: SecondEngine,
    cpu_image: str,
    tmp_path: Path,
) -> None:
    remove_from(engine2, TEST_TAG)
    target = tmp_path / "machine2"
    started = time.monotonic()
    restored = bundle.restore(bundle_path, target, engine2, progress=sys.stderr, checkout=ROOT)
    MEASURED["restore_s"] = time.monotonic() - started
    assert restored.image_id == cpu_image == engine2.inspect_image(TEST_TAG)["Id"]
    assert restored.tags == [TEST_TAG] and restored.flavor == "cpu"

    here, there = fingerprint.collect(TEST_TAG, engine1), fingerprint.collect(TEST_TAG, engine2)
    assert fingerprint.compare(here, there) == []
    assert there["image"]["pip_freeze"] and there["image"]["torch"].startswith("1.13.1")
    assert fingerprint.verify(target / bundle.FINGERPRINT_PART, engine2) == []

    with bundle.Bundle(bundle_path) as opened:
        for part in opened.parts:
            if part["name"] != bundle.IMAGE_PART:
                assert (target / part["name"]).read_bytes() == opened.read_part(part["name"])
    dotenv_lines = restored.dotenv_path.read_text().splitlines()
    assert "COMPOSE_PROFILES=cpu" in dotenv_lines
    assert f"TRAINBOX_UID={os.environ.get('TRAINBOX_UID', os.getuid())}" in dotenv_lines
    labels = engine2.inspect_image(TEST_TAG)["Config"]["Labels"]
    assert f"SOURCE_COMMIT={labels['org.opencontainers.image.revision']}" in dotenv_lines
    assert f"CPU_LOCK_SHA256={labels['io.trainbox.lock-sha256']}" in dotenv_lines
    assert labels["io.trainbox.lock-sha256"] == locks.lock_digest(target / "env/requirements/cpu.lock")
    assert (target / "runs").is_dir() and (target / "data").is_dir()

    out = io.StringIO()
    bundle.report(restored, out)
    verify_line = f"cd {target} && invoke -r {ROOT} verify fingerprint.json   # differences from the machine that made the bundle"
    assert out.getvalue().splitlines()[-3:] == [
        f"next: docker tag {TEST_TAG} trainbox:cpu",
        f"next: cd {target} && docker compose up",
        f"next: {verify_line}",
    ]
    # The printed line, run as printed by a shell (in a directory that is neither the checkout nor DIR), with
    # `invoke` on PATH as `pip install -e .[host]` puts it there: this interpreter's invoke.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "invoke").write_text(f'#!/bin/sh\nexec {sys.executable} -m invoke "$@"\n')
    (bin_dir / "invoke").chmod(0o755)
    shell_env = {**os.environ, "DOCKER_HOST": second_engine.url, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ran = subprocess.run(["sh", "-c", verify_line], cwd=tmp_path, env=shell_env, capture_output=True, text=True, timeout=300)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "", ""), ran.stdout + ran.stderr


def test_verify_names_each_difference(engine1: docker.APIClient, cpu_image: str, tmp_path: Path) -> None:
    recorded = fingerprint.collect(TEST_TAG, engine1)
    recorded["host"]["kernel"] = "5.15.0-91-generic"
    recorded["host"]["gpus"] = [{"arch": "gfx1010", "compute_units": 36, "device_id": "0x731f"}]
    recorded["image"]["labels"]["io.trainbox.torch"] = "1.13.0"
    recorded["image"]["pip_freeze"] = [
        "numpy==1.26.3" if line.startswith("numpy==") else line for line in recorded["image"]["pip_freeze"]
    ]
    recorded["image"]["pip_freeze"].append("left-pad==1.0")
    path = tmp_path / "workstation.json"
    fingerprint.write(path, recorded)
    assert fingerprint.verify(path, engine1) == [
        "image label io.trainbox.torch: 1.13.0 (recorded) vs 1.13.1 (here)",
        "pip package left-pad: only recorded (1.0)",
        "pip package numpy: 1.26.3 (recorded) vs 1.26.4 (here)",
        f"host kernel: 5.15.0-91-generic (recorded) vs {platform.release()} (here)",
        "GPU 0: only recorded (gfx1010 with 36 CUs (PCI device 0x731f))",
    ]


def test_verify_names_a_missing_image(engine1: docker.APIClient, cpu_image: str, tmp_path: Path) -> None:
    recorded = fingerprint.collect(TEST_TAG, engine1)
    recorded["image_ref"] = recorded["image"]["ref"] = "trainbox-absent:cpu"
    path = tmp_path / "fingerprint.json"
    fingerprint.write(path, recorded)
    assert fingerprint.verify(path, engine1) == ["image trainbox-absent:cpu: present recorded, missing here"]


def test_a_file_that_is_no_fingerprint_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(UserError, match="is not a trainbox fingerprint"):
        fingerprint.load(bad)


def test_restore_refuses_a_bundle_other_than_the_expected_one(
    bundle_path: Path, engine2: docker.APIClient, tmp_path: Path
) -> None:
    remove_from(engine2, TEST_TAG)
    with pytest.raises(UserError, match="not the expected 0000"):
        bundle.restore(bundle_path, tmp_path / "machine2", engine2, progress=io.StringIO(), expected_digest="0" * 64)
    assert not has_image(engine2, TEST_TAG)


def test_probe_hashes_miopen_databases_and_names_symlinks(engine1: docker.APIClient, cpu_image: str, tmp_path: Path) -> None:
    """The ROCm image's kdb layout (a kdb, its Navi 1x aliases as symlinks), mounted into the CPU image."""
    db = tmp_path / "db"
    db.mkdir()
    (db / "gfx1030_36.kdb").write_bytes(b"kernels")
    (db / "gfx1030_18.kdb").symlink_to("gfx1030_36.kdb")
    container = engine1.create_container(
        cpu_image,
        command=["sh", "-c", 'exec python -c "$1"', "probe", fingerprint.PROBE],
        environment={"MIOPEN_SYSTEM_DB_PATH": "/opt/trainbox/miopen/db"},
        network_disabled=True,
        host_config=engine1.create_host_config(
            network_mode="none", binds={str(db): {"bind": "/opt/trainbox/miopen/db", "mode": "ro"}}
        ),
    )
    try:
        engine1.start(container)
        assert engine1.wait(container, timeout=300)["StatusCode"] == 0
        probed = json.loads(engine1.logs(container, stdout=True, stderr=False).decode().splitlines()[-1])
    finally:
        engine1.remove_container(container, force=True)
    assert probed["miopen_files"] == {
        "/opt/trainbox/miopen/db/gfx1030_18.kdb": "symlink -> gfx1030_36.kdb",
        "/opt/trainbox/miopen/db/gfx1030_36.kdb": hashlib.sha256(b"kernels").hexdigest(),
    }
