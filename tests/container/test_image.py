"""The images built here (cpu, and cuda on the CPU): labels equal env/stack.env,
packages import at the pinned versions, pip is consistent, non-root entry point.

:class:`ImageContract` holds the checks; each flavor's test class gives its ``image``
(the cuda one lives in test_cuda.py, with the CUDA image it builds and removes)."""

from __future__ import annotations

from typing import Dict

import pytest

from trainbox.container import envfiles, flavors


def run(docker_api, image: str, entrypoint: str, command: list) -> str:
    container = docker_api.create_container(
        image, command=command, entrypoint=entrypoint, host_config=docker_api.create_host_config(network_mode="none")
    )
    try:
        docker_api.start(container["Id"])
        docker_api.wait(container["Id"], timeout=300)
        return docker_api.logs(container["Id"]).decode()
    finally:
        docker_api.remove_container(container["Id"], force=True)


class ImageContract:
    """What every image built here holds; a subclass named Test... gives the ``image`` fixture."""

    def test_labels_equal_stack(self, docker_api, image: Dict[str, object]) -> None:
        labels = docker_api.inspect_image(image["tag"])["Config"]["Labels"]
        pins = envfiles.stack()
        flavor = flavors.get(str(image["flavor"]))
        assert labels["io.trainbox.flavor"] == flavor.name
        assert labels["io.trainbox.torch"] == pins[flavor.torch_key]
        assert labels["io.trainbox.torchvision"] == pins[flavor.torchvision_key]
        assert labels["io.trainbox.ultralytics"] == pins["ULTRALYTICS_VERSION"]
        assert labels["io.trainbox.numpy"] == pins["NUMPY_VERSION"]
        assert labels["io.trainbox.opencv"] == pins["OPENCV_VERSION"]
        assert labels["io.trainbox.python"] == pins[flavor.python_key]

    def test_installed_versions(self, docker_api, image: Dict[str, object]) -> None:
        code = (
            "import sys, cv2, numpy, torch, torchvision, importlib.metadata as m; "
            "print(sys.version_info[:2], torch.__version__, torchvision.__version__, numpy.__version__, "
            "m.version('ultralytics'), m.version('opencv-python-headless'), torch.version.cuda)"
        )
        out = run(docker_api, str(image["tag"]), "python", ["-c", code]).strip().splitlines()[-1]
        pins = envfiles.stack()
        flavor = flavors.get(str(image["flavor"]))
        major, minor = pins[flavor.python_key].split(".")
        assert out.split(") ")[0] == f"({major}, {minor}"
        versions = out.split(") ")[1].split()
        assert versions[0].split("+")[0] == pins[flavor.torch_key]
        assert versions[1].split("+")[0] == pins[flavor.torchvision_key]
        assert versions[2:5] == [pins["NUMPY_VERSION"], pins["ULTRALYTICS_VERSION"], pins["OPENCV_VERSION"]]
        if flavor.name == "cuda":
            assert versions[5] == pins["CUDA_RUNTIME_VERSION"], "torch must carry the CUDA runtime env/stack.env names"

    def test_pip_check_only_headless_opencv(self, docker_api, image: Dict[str, object]) -> None:
        out = run(docker_api, str(image["tag"]), "pip", ["check"]).strip().splitlines()
        assert out == ["ultralytics 8.4.190 requires opencv-python, which is not installed."], out

    def test_runs_as_default_non_root_user(self, docker_api, image: Dict[str, object]) -> None:
        config = docker_api.inspect_image(image["tag"])["Config"]
        assert config["User"] not in ("", "0", "root")
        assert config["Entrypoint"][:2] == ["tini", "--"]
        assert config["Healthcheck"]["Test"][-2:] == ["health", "--act"]


class TestCpuImage(ImageContract):
    @pytest.fixture
    def image(self, cpu_image: Dict[str, object]) -> Dict[str, object]:
        return {**cpu_image, "flavor": "cpu"}
