"""Fixtures: the machine's Docker Engine (engine 1), a second engine (engine 2), the CPU image and one bundle of it.

The CPU image is reused when it exists and was built from today's lock (tests/container builds it as
``trainbox:cpu``) and built through ``invoke build``'s code otherwise. The
tests pin it under their own tag, so a rebuild of ``trainbox:cpu`` by another
test during the session cannot change the image they bundle. Without Docker
the tests skip locally and fail in CI (CI=true).

The bundle (as large as the image, about 4 GB) and the second engine's data root
(the restored image, as large again) are the package's: both are gone before the
rest of the Docker suite runs, so CI's disk holds them only while they are used.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Dict, Iterator

import docker
import pytest
from docker.errors import APIError, ImageNotFound

from tests.container.bundle.engine2 import SecondEngine
from tests.paths import REPO
from trainbox.container import build, bundle, engine, fingerprint, locks
from trainbox.errors import UserError

ROOT = REPO
TEST_REPOSITORY, TEST_TAG_NAME = "trainbox-bundletest", "cpu"
TEST_TAG = f"{TEST_REPOSITORY}:{TEST_TAG_NAME}"
BASE_IMAGE = os.environ.get("TRAINBOX_BASE_IMAGE", "trainbox-base:bullseye")
#: Where CI machines keep the CAs their HTTPS proxy needs; builds trust them too.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
#: Measurements, printed at the end of the session (run pytest with -s to see them).
MEASURED: Dict[str, float] = {}


def unavailable(reason: str) -> None:
    """Skip locally; fail in CI, which must run every test."""
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def build_environment() -> Iterator[None]:
    """The locally bootstrapped base image and the local CAs, as tests/container builds with them (same layer cache)."""
    with pytest.MonkeyPatch.context() as patch:
        if "TRAINBOX_CPU_BASE_IMAGE" not in os.environ:
            patch.setenv("TRAINBOX_CPU_BASE_IMAGE", BASE_IMAGE)
        if "TRAINBOX_CA_CERTS" not in os.environ and any(LOCAL_CAS.glob("*.crt")):
            patch.setenv("TRAINBOX_CA_CERTS", str(LOCAL_CAS))
        yield


@pytest.fixture(scope="session")
def engine1() -> docker.APIClient:
    try:
        return engine.api()
    except UserError as exc:
        unavailable(str(exc))
        raise


@pytest.fixture(scope="package")
def second_engine() -> Iterator[SecondEngine]:
    """The second engine itself (its ``url`` is the DOCKER_HOST of an ``invoke`` run against it)."""
    second = SecondEngine()
    try:
        second.start()
    except RuntimeError as exc:
        unavailable(str(exc))
        raise
    try:
        yield second
    finally:
        second.stop()


@pytest.fixture(scope="package")
def engine2(second_engine: SecondEngine) -> docker.APIClient:
    return second_engine.client()


@pytest.fixture(scope="package")
def cpu_image(engine1: docker.APIClient, checkout_dotenv: Path) -> Iterator[str]:
    """ID of the CPU image, tagged TEST_TAG for the session (a build writes the checkout's .env)."""
    ref = fingerprint.image_ref("cpu", ROOT)
    try:
        found = engine1.inspect_image(ref)
        image_id = found["Id"]
    except ImageNotFound:
        found, image_id = None, ""
    current_lock = locks.lock_digest(ROOT / "env" / "requirements" / "cpu.lock")
    if found is None or (found["Config"].get("Labels") or {}).get("io.trainbox.lock-sha256") != current_lock:
        with build_environment():  # none yet, or one built from an older lock (a stale image of this machine)
            image_id = engine1.inspect_image(build.build("cpu", ROOT, out=sys.stderr))["Id"]
    engine1.tag(image_id, TEST_REPOSITORY, TEST_TAG_NAME)
    yield image_id
    try:
        engine1.remove_image(TEST_TAG)
    except APIError as exc:
        print(f"note: {TEST_TAG} left on engine 1: {exc.explanation}", file=sys.stderr)


@pytest.fixture(scope="package")
def bundle_path(engine1: docker.APIClient, cpu_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A bundle of TEST_TAG made on engine 1 (deleted at the end: it is as large as the image)."""
    out = tmp_path_factory.mktemp("bundle") / "trainbox-cpu.tar"
    started = time.monotonic()
    bundle.bundle(out, TEST_TAG, ROOT, engine1, progress=sys.stderr)
    MEASURED["bundle_s"] = time.monotonic() - started
    MEASURED["bundle_bytes"] = out.stat().st_size
    yield out
    out.unlink()
    print("\nbundle measurements: " + ", ".join(f"{k}={v:.1f}" for k, v in MEASURED.items()), file=sys.stderr)
