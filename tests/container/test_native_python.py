"""The native route on the newest Python: trainbox installed with pip on Debian 13, no trainbox image.

A new user's machine today runs Debian 13 (Python 3.13) or Ubuntu 24.04 (3.12).
``native/Dockerfile`` is such a machine: the distribution's own Python in a venv,
torch and torchvision from PyPI, then the README's ``pip install -e '.[yolo]'``
of this checkout (the install needs the network, so it happens at build time, as
every image build here does). The test then runs the README's native commands in
that system with no network at all: ``trainbox demo`` (its dataset and a supervised
Ultralytics run, one epoch here), and ``supervise`` of ``examples/plain_pytorch.py``.

The base is bootstrapped like the others (.ci/docker-setup.sh); its suite and
Python are ``NATIVE_DEBIAN_SUITE`` and ``NATIVE_PYTHON`` in env/stack.env, torch
and torchvision the CUDA flavor's pins (PyPI publishes cp313 wheels for them).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from trainbox.container import dotenv, envfiles

from .conftest import FAST_SUPERVISOR, OWN_IMAGES, ROOT, TEST_GID, TEST_UID, removed_after_unless_kept

pytestmark = OWN_IMAGES

HERE = Path(__file__).resolve().parent / "native"
#: What the native route uses of a checkout: the package, its metadata (README.md is the long description)
#: and env/ (the profiles an editable install reads from the checkout).
SOURCE = ("pyproject.toml", "README.md", "train", "env")
#: Build arguments of native/Dockerfile, all from env/stack.env (overrides applied).
PINNED_ARGS = ("NATIVE_PYTHON", "CUDA_TORCH_VERSION", "CUDA_TORCHVISION_VERSION", "EXTRA_CA_CERTS_B64")


def test_dockerfile_takes_exactly_the_pins_passed() -> None:
    """No ARG left without a value (none has a default) and none passed in vain; every pin is in env/stack.env."""
    declared = set(re.findall(r"^ARG (\w+)", (HERE / "Dockerfile").read_text(), re.M))
    assert declared == {"NATIVE_BASE_IMAGE", *PINNED_ARGS}
    assert {"NATIVE_DEBIAN_SUITE", *PINNED_ARGS} - {"EXTRA_CA_CERTS_B64"} <= set(envfiles.stack())


def build_context(into: Path) -> Path:
    """The Dockerfile, add-ca-certs.sh and the source files a checkout gives pip, without bytecode."""
    shutil.copy(HERE / "Dockerfile", into / "Dockerfile")
    shutil.copy(ROOT / "train" / "container" / "image" / "add-ca-certs.sh", into / "add-ca-certs.sh")
    for name in SOURCE:
        source, target = ROOT / name, into / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    return into


@pytest.fixture(scope="module")
def native_image(docker_api, session_env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    """Debian 13 with trainbox pip-installed in its own Python's venv, for this module (removed after it
    unless it was here before: torch's layer is then cached between a developer's runs)."""
    values = dotenv.settings("cpu")
    suite = values["NATIVE_DEBIAN_SUITE"]
    base = f"trainbox-base:{suite}"
    if not docker_api.images(name=base):
        pytest.fail(f"no base image {base}: run .ci/docker-setup.sh, which bootstraps it")
    tag = f"trainbox-native:{suite}"
    with removed_after_unless_kept(docker_api, tag):
        yield build_native(docker_api, values, base, tag, tmp_path_factory.mktemp("native-context"))


def build_native(docker_api, values: Dict[str, str], base: str, tag: str, context: Path) -> Dict[str, str]:
    """Build native/Dockerfile on ``base`` from ``context`` as ``tag``; fail the test with the log's end if it fails."""
    buildargs = {"NATIVE_BASE_IMAGE": base, **{key: values[key] for key in PINNED_ARGS}}
    buildargs.update({name: values[name] for name in dotenv.PROXY_VARIABLES if values[name]})
    log = io.StringIO()
    started = time.monotonic()
    stream = docker_api.build(
        path=str(build_context(context)),
        tag=tag,
        buildargs=buildargs,
        network_mode="host",
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            pytest.fail(f"build of {tag} failed: {chunk['error'].strip()}\n{log.getvalue()[-3000:]}")
        log.write(chunk.get("stream") or "")
    print(f"built {tag} in {time.monotonic() - started:.0f} s")
    return {"tag": tag, "python": values["NATIVE_PYTHON"]}


def run_offline(docker_api, image: str, script: str, work: Path, timeout: float = 900) -> str:
    """Run ``sh -c SCRIPT`` as the test user in /work, no network, examples/ read-only; return its output."""
    host_config = docker_api.create_host_config(
        binds={str(work): {"bind": "/work", "mode": "rw"}, str(ROOT / "examples"): {"bind": "/examples", "mode": "ro"}},
        network_mode="none",
        shm_size="1g",  # DataLoader workers pass batches through /dev/shm
    )
    container = docker_api.create_container(
        image,
        command=["sh", "-c", script],
        user=f"{TEST_UID}:{TEST_GID}",
        working_dir="/work",
        environment={"HOME": "/work"},
        host_config=host_config,
    )
    try:
        docker_api.start(container["Id"])
        status = docker_api.wait(container["Id"], timeout=timeout)["StatusCode"]
        logs = docker_api.logs(container["Id"]).decode(errors="replace")
    finally:
        docker_api.remove_container(container["Id"], force=True)
    assert status == 0, f"exit {status}:\n{logs[-4000:]}"
    return logs


def run_events(run_dir: Path) -> List[Dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.training
@pytest.mark.slow
def test_native_install_trains_the_demo_and_supervises_a_script(docker_api, native_image, tmp_path: Path) -> None:
    work = tmp_path / "work"
    dotenv.ensure_owned_dir(work, TEST_UID, TEST_GID)
    script = " && ".join(
        [
            "python --version",
            f"trainbox demo --run-dir runs/yolo {FAST_SUPERVISOR} epochs=1",  # the README's native demo, one epoch
            f"trainbox supervise --run-dir runs/plain {FAST_SUPERVISOR} --stall-timeout 120 "
            "-- python /examples/plain_pytorch.py --epochs 1 --samples 64 --workers 2",
        ]
    )
    logs = run_offline(docker_api, native_image["tag"], script, work)

    assert f"Python {native_image['python']}." in logs.splitlines()[0], logs[:200]
    yolo = work / "runs" / "yolo"
    assert run_events(yolo)[-1]["reason"] == "completed", logs[-3000:]
    assert (yolo / "train" / "weights" / "last.pt").stat().st_size > 0
    assert not (yolo / "network.log").exists(), (yolo / "network.log").read_text()
    plain = work / "runs" / "plain"
    assert run_events(plain)[-1]["reason"] == "completed", logs[-3000:]
    assert (plain / "plain.pt").stat().st_size > 0
