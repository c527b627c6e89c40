"""The image flavors, one record each: what differs between rocm, cuda and cpu.

Everything else (the app layer, the supervisor, profiles, compose's common
service settings) is shared. Versions are never written here: each record
names the ``env/stack.env`` keys that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from trainbox import SOURCE_ROOT
from trainbox.errors import UserError

ENV_DIR = SOURCE_ROOT / "env"
KFD_DEVICE = Path("/dev/kfd")
NVIDIA_CONTROL_DEVICE = Path("/dev/nvidiactl")


@dataclass(frozen=True)
class Flavor:
    """One image flavor: its Dockerfile, pins, runtime environment and how it reaches a GPU."""

    name: str
    #: env/stack.env keys of the image's CPython, torch and torchvision versions.
    python_key: str
    torch_key: str
    torchvision_key: str
    #: glibc of the base image (the lock keeps only wheels that install on it).
    glibc: Tuple[int, int]
    #: Runtime environment files baked into the image, in load order (env/).
    env_files: Tuple[str, ...]
    #: Extra pins file in env/requirements (besides pins.txt), if any.
    extra_pins: Optional[str] = None
    #: stack.env keys of the torch index and local version label when torch is not from PyPI.
    torch_index_key: Optional[str] = None
    torch_local_key: Optional[str] = None
    #: Device node of the GPU kernel driver this flavor needs on the host (None: none needed).
    host_device: Optional[Path] = None
    #: What a user without this flavor's GPU should do instead.
    no_gpu_fix: str = ""

    @property
    def dockerfile(self) -> str:
        return f"Dockerfile.{self.name}"

    def env_paths(self, env_dir: Path = ENV_DIR) -> Tuple[Path, ...]:
        return tuple(env_dir / name for name in self.env_files)


FLAVORS: Dict[str, Flavor] = {
    flavor.name: flavor
    for flavor in (
        Flavor(
            name="rocm",
            python_key="ROCM_PYTHON",
            torch_key="TORCH_VERSION",
            torchvision_key="TORCHVISION_VERSION",
            glibc=(2, 31),
            env_files=("gfx1010.env", "runtime.env"),
            torch_index_key="TORCH_ROCM_INDEX",
            torch_local_key="TORCH_ROCM_LOCAL",
            host_device=KFD_DEVICE,
            no_gpu_fix="no ROCm GPU driver on this host; use --flavor cpu or load amdgpu",
        ),
        Flavor(
            name="cuda",
            python_key="CUDA_PYTHON",
            torch_key="CUDA_TORCH_VERSION",
            torchvision_key="CUDA_TORCHVISION_VERSION",
            glibc=(2, 36),
            env_files=("cuda.env", "runtime.env"),
            extra_pins="pins-cuda.txt",
            host_device=NVIDIA_CONTROL_DEVICE,
            no_gpu_fix="install the NVIDIA driver and nvidia-container-toolkit (see `invoke doctor --flavor cuda`)"
            " or use --flavor cpu",
        ),
        Flavor(
            name="cpu",
            python_key="CPU_PYTHON",
            torch_key="TORCH_VERSION",
            torchvision_key="TORCHVISION_VERSION",
            glibc=(2, 31),
            env_files=("runtime.env",),
            extra_pins="pins-cpu.txt",
        ),
    )
}
NAMES: Tuple[str, ...] = tuple(FLAVORS)


def get(name: str) -> Flavor:
    """The flavor called ``name``; anything else is a one-line :class:`UserError`."""
    if name not in FLAVORS:
        raise UserError(f"--flavor must be one of {', '.join(NAMES)}, not {name!r}")
    return FLAVORS[name]


def default_for_host(root: Path = Path("/")) -> str:
    """The first GPU flavor whose kernel driver's device exists under ``root`` (rocm: /dev/kfd, then cuda:
    /dev/nvidiactl), else cpu."""
    for flavor in FLAVORS.values():
        if flavor.host_device is not None and (Path(root) / flavor.host_device.relative_to("/")).exists():
            return flavor.name
    return "cpu"
