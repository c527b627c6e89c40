"""Fixtures for the container suite: a real Docker Engine and the CPU image, built once.

Without a reachable daemon every Docker test skips, which the suite-wide rule
in tests/conftest.py turns into a failure under CI. Builds use the locally
bootstrapped base (``trainbox-base:bullseye``, .ci/docker-setup.sh) when it
exists, and trust the host's locally added CAs (/usr/local/share/ca-certificates)
unless ``TRAINBOX_CA_CERTS`` says otherwise.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from train.container import build, engine
from train.container.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
LOCAL_BASE = "trainbox-base:bullseye"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
#: UID:GID the containers run as: a non-root stand-in when the tests run as root.
TEST_UID, TEST_GID = (4321, 4321) if os.getuid() == 0 else (os.getuid(), os.getgid())
#: Short runs: the demo defaults (3 epochs at 64 px) unless a test says otherwise.
FAST_SUPERVISOR = "--grace 5 --backoff 0.5"


@pytest.fixture(scope="session")
def docker_api():
    try:
        return engine.api()
    except UserError as exc:
        pytest.skip(f"no Docker Engine: {exc}")


@pytest.fixture(scope="session")
def session_env(docker_api) -> Iterator[Dict[str, str]]:
    """Process environment for the session (base image, CAs, test UID); .env restored afterwards."""
    saved_env = dict(os.environ)
    dotenv_path = ROOT / ".env"
    saved_dotenv = dotenv_path.read_text() if dotenv_path.exists() else None
    images = {tag for image in docker_api.images() for tag in image.get("RepoTags") or []}
    if "TRAINBOX_CPU_BASE_IMAGE" not in os.environ and LOCAL_BASE in images:
        os.environ["TRAINBOX_CPU_BASE_IMAGE"] = LOCAL_BASE
    if "TRAINBOX_CA_CERTS" not in os.environ and any(LOCAL_CAS.glob("*.crt")):
        os.environ["TRAINBOX_CA_CERTS"] = str(LOCAL_CAS)
    os.environ["TRAINBOX_UID"], os.environ["TRAINBOX_GID"] = str(TEST_UID), str(TEST_GID)
    yield dict(os.environ)
    os.environ.clear()
    os.environ.update(saved_env)
    if saved_dotenv is None:
        dotenv_path.unlink(missing_ok=True)
    else:
        dotenv_path.write_text(saved_dotenv)


@pytest.fixture(scope="session")
def cpu_image(session_env) -> Dict[str, object]:
    """Build (or bring up to date) trainbox:cpu once; returns tag, seconds and log."""
    log = io.StringIO()
    started = time.monotonic()
    try:
        tag = build.build("cpu", ROOT, out=log)
    except UserError as exc:
        pytest.fail(f"{exc}\n{log.getvalue()[-3000:]}")
    return {"tag": tag, "seconds": time.monotonic() - started, "log": log.getvalue()}


def invoke(args: List[str], env: Dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``invoke ARGS`` from the repository root, like a user would."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def owner(path: Path) -> Tuple[int, int]:
    stat = path.stat()
    return stat.st_uid, stat.st_gid
