"""Fixtures for the container suite: a real Docker Engine and the CPU image, built once.

Without a reachable daemon every Docker test skips, which the suite-wide rule
in tests/conftest.py turns into a failure under CI. Builds use the locally
bootstrapped bases (``trainbox-base:bullseye`` for cpu, ``trainbox-base:bookworm``
for cuda; .ci/docker-setup.sh) when they exist, and trust the host's locally added CAs (/usr/local/share/ca-certificates)
unless ``TRAINBOX_CA_CERTS`` says otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import docker
import pytest

from tests.invoked import Invoked
from tests.paths import REPO
from trainbox.container import build, compose, dotenv, engine, envfiles, launch
from trainbox.errors import UserError

ROOT = REPO
#: Locally bootstrapped base image of each flavor that can be built here (no registry).
LOCAL_BASES = {"CPU_BASE_IMAGE": "trainbox-base:bullseye", "CUDA_BASE_IMAGE": "trainbox-base:bookworm"}
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
    """Process environment for the session (base image, CAs, test UID), restored afterwards."""
    saved_env = dict(os.environ)
    images = {tag for image in docker_api.images() for tag in image.get("RepoTags") or []}
    for key, local in LOCAL_BASES.items():
        if "TRAINBOX_" + key not in os.environ and local in images:
            os.environ["TRAINBOX_" + key] = local
    if "TRAINBOX_CA_CERTS" not in os.environ and any(LOCAL_CAS.glob("*.crt")):
        os.environ["TRAINBOX_CA_CERTS"] = str(LOCAL_CAS)
    os.environ["TRAINBOX_UID"], os.environ["TRAINBOX_GID"] = str(TEST_UID), str(TEST_GID)
    yield dict(os.environ)
    os.environ.clear()
    os.environ.update(saved_env)


@pytest.fixture(scope="session")
def checkout_dotenv() -> Iterator[Path]:
    """The checkout's .env, which builds of trainbox:cpu (re)write, as it was before the session once it ends.
    Only the ``docker`` group's worker writes it (:data:`OWN_IMAGES` build elsewhere)."""
    path = ROOT / ".env"
    saved = path.read_text() if path.exists() else None
    yield path
    if saved is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(saved)


#: The second xdist group of Docker tests (tests/conftest.py puts the others in ``docker``): modules that build
#: images of their own (the CUDA image, the native Debian 13 one, the no-cache rebuild) from a copy of the build
#: context, so they share neither trainbox:cpu nor the checkout's .env with the ``docker`` group and run beside it.
#: Each group is about half of the Docker tests' 40 minutes on 2 cores: CI's longest path.
OWN_IMAGES = pytest.mark.xdist_group("docker-own-images")
#: What an image build needs from the checkout (.dockerignore keeps the context to env/ and train/).
BUILD_CONTEXT = ("compose.yaml", ".dockerignore", "env", "train", *(path.name for path in ROOT.glob("Dockerfile.*")))


def build_context(target: Path) -> Path:
    """Copy the checkout's build context into ``target``: a build there writes its .env there, not in the checkout."""
    for name in BUILD_CONTEXT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target / name)
    return target


def checkout_copy(target: Path) -> Path:
    """A copy of the checkout that `invoke` runs in: the build context and tasks.py."""
    build_context(target)
    shutil.copy2(ROOT / "tasks.py", target / "tasks.py")
    return target


def build_once(flavor: str, root: Path = ROOT) -> Dict[str, object]:
    """Build (or bring up to date) trainbox:FLAVOR from ``root``; returns tag, seconds and log."""
    log = io.StringIO()
    started = time.monotonic()
    try:
        tag = build.build(flavor, root, out=log)
    except UserError as exc:
        pytest.fail(f"{exc}\n{log.getvalue()[-3000:]}")
    return {"tag": tag, "seconds": time.monotonic() - started, "log": log.getvalue()}


@pytest.fixture(scope="session")
def cpu_image(session_env, checkout_dotenv: Path) -> Dict[str, object]:
    return build_once("cpu")


@contextlib.contextmanager
def removed_after_unless_kept(docker_api, tag: str) -> Iterator[None]:
    """Remove ``tag`` after the block when it was not on the engine before it: an image built only for
    some tests (the CUDA image is 6.8 GB, the native Debian 13 one 6 GB) leaves CI's disk once they are
    done, while an image a developer had before the session stays for the next run."""
    kept = bool(docker_api.images(name=tag))
    try:
        yield
    finally:
        if not kept:
            with contextlib.suppress(docker.errors.APIError):
                docker_api.remove_image(tag, force=True)


def invoke(args: List[str], env: Dict[str, str], timeout: float = 600, root: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``invoke ARGS`` from the repository root (or a copy of it with tasks.py), like a user would."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def owner(path: Path) -> Tuple[int, int]:
    stat = path.stat()
    return stat.st_uid, stat.st_gid


#: HostConfig/Config fields that `invoke train` and `docker compose up` must set identically.
SAME_SETTINGS = (
    "NetworkMode",
    "ShmSize",
    "RestartPolicy",
    "GroupAdd",
    "Devices",
    "DeviceRequests",
    "Init",
    "CapDrop",
    "SecurityOpt",
    "ReadonlyRootfs",
    "Tmpfs",
    "PidsLimit",
    "Memory",
)
INSPECTED: Dict[str, Dict[str, Any]] = {}


def events(run_dir: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def containers_of(docker_api, run: str) -> List[Dict[str, Any]]:
    """The containers Docker lists with run ``run``'s label, whatever their state (one being created included)."""
    return docker_api.containers(all=True, filters={"label": f"{launch.RUN_LABEL}={run}"})


def container_of(docker_api, run: str, timeout: float = 120, invoked: Optional[Invoked] = None) -> Dict[str, Any]:
    """The inspection of run ``run``'s container, once there is one; with ``invoked``, the `invoke train` making it.

    Docker lists a container before it answers for it while it creates it (:data:`launch.CREATING_WAIT_S`), and one
    `invoke train` could not start is removed: either is looked for again, and an ``invoked`` that ended without
    leaving one fails the test with its output.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for listed in containers_of(docker_api, run):
            with contextlib.suppress(docker.errors.NotFound):
                return docker_api.inspect_container(listed["Id"])
        if invoked is not None:
            assert invoked.process.poll() is None, f"invoke ended before run {run} had a container:\n{invoked.output[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no container for run {run}")


def settings_of(inspected: Dict[str, Any]) -> Dict[str, Any]:
    host, config = inspected["HostConfig"], inspected["Config"]
    # Each container mounts its own run's directory, /runs/<run name>: compared without the name.
    run = next(e.split("=", 1)[1] for e in config["Env"] if e.startswith("TRAINBOX_RUN_NAME="))
    runs = envfiles.runtime_env("cpu")["TRAINBOX_RUNS"]
    mounts = sorted((m["Destination"].replace(f"{runs}/{run}", f"{runs}/<run>"), m["Type"], m["RW"]) for m in inspected["Mounts"])
    return {
        **{key: host.get(key) for key in SAME_SETTINGS},
        "User": config["User"],
        "Mounts": mounts,
        "Healthcheck": config.get("Healthcheck"),
        "StopTimeout": config.get("StopTimeout"),
        "Image": config["Image"],
    }


def assert_hardened(inspected: Dict[str, Any], run_name: str) -> None:
    """The container runs with compose.yaml's hardening, and sees only its own run directory."""
    host = inspected["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["ReadonlyRootfs"] is True
    assert host["Tmpfs"] == {"/tmp": ""}
    assert host["PidsLimit"] == 4096
    assert host["Memory"] == compose.parse_bytes(dotenv.memory_limit()) > 0
    runs = envfiles.runtime_env("cpu")["TRAINBOX_RUNS"]
    assert [m["Destination"] for m in inspected["Mounts"] if m["Destination"].startswith(runs)] == [f"{runs}/{run_name}"]


def assert_checkpoint(run_dir: Path) -> None:
    last = run_dir / "train" / "weights" / "last.pt"
    assert last.is_file(), f"no checkpoint in {run_dir}"
    assert owner(last) == (TEST_UID, TEST_GID)
    assert events(run_dir)[-1]["reason"] == "completed"


@pytest.fixture
def runs_dir(tmp_path: Path, session_env: Dict[str, str]) -> Path:
    runs = tmp_path / "runs"
    dotenv.ensure_owned_dir(runs, TEST_UID, TEST_GID)
    return runs


def run_labels(run: str) -> Dict[str, str]:
    """The labels `invoke train` gives run ``run``'s container in this checkout (its compose project)."""
    return {launch.RUN_LABEL: run, launch.PROJECT_LABEL: launch.project(ROOT)}


@pytest.fixture
def run_name(request: pytest.FixtureRequest, docker_api) -> Iterator[str]:
    """A run name unique to this test and session; its container is removed afterwards."""
    name = f"{request.node.name.split('[')[0][5:25].replace('_', '-')}-{os.getpid()}"
    yield name
    for container in containers_of(docker_api, name):
        docker_api.remove_container(container["Id"], force=True)
