"""The host around the GPU: kernel driver, shared memory, free disk, Docker Engine and the image.

Docker checks import the Docker SDK (the ``host`` extra) inside the function,
so the rest of the doctor works without it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from string import Template
from typing import Any, Dict, List, Mapping, Optional, Tuple

from trainbox.doctor.devices import AMD_VENDOR
from trainbox.doctor.result import Check, fail, not_applicable, ok, warn

GIB = 1024**3
#: Free space to build a flavor's image (the rocm5.2 torch wheel alone unpacks to about 8 GB; plus ROCm, MIOpen, layers;
#: the cuda image is 10-12 GB: torch 2 and the CUDA 13 runtime, cuDNN, cuBLAS and NCCL wheels).
IMAGE_FREE_BYTES = {"rocm": 40 * GIB, "cuda": 25 * GIB, "cpu": 10 * GIB}
#: ``io.trainbox.<key>="<template>"`` in a Dockerfile's LABEL instruction.
_LABEL = re.compile(r'^\s*(?:LABEL\s+)?(io\.trainbox\.[\w-]+)="([^"]*)"', re.MULTILINE)
#: Labels that record a build, not a pin: the lock digest, the commit and the raw build arguments.
_BUILD_LABELS = ("io.trainbox.lock-sha256", "io.trainbox.source-commit", "io.trainbox.arg.")
#: /dev/shm below this breaks DataLoader workers at realistic batch sizes (Docker's default is 64 MB).
SHM_MIN_BYTES = 2 * GIB
DOCKER_ROOT = Path("/var/lib/docker")


def module_loaded(root: Path, module: str) -> bool:
    """A module is loaded (or built in) when ``/sys/module/<name>`` exists; a loadable one must be ``live``."""
    base = Path(root) / "sys/module" / module
    initstate = base / "initstate"
    if initstate.is_file():
        return initstate.read_text().strip() == "live"
    return base.is_dir()


def display_vendors(root: Path) -> List[str]:
    """PCI vendor IDs (``0x1002`` AMD, ``0x10de`` NVIDIA) of display controllers (class 0x03xxxx)."""
    vendors = []
    for device in sorted((Path(root) / "sys/bus/pci/devices").glob("*")):
        try:
            if (device / "class").read_text().startswith("0x03"):
                vendors.append((device / "vendor").read_text().strip())
        except OSError:
            continue
    return vendors


def check_driver(root: Path) -> List[Check]:
    """amdgpu (or nvidia) loaded; an AMD card without amdgpu is the one failure here."""
    root = Path(root)
    checks: List[Check] = []
    if module_loaded(root, "amdgpu"):
        checks.append(ok("amdgpu", "kernel module amdgpu loaded"))
    elif AMD_VENDOR in display_vendors(root):
        checks.append(
            fail(
                "amdgpu",
                "an AMD display device is on the PCI bus but amdgpu is not loaded",
                "sudo modprobe amdgpu (check `dmesg | grep amdgpu` for firmware errors)",
            )
        )
    else:
        checks.append(not_applicable("amdgpu", "amdgpu not loaded and no AMD display device on the PCI bus"))
    if module_loaded(root, "nvidia"):
        checks.append(ok("nvidia", "kernel module nvidia loaded (the cuda flavor trains on it)"))
    return checks


def check_shm(path: Path, min_bytes: int = SHM_MIN_BYTES) -> Check:
    """Size of the shared-memory filesystem DataLoader workers pass batches through."""
    try:
        total = shutil.disk_usage(path).total
    except OSError as exc:
        return fail("shared memory", f"{path}: {exc.strerror}", "mount a tmpfs on /dev/shm (it is missing)")
    shown = f"{path}: {total / GIB:.1f} GiB"
    if total < min_bytes:
        return warn(
            "shared memory",
            f"{shown}, below {min_bytes / GIB:.0f} GiB: DataLoader workers may die with 'bus error' outside the container",
            "sudo mount -o remount,size=8G /dev/shm, or use a profile with workers: 0 (containers get shm_size 8gb from compose)",
        )
    return ok("shared memory", shown)


def check_disk(path: Path, flavor: str, required: Optional[int] = None) -> Check:
    """Free space where Docker keeps images (or ``path`` itself when that is all we can see)."""
    required = IMAGE_FREE_BYTES[flavor] if required is None else required
    free = shutil.disk_usage(path).free
    shown = f"{free / GIB:.1f} GiB free at {path}"
    if free < required:
        return fail(
            "free disk",
            f"{shown}; the {flavor} image needs about {required / GIB:.0f} GiB to build",
            f"free space on {path} (`docker system prune` removes unused images and build cache)",
        )
    return ok("free disk", f"{shown} (the {flavor} image needs about {required / GIB:.0f} GiB)")


def docker_client() -> Tuple[Optional[Any], Check]:
    """A connected Docker SDK client, or None and the failure that says what to do."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return None, fail("docker", "the Docker SDK is not installed", "pip install -e '.[host]'")
    try:
        client = docker.from_env(timeout=10)
        version = client.version()
    except DockerException as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]
        return None, fail(
            "docker",
            f"Docker Engine not reachable ({reason})",
            "start it (`sudo systemctl start docker`); to use it as yourself: `sudo usermod -aG docker $USER`, log in again",
        )
    return client, ok("docker", f"Docker Engine {version.get('Version', '?')} reachable")


def docker_info(client: Any) -> Dict[str, Any]:
    """``docker info`` as the SDK returns it; empty when the daemon does not answer."""
    try:
        return dict(client.info())
    except Exception:  # noqa: BLE001 - any failure to ask leaves the documented defaults
        return {}


def docker_root(info: Mapping[str, Any]) -> Path:
    """Where the daemon keeps images (``DockerRootDir`` of :func:`docker_info`), else the documented default."""
    return Path(info.get("DockerRootDir") or DOCKER_ROOT)


def docker_runtimes(info: Mapping[str, Any]) -> List[str]:
    """Names of the daemon's configured runtimes (``runc``, ``nvidia``, ...) from :func:`docker_info`."""
    return sorted(info.get("Runtimes") or {})


def expected_labels(flavor: str, stack: Mapping[str, str], dockerfile: Optional[Path] = None) -> Dict[str, str]:
    """``io.trainbox.*`` pin labels an image built from the current env/stack.env carries: the LABEL lines of the
    flavor's Dockerfile (``dockerfile``, default the checkout's), their ``${KEY}`` filled in from ``stack``."""
    from trainbox.container import envfiles, flavors

    path = dockerfile or envfiles.REPO_ROOT / flavors.get(flavor).dockerfile
    labels = _LABEL.findall(path.read_text())
    return {key: Template(template).substitute(stack) for key, template in labels if not key.startswith(_BUILD_LABELS)}


def compare_labels(tag: str, flavor: str, labels: Optional[Mapping[str, str]], stack: Mapping[str, str]) -> Check:
    """Whether image ``tag``'s labels match the pins in env/stack.env."""
    labels = labels or {}
    drift = [
        f"{key.split('.')[-1]} {labels.get(key, 'unlabelled')} (lock: {value})"
        for key, value in expected_labels(flavor, stack).items()
        if labels.get(key) != value
    ]
    if drift:
        return fail("image", f"{tag} differs from env/stack.env: " + "; ".join(drift), f"invoke build --flavor {flavor}")
    return ok("image", f"{tag} matches env/stack.env")


def check_image(client: Any, tag: str, flavor: str, stack: Mapping[str, str]) -> Check:
    from docker.errors import ImageNotFound

    try:
        config = client.api.inspect_image(tag).get("Config") or {}
    except ImageNotFound:
        return fail("image", f"{tag} not built", f"invoke build --flavor {flavor}")
    return compare_labels(tag, flavor, config.get("Labels"), stack)
