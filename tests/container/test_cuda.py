"""The cuda flavor on the real Docker Engine of a machine without a GPU.

What can be proven here is proven for real: the image trains the demo on the
CPU with torch.compile (spawn workers, compile inside the startup budget,
Inductor's cache on its volume); `invoke train` asks for the GPUs exactly as
`docker compose` does; and where Docker has no NVIDIA runtime, `invoke train
--flavor cuda` ends in one line that says what to install. On an engine that
has the NVIDIA runtime the same test trains the demo on the GPU instead.

Everything here happens in a copy of the checkout (its build context and
tasks.py), whose .env the CUDA flavor's build and `invoke train` write: the
module runs beside the ``docker`` group (``OWN_IMAGES``), which writes the
checkout's own .env for the CPU flavor.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from trainbox.container import compose, dotenv, envfiles, launch

from .conftest import (
    FAST_SUPERVISOR,
    OWN_IMAGES,
    TEST_GID,
    TEST_UID,
    assert_checkpoint,
    build_once,
    checkout_copy,
    containers_of,
    events,
    invoke,
    removed_after_unless_kept,
    settings_of,
)
from .test_image import ImageContract

pytestmark = OWN_IMAGES


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's copy of the checkout: the build context and tasks.py."""
    return checkout_copy(tmp_path_factory.mktemp("cuda-checkout"))


@pytest.fixture(scope="module")
def cuda_image(docker_api, session_env, checkout: Path) -> Iterator[Dict[str, object]]:
    """The CUDA image, built here on the bootstrapped Debian 12 base (it runs on the CPU without a GPU),
    for this module only."""
    with removed_after_unless_kept(docker_api, "trainbox:cuda"):
        yield build_once("cuda", checkout)


class TestCudaImage(ImageContract):
    @pytest.fixture
    def image(self, cuda_image: Dict[str, object]) -> Dict[str, object]:
        return {**cuda_image, "flavor": "cuda"}


def nvidia_runtime(docker_api) -> bool:
    """Whether this engine can hand out NVIDIA GPUs (toolkit runtime registered)."""
    return "nvidia" in (docker_api.info().get("Runtimes") or {})


@pytest.fixture
def cache_volume(docker_api) -> Iterator[str]:
    """A named volume for Inductor's cache, unique to this test, removed afterwards."""
    name = f"trainbox-test-inductor-{os.getpid()}"
    docker_api.create_volume(name)
    yield name
    docker_api.remove_volume(name, force=True)


def created(docker_api, service: compose.Service, labels: Dict[str, str]) -> Dict[str, Any]:
    """Create (never start) a container for ``service`` as `invoke train` does; return its inspection."""
    host_config = docker_api.create_host_config(**launch.host_config_kwargs(service))
    container = docker_api.create_container(host_config=host_config, **launch.create_kwargs(service, labels))
    try:
        return docker_api.inspect_container(container["Id"])
    finally:
        docker_api.remove_container(container["Id"], force=True)


def test_invoke_asks_for_the_gpus_as_compose_does(
    docker_api, cuda_image, checkout: Path, runs_dir: Path, run_name: str, session_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBOX_RUNS_HOST", str(runs_dir))  # for launch.prepare here and compose below alike
    env = {**os.environ, "TRAINBOX_RUN_NAME": run_name}
    dotenv.ensure_owned_dir(runs_dir / run_name, TEST_UID, TEST_GID)  # compose mounts the run's own directory
    request = launch.TrainRequest(profile="safe", flavor="cuda", root=checkout, run_name=run_name)
    service, labels = launch.prepare(request)
    ours = created(docker_api, service, labels)
    try:
        subprocess.run(["docker", "compose", "create", "cuda"], cwd=checkout, env=env, capture_output=True, text=True, check=True)
        listed = subprocess.run(
            ["docker", "compose", "ps", "-a", "-q", "cuda"], cwd=checkout, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        theirs = docker_api.inspect_container(listed[0])
    finally:
        subprocess.run(["docker", "compose", "rm", "-f", "-s", "cuda"], cwd=checkout, env=env, capture_output=True)
    requests = ours["HostConfig"]["DeviceRequests"]
    assert [(r["Driver"], r["Count"], r["Capabilities"]) for r in requests] == [("nvidia", -1, [["gpu"]])]
    assert settings_of(ours) == settings_of(theirs)


def test_invoke_train_cuda_without_or_with_the_nvidia_runtime(
    docker_api, cuda_image, checkout: Path, runs_dir: Path, run_name: str, session_env
) -> None:
    env = {**os.environ, "TRAINBOX_RUNS_HOST": str(runs_dir)}
    args = ["train", "--flavor", "cuda", "--name", run_name, "--no-build", "--supervisor", FAST_SUPERVISOR]
    result = invoke(args, env, root=checkout)
    if nvidia_runtime(docker_api):
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        assert_checkpoint(runs_dir / run_name)
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbox: error: Docker cannot give the container a GPU ("), result.stderr
    assert "nvidia-container-toolkit" in lines[0]
    assert not containers_of(docker_api, run_name), "container left behind"


#: The model the compile test trains: three strided convolutions and Ultralytics' Detect head on one level. Inductor's
#: C++ compile of yolov8n (training, then validation's eval graph) takes 400 CPU-seconds and more on 2 cores, this one
#: about 60; what the test proves (compile runs in the image, inside the startup budget, and fills the cache volume)
#: does not depend on the model's size. yolov8n's compile is timed on a GPU by bench/gpu.py (fast-compile).
SMALL_MODEL = """\
nc: 80
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
head:
  - [[2], 1, Detect, [nc]]
"""


def test_cuda_image_trains_with_torch_compile_on_the_cpu(
    docker_api, cuda_image, checkout: Path, runs_dir: Path, run_name: str, cache_volume: str, session_env
) -> None:
    """The fast-compile profile in the CUDA image, GPU request left out: spawn workers, compile, a cache on the volume."""
    runtime = envfiles.runtime_env("cuda")
    variables = dotenv.variables(dotenv.settings("cuda"))
    service = compose.service("cuda", {**variables, "TRAINBOX_RUNS_HOST": str(runs_dir), "TRAINBOX_RUN_NAME": run_name}, checkout)
    dotenv.ensure_owned_dir(runs_dir / run_name, TEST_UID, TEST_GID)
    model = runs_dir / run_name / "small.yaml"  # in the run's directory, which the container mounts
    model.write_text(SMALL_MODEL)
    service.device_requests = []
    service.healthcheck = None
    service.restart = None
    service.binds = [b for b in service.binds if b["target"] != runtime["TRAINBOX_DATA"]]
    service.named_volumes = [{"source": cache_volume, "target": runtime["TORCHINDUCTOR_CACHE_DIR"]}]
    model_inside = f"model={runtime['TRAINBOX_RUNS']}/{run_name}/{model.name}"
    service.command = ["demo", "--profile", "fast-compile", *FAST_SUPERVISOR.split(), "epochs=1", "workers=2", model_inside]
    host_config = docker_api.create_host_config(**launch.host_config_kwargs(service))
    labels = {launch.RUN_LABEL: run_name}
    container = docker_api.create_container(host_config=host_config, **launch.create_kwargs(service, labels))
    try:
        docker_api.start(container["Id"])
        status = docker_api.wait(container["Id"], timeout=900)["StatusCode"]
        logs = docker_api.logs(container["Id"]).decode(errors="replace")
    finally:
        docker_api.remove_container(container["Id"], force=True)
    assert status == 0, logs[-4000:]
    assert "starting torch.compile" in logs and "continuing uncompiled" not in logs, logs[-4000:]
    run_dir = runs_dir / run_name
    assert_checkpoint(run_dir)
    start = next(e for e in events(run_dir) if e["event"] == "start")
    assert start["profile"] == "fast-compile", start
    listing = docker_api.create_container(
        cuda_image["tag"],
        entrypoint="find",
        command=["/cache", "-type", "f"],
        user=f"{TEST_UID}:{TEST_GID}",
        host_config=docker_api.create_host_config(binds={cache_volume: {"bind": "/cache", "mode": "ro"}}, network_mode="none"),
    )
    try:
        docker_api.start(listing["Id"])
        docker_api.wait(listing["Id"], timeout=60)
        cached = docker_api.logs(listing["Id"]).decode().split()
    finally:
        docker_api.remove_container(listing["Id"], force=True)
    assert cached, "Inductor's cache volume is empty after a compiled run"
