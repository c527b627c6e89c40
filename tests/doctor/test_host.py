"""Driver, shared memory, disk, Docker and image checks, and the whole host doctor on each recorded tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.hosts import HOST_NAMES, host
from trainbox.container import envfiles
from trainbox.doctor import checkup, devices, render
from trainbox.doctor import host as host_checks
from trainbox.doctor.result import Check, Status


def test_driver_loaded() -> None:
    assert host_checks.module_loaded(host("rx5600xt"), "amdgpu")
    assert not host_checks.module_loaded(host("nvidia"), "amdgpu")
    assert [c.name for c in host_checks.check_driver(host("nvidia"))] == ["amdgpu", "nvidia"]


def test_amd_card_without_amdgpu_fails(host_copy) -> None:
    root: Path = host_copy("rx5600xt")
    shutil.rmtree(root / "sys/module/amdgpu")
    (check,) = host_checks.check_driver(root)
    assert check.status is Status.FAIL
    assert "modprobe amdgpu" in check.fix


def test_display_vendors_include_a_bmc() -> None:
    assert host_checks.display_vendors(host("no-gpu")) == ["0x1a03"]
    assert host_checks.check_driver(host("no-gpu"))[0].status is Status.NOT_APPLICABLE


def test_shm_and_disk_thresholds(tmp_path: Path) -> None:
    total = shutil.disk_usage(tmp_path).total
    assert host_checks.check_shm(tmp_path, min_bytes=1).status is Status.OK
    small = host_checks.check_shm(tmp_path, min_bytes=total + 1)
    assert small.status is Status.WARN and "workers: 0" in small.fix
    assert host_checks.check_shm(tmp_path / "absent").status is Status.FAIL
    assert host_checks.check_disk(tmp_path, "cpu", required=1).status is Status.OK
    full = host_checks.check_disk(tmp_path, "rocm", required=total + 1)
    assert full.status is Status.FAIL and "docker system prune" in full.fix


def test_unreachable_docker_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    client, check = host_checks.docker_client()
    assert client is None
    assert check.status is Status.FAIL
    assert "systemctl start docker" in check.fix


@pytest.mark.parametrize("flavor", checkup.FLAVORS)
def test_image_labels_against_the_lock(flavor: str) -> None:
    stack = envfiles.stack()
    labels = host_checks.expected_labels(flavor, stack)
    assert host_checks.compare_labels("trainbox:x", flavor, labels, stack).status is Status.OK
    drifted = {**labels, "io.trainbox.torch": "0.0.1"}
    check = host_checks.compare_labels("trainbox:x", flavor, drifted, stack)
    assert check.status is Status.FAIL
    assert f"torch 0.0.1 (lock: {labels['io.trainbox.torch']})" in check.detail
    assert check.fix == f"invoke build --flavor {flavor}"


def test_cuda_labels_carry_the_cuda_pins() -> None:
    stack = envfiles.stack()
    labels = host_checks.expected_labels("cuda", stack)
    assert labels == {
        "io.trainbox.flavor": "cuda",
        "io.trainbox.python": stack["CUDA_PYTHON"],
        "io.trainbox.torch": stack["CUDA_TORCH_VERSION"],
        "io.trainbox.torchvision": stack["CUDA_TORCHVISION_VERSION"],
        "io.trainbox.cuda-runtime": stack["CUDA_RUNTIME_VERSION"],
        "io.trainbox.cuda-min-driver": stack["CUDA_MIN_DRIVER"],
        "io.trainbox.ultralytics": stack["ULTRALYTICS_VERSION"],
        "io.trainbox.numpy": stack["NUMPY_VERSION"],
        "io.trainbox.opencv": stack["OPENCV_VERSION"],
    }
    assert host_checks.expected_labels("rocm", stack)["io.trainbox.torch"] == f"{stack['TORCH_VERSION']}+rocm5.2"


@pytest.mark.parametrize("flavor", checkup.FLAVORS)
def test_labels_come_from_the_dockerfile(flavor: str, tmp_path: Path) -> None:
    """The doctor compares the pin labels the flavor's Dockerfile writes, and only those (not the build's own)."""
    stack = envfiles.stack()
    expected = host_checks.expected_labels(flavor, stack)
    assert expected["io.trainbox.flavor"] == flavor
    assert {"python", "torch", "torchvision", "ultralytics", "numpy", "opencv"} <= {k.split(".")[-1] for k in expected}
    assert not any(k.startswith("io.trainbox.arg.") or k.endswith(("lock-sha256", "source-commit")) for k in expected)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text('LABEL io.trainbox.flavor="x" \\\n      io.trainbox.numpy="${NUMPY_VERSION}-local"\n')
    assert host_checks.expected_labels(flavor, stack, dockerfile) == {
        "io.trainbox.flavor": "x",
        "io.trainbox.numpy": f"{stack['NUMPY_VERSION']}-local",
    }


#: The flavor each recorded tree defaults to, and what fails there. The RTX 3070 tree was recorded without
#: /proc/driver/nvidia/version and the Container Toolkit: the cuda flavor's checks say what is missing.
RECORDED = {
    "rx5600xt": ("rocm", []),
    "rx5700xt": ("rocm", []),
    "rx6800xt": ("rocm", []),
    "no-gpu": ("cpu", []),
    "nvidia": ("cuda", ["nvidia driver", "nvidia container toolkit"]),
}


@pytest.mark.parametrize("name", HOST_NAMES)
def test_whole_host_doctor_on_recorded_trees(name: str) -> None:
    root = host(name)
    flavor, failing = RECORDED[name]
    assert checkup.default_flavor(root) == flavor
    checks = checkup.host_checks(
        root,
        devices.current_identity(),
        flavor,
        envfiles.stack(),
        envfiles.runtime_env("rocm").get("HSA_OVERRIDE_GFX_VERSION"),
        min_free=2**30,  # the disk is this machine's, not the recorded tree's
    )
    assert [c.name for c in checks if c.status is Status.FAIL] == failing, render.format_report(checks)
    applicable = {c.name for c in checks if c.status is Status.OK}
    assert ("gpu 0 miopen kdb" in applicable) is (flavor == "rocm")
    assert ("nvidia container toolkit" in {c.name for c in checks}) is (flavor == "cuda")


def test_report_puts_each_fix_on_its_failure_line() -> None:
    checks = [
        Check("a", Status.OK, "fine"),
        Check("b", Status.FAIL, "broken", "do this"),
        Check("c", Status.NOT_APPLICABLE, "no GPU"),
    ]
    text = render.format_report(checks)
    assert "FAIL  b: broken -> fix: do this\n" in text
    assert text.splitlines()[-1].startswith("1 failure(s), 0 warning(s)")
    assert render.exit_status(checks) == 1
    assert render.exit_status(checks[::2]) == 0
    with pytest.raises(ValueError, match="needs a fix"):
        Check("d", Status.FAIL, "broken")
