"""Recorded host trees (tests/fixtures/hosts), writable copies of them, and an H100 cloud host built on the server tree.

Shared by the doctor, system and yolo tests; the fixtures are registered for the whole suite in tests/conftest.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.paths import FIXTURES

HOSTS = FIXTURES / "hosts"
HOST_NAMES = ("rx5600xt", "rx5700xt", "rx6800xt", "no-gpu", "nvidia")
#: The AMD cards recorded here: tree, arch, CUs, the HSA override it needs, the kdb MIOpen asks for.
CARDS = [
    # tree, arch, CUs, override needed, kdb MIOpen asks for
    ("rx5600xt", "gfx1010", 36, "10.3.0", "gfx1030_18"),
    ("rx5700xt", "gfx1010", 40, "10.3.0", "gfx1030_20"),
    ("rx6800xt", "gfx1030", 72, None, "gfx1030_36"),
]
H100_DRIVER = "580.159.04"
#: /proc/driver/nvidia/version of the proprietary kernel module (``{}``: the driver version).
NVRM_VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Jan 13 10:12:25 UTC 2026\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n"
)
#: What installing nvidia-container-toolkit 1.17 (Debian package) puts on a host.
TOOLKIT_FILES = (
    "usr/bin/nvidia-container-runtime-hook",
    "usr/bin/nvidia-ctk",
    "usr/bin/nvidia-container-cli",
    "etc/nvidia-container-runtime/config.toml",
)


def host(name: str) -> Path:
    path = HOSTS / name
    assert path.is_dir(), f"fixture host tree {path} is missing"
    return path


def add_h100(root: Path, driver: str = H100_DRIVER, toolkit: bool = True) -> Path:
    """Turn a copy of the ``no-gpu`` server tree (ASPEED BMC VGA) into a cloud host with one H100 SXM5 80GB.

    The GPU is PCI 10de:2330 in class 0x0302 (3D controller), driven by the
    nvidia module at ``driver``; ``toolkit`` adds the NVIDIA Container Toolkit's
    files. No nvidia-drm render node: data-center hosts run without a display.
    """
    root = Path(root)
    files = {
        "sys/bus/pci/devices/0000:18:00.0/class": "0x030200\n",
        "sys/bus/pci/devices/0000:18:00.0/vendor": "0x10de\n",
        "sys/bus/pci/devices/0000:18:00.0/device": "0x2330\n",
        "sys/module/nvidia/initstate": "live\n",
        "sys/module/nvidia_uvm/initstate": "live\n",
        "proc/driver/nvidia/version": NVRM_VERSION.format(driver),
        "dev/nvidiactl": "",
        "dev/nvidia0": "",
        "dev/nvidia-uvm": "",
        "dev/nvidia-uvm-tools": "",
    }
    if toolkit:
        files.update({name: "" for name in TOOLKIT_FILES})
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"):
        (root / "dev" / name).chmod(0o666)  # the driver's default NVreg_DeviceFileMode
    for name in TOOLKIT_FILES if toolkit else ():
        if name.startswith("usr/bin/"):
            (root / name).chmod(0o755)
    return root


@pytest.fixture
def host_copy(tmp_path: Path):
    """Copy a recorded tree into tmp_path so a test can change modes and groups."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(host(name), target)
        return target

    return copy


@pytest.fixture
def h100_host(host_copy):
    """An H100 cloud host (see :func:`add_h100`) in tmp_path, driver version and toolkit as the test asks."""

    def make(driver: str = H100_DRIVER, toolkit: bool = True) -> Path:
        return add_h100(host_copy("no-gpu"), driver, toolkit)

    return make
