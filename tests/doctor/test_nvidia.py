"""The cuda flavor's host checks on H100 cloud host trees: driver version, Container Toolkit, how Docker hands out GPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.hosts import H100_DRIVER, host
from trainbox.container import envfiles
from trainbox.doctor import checkup, devices, nvidia, render
from trainbox.doctor import host as host_checks
from trainbox.doctor.result import Check, Status

OPEN_MODULE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build"
    "  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
STACK = envfiles.stack()
OLD_DRIVER = "535.183.01"


def _checks(root: Path, flavor: str = "cuda", image_tag: str | None = None) -> dict[str, Check]:
    checks = checkup.host_checks(root, devices.current_identity(), flavor, STACK, None, image_tag, min_free=2**30)
    return {c.name: c for c in checks}


def test_driver_version_of_both_kernel_modules(h100_host) -> None:
    text = (h100_host() / nvidia.DRIVER_VERSION_FILE).read_text()
    assert nvidia.parse_driver_version(text) == H100_DRIVER
    assert nvidia.parse_driver_version(OPEN_MODULE) == "580.65.06"
    assert nvidia.parse_driver_version("GCC version:  gcc version 12.2.0\n") is None
    assert nvidia.version_key(H100_DRIVER) > nvidia.version_key("580.65.06")  # 159 > 65, not "1" < "6"
    assert nvidia.version_key("580.65.06") == nvidia.version_key(STACK["CUDA_MIN_DRIVER"])


def test_h100_host_with_the_toolkit_passes(h100_host) -> None:
    root = h100_host()
    assert checkup.default_flavor(root) == "cuda"
    checks = checkup.host_checks(root, devices.current_identity(), "cuda", STACK, None, min_free=2**30)
    assert render.exit_status(checks) == 0, render.format_report(checks)
    by_name = {c.name: c for c in checks}
    assert by_name["nvidia driver"].detail == f"driver {H100_DRIVER} runs CUDA 13.2 (needs >= 580.65.06)"
    toolkit = by_name["nvidia container toolkit"].detail
    assert "/usr/bin/nvidia-container-runtime-hook" in toolkit and "/etc/nvidia-container-runtime/config.toml" in toolkit
    assert [by_name[n].status for n in ("/dev/nvidiactl", "/dev/nvidia0")] == [Status.OK] * 2
    # The ROCm checks find no AMD GPU and stay out of the way.
    assert [by_name[n].status for n in ("amdgpu", "amd devices", "gpu arch")] == [Status.NOT_APPLICABLE] * 3
    assert "the cuda image needs about 1 GiB" in by_name["free disk"].detail


def test_old_driver_fails_with_the_version_to_install(h100_host) -> None:
    checks = _checks(h100_host(driver=OLD_DRIVER))
    assert [name for name, c in checks.items() if c.status is Status.FAIL] == ["nvidia driver"]
    driver = checks["nvidia driver"]
    assert f"driver {OLD_DRIVER} is older than 580.65.06" in driver.detail
    assert driver.fix == "upgrade the NVIDIA driver to >= 580.65.06 (CUDA 13.2 in the image)"


def test_missing_toolkit_fails_with_the_install_steps(h100_host) -> None:
    checks = _checks(h100_host(toolkit=False))
    assert [name for name, c in checks.items() if c.status is Status.FAIL] == ["nvidia container toolkit"]
    toolkit = checks["nvidia container toolkit"]
    assert "nvidia-container-runtime-hook" in toolkit.detail and "/usr/local/bin" in toolkit.detail
    assert "sudo nvidia-ctk runtime configure --runtime=docker" in toolkit.fix and "restart docker" in toolkit.fix


def test_toolkit_found_by_its_config_or_in_usr_local(h100_host) -> None:
    root = h100_host(toolkit=False)
    config = root / nvidia.TOOLKIT_CONFIG
    config.parent.mkdir(parents=True)
    config.write_text('[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n')
    assert nvidia.check_toolkit(root).detail == f"found /{nvidia.TOOLKIT_CONFIG}"
    config.unlink()
    ctk = root / "usr/local/bin/nvidia-ctk"
    ctk.parent.mkdir(parents=True)
    ctk.write_text("")
    assert nvidia.toolkit_files(root) == [ctk]


def test_driver_not_loaded_or_absent(h100_host) -> None:
    root = h100_host()
    (root / nvidia.DRIVER_VERSION_FILE).unlink()
    shutil.rmtree(root / "sys/module/nvidia")
    unloaded = nvidia.check_driver_version(root, STACK)
    assert unloaded.status is Status.FAIL
    assert "the nvidia kernel module is not loaded" in unloaded.detail and unloaded.fix.startswith("sudo modprobe nvidia")
    absent = nvidia.check_driver_version(host("no-gpu"), STACK)
    assert absent.status is Status.FAIL
    assert absent.fix == "install the NVIDIA driver >= 580.65.06 (CUDA 13.2 in the image), or use --flavor cpu"


def test_unreadable_version_warns(h100_host) -> None:
    root = h100_host()
    (root / nvidia.DRIVER_VERSION_FILE).write_text("NVRM: something else\n")
    check = nvidia.check_driver_version(root, STACK)
    assert check.status is Status.WARN and "NVRM: something else" in check.detail


@pytest.mark.parametrize("flavor", ["rocm", "cpu"])
def test_other_flavors_leave_the_nvidia_runtime_out(h100_host, flavor: str) -> None:
    root = h100_host(driver=OLD_DRIVER, toolkit=False)
    (check,) = nvidia.check_host(root, flavor, STACK)
    assert check.status is Status.NOT_APPLICABLE and f"the {flavor} flavor" in check.detail
    assert render.exit_status(_checks(root, flavor).values()) == 0


def test_default_flavor_follows_the_device_nodes(tmp_path: Path) -> None:
    assert checkup.default_flavor(tmp_path) == "cpu"
    (tmp_path / "dev").mkdir()
    (tmp_path / devices.NVIDIA).write_text("")
    assert checkup.default_flavor(tmp_path) == "cuda"
    (tmp_path / devices.KFD).write_text("")
    assert checkup.default_flavor(tmp_path) == "rocm"  # an AMD GPU wins, as on the container side


def _cdi_spec(root: Path, relative: str, kind: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(f'{{"cdiVersion": "0.5.0", "kind": "{kind}", "devices": [{{"name": "0"}}]}}')
    else:
        path.write_text(f'---\ncdiVersion: 0.5.0\nkind: "{kind}"\ndevices:\n- name: "0"\n')
    return path


def test_gpu_mechanism_runtime_hook_or_cdi(h100_host, tmp_path: Path) -> None:
    with_hook = h100_host()
    assert nvidia.gpu_mechanism(["runc", "nvidia"], tmp_path) == "the daemon has the nvidia runtime (runtimes: nvidia, runc)"
    assert nvidia.gpu_mechanism(["runc"], with_hook) == "Docker's --gpus support runs /usr/bin/nvidia-container-runtime-hook"
    assert nvidia.gpu_mechanism(["runc"], tmp_path) is None
    _cdi_spec(tmp_path, "etc/cdi/amd.yaml", "amd.com/gpu")
    _cdi_spec(tmp_path, "etc/cdi/notes.txt", "nvidia.com/gpu")  # not a spec file name
    assert nvidia.gpu_mechanism(["runc"], tmp_path) is None
    _cdi_spec(tmp_path, "var/run/cdi/nvidia-container-toolkit.json", "nvidia.com/gpu")
    cdi = nvidia.gpu_mechanism(["runc"], tmp_path)
    assert cdi == "CDI spec /var/run/cdi/nvidia-container-toolkit.json defines nvidia.com/gpu devices"
    _cdi_spec(tmp_path, "etc/cdi/nvidia.yaml", "nvidia.com/gpu")
    assert [p.name for p in nvidia.cdi_gpu_specs(tmp_path)] == ["nvidia.yaml", "nvidia-container-toolkit.json"]


def test_docker_without_a_gpu_mechanism_fails(tmp_path: Path) -> None:
    check = nvidia.check_docker_gpus(["io.containerd.runc.v2", "runc"], tmp_path)
    assert check.status is Status.FAIL
    assert "runtimes: io.containerd.runc.v2, runc" in check.detail
    assert check.fix == nvidia.TOOLKIT_FIX
    assert nvidia.check_docker_gpus(["nvidia", "runc"], tmp_path).status is Status.OK


@pytest.fixture
def docker_runtimes() -> list[str]:
    """This machine's Docker Engine's runtimes; skips without a reachable daemon."""
    client, check = host_checks.docker_client()
    if client is None:
        pytest.skip(check.detail)
    try:
        return host_checks.docker_runtimes(host_checks.docker_info(client))
    finally:
        client.close()


def test_real_docker_engine_on_h100_trees(h100_host, docker_runtimes: list[str]) -> None:
    """The whole doctor with this machine's daemon: without the toolkit only an nvidia runtime would do."""
    assert "runc" in docker_runtimes
    checks = _checks(h100_host(toolkit=False), image_tag="trainbox:doctor-test-absent")
    assert list(checks)[-4:] == ["docker", "docker gpus", "free disk", "image"]
    assert checks["docker"].status is Status.OK
    assert checks["image"].status is Status.FAIL and checks["image"].fix == "invoke build --flavor cuda"
    gpus = checks["docker gpus"]
    if "nvidia" in docker_runtimes:
        assert gpus.status is Status.OK and "nvidia runtime" in gpus.detail
    else:
        assert gpus.status is Status.FAIL and gpus.fix == nvidia.TOOLKIT_FIX
        assert f"runtimes: {', '.join(docker_runtimes)}" in gpus.detail


def test_real_docker_engine_with_the_hook_on_the_host(h100_host, docker_runtimes: list[str]) -> None:
    gpus = _checks(h100_host(), image_tag="trainbox:doctor-test-absent")["docker gpus"]
    assert gpus.status is Status.OK
    assert ("nvidia runtime" if "nvidia" in docker_runtimes else "nvidia-container-runtime-hook") in gpus.detail
