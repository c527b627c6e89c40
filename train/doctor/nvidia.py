"""The NVIDIA path of the cuda flavor: kernel driver version, NVIDIA Container Toolkit, and how Docker hands out GPUs.

The cuda image carries its own CUDA runtime, cuDNN and NCCL (wheels); the host
gives only the kernel driver, whose user-space half (libcuda, nvidia-smi) the
toolkit mounts into a container that asks for GPUs. So the host needs a driver
at least as new as the image's CUDA runtime requires (``CUDA_MIN_DRIVER`` in
env/stack.env) and a way for Docker to inject it. Everything is read under
``root``; nothing here talks to the Docker daemon (the caller passes its runtimes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Tuple

from trainbox.doctor.devices import NVIDIA
from trainbox.doctor.host import module_loaded
from trainbox.doctor.result import Check, fail, not_applicable, ok, warn

DRIVER_VERSION_FILE = Path("proc/driver/nvidia/version")
#: Docker's built-in ``--gpus`` support runs this prestart hook (moby daemon/nvidia_linux.go looks it up in PATH).
HOOK = "nvidia-container-runtime-hook"
TOOLKIT_BINARIES = (HOOK, "nvidia-ctk", "nvidia-container-cli")
BIN_DIRS = (Path("usr/bin"), Path("usr/local/bin"), Path("usr/sbin"), Path("bin"))
TOOLKIT_CONFIG = Path("etc/nvidia-container-runtime/config.toml")
#: Where CDI specs live (static ones written by ``nvidia-ctk cdi generate``, and the dynamic ones).
CDI_DIRS = (Path("etc/cdi"), Path("var/run/cdi"))
CDI_SUFFIXES = (".yaml", ".yml", ".json")
_CDI_GPU_KIND = re.compile(r"""["']?kind["']?\s*:\s*["']?nvidia\.com/gpu\b""")
#: ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ...`` and the open module's
#: ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...``.
_NVRM_VERSION = re.compile(r"^NVRM version:.*?Kernel Module\b.*?\s(\d+(?:\.\d+)+)(?=\s|$)", re.MULTILINE)
TOOLKIT_FIX = (
    "install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker`"
    " and `sudo systemctl restart docker`"
)


def parse_driver_version(text: str) -> Optional[str]:
    """The kernel module's version from ``/proc/driver/nvidia/version``, e.g. ``580.159.04``; None when absent."""
    match = _NVRM_VERSION.search(text)
    return match.group(1) if match else None


def version_key(version: str) -> Tuple[int, ...]:
    """``580.65.06`` → ``(580, 65, 6)``: driver versions compare field by field as numbers."""
    return tuple(int(part) for part in version.split("."))


def _wanted(stack: Mapping[str, str]) -> str:
    return f">= {stack['CUDA_MIN_DRIVER']} (CUDA {stack['CUDA_RUNTIME_VERSION']} in the image)"


def check_driver_version(root: Path, stack: Mapping[str, str]) -> Check:
    """The loaded kernel driver against ``CUDA_MIN_DRIVER``: an older one cannot run the image's CUDA runtime."""
    root = Path(root)
    name = "nvidia driver"
    minimum, runtime = stack["CUDA_MIN_DRIVER"], stack["CUDA_RUNTIME_VERSION"]
    try:
        text = (root / DRIVER_VERSION_FILE).read_text()
    except OSError:
        if (root / NVIDIA).exists():
            state = "reports no version" if module_loaded(root, "nvidia") else "is not loaded"
            return fail(
                name,
                f"/{NVIDIA} exists but /{DRIVER_VERSION_FILE} does not: the nvidia kernel module {state}",
                f"sudo modprobe nvidia (see `dmesg | grep NVRM`); if that fails, reinstall the NVIDIA driver {_wanted(stack)}",
            )
        return fail(
            name,
            f"no NVIDIA driver (no /{DRIVER_VERSION_FILE}, no /{NVIDIA})",
            f"install the NVIDIA driver {_wanted(stack)}, or use --flavor cpu",
        )
    version = parse_driver_version(text)
    if version is None:
        first = (text.splitlines() or [""])[0][:120]
        return warn(
            name,
            f"no driver version in /{DRIVER_VERSION_FILE} ({first!r})",
            f"check `nvidia-smi`: the cuda image needs the NVIDIA driver {_wanted(stack)}",
        )
    if version_key(version) < version_key(minimum):
        return fail(
            name,
            f"driver {version} is older than {minimum}, the oldest that runs CUDA {runtime} (the cuda image's runtime)",
            f"upgrade the NVIDIA driver to {_wanted(stack)}",
        )
    return ok(name, f"driver {version} runs CUDA {runtime} (needs >= {minimum})")


def _shown(root: Path, path: Path) -> str:
    return f"/{path.relative_to(root)}"


def toolkit_files(root: Path) -> List[Path]:
    """The NVIDIA Container Toolkit's binaries in the usual bin directories, then its runtime config, under ``root``."""
    root = Path(root)
    found = [root / directory / binary for binary in TOOLKIT_BINARIES for directory in BIN_DIRS]
    found.append(root / TOOLKIT_CONFIG)
    return [path for path in found if path.is_file()]


def check_toolkit(root: Path) -> Check:
    """Whether the NVIDIA Container Toolkit is installed: without it no container sees the GPU or libcuda."""
    root = Path(root)
    files = toolkit_files(root)
    if not files:
        dirs = ", ".join(f"/{d}" for d in BIN_DIRS)
        return fail(
            "nvidia container toolkit",
            f"none of {', '.join(TOOLKIT_BINARIES)} in {dirs}, and no /{TOOLKIT_CONFIG}",
            TOOLKIT_FIX,
        )
    return ok("nvidia container toolkit", "found " + ", ".join(_shown(root, path) for path in files))


def cdi_gpu_specs(root: Path) -> List[Path]:
    """CDI spec files under ``root`` that define devices of kind ``nvidia.com/gpu``."""
    specs = []
    for directory in CDI_DIRS:
        base = Path(root) / directory
        for path in sorted(base.glob("*")) if base.is_dir() else []:
            try:
                if path.suffix in CDI_SUFFIXES and _CDI_GPU_KIND.search(path.read_text()):
                    specs.append(path)
            except (OSError, UnicodeDecodeError):
                continue
    return specs


def gpu_mechanism(runtimes: Iterable[str], root: Path) -> Optional[str]:
    """How the Docker Engine can give a container NVIDIA GPUs, in words; None when it cannot.

    ``runtimes``: the daemon's configured runtimes (``docker info``'s ``Runtimes``).
    Any one suffices: the ``nvidia`` runtime, Docker's built-in ``--gpus``
    support (which needs ``nvidia-container-runtime-hook`` on the daemon's
    PATH), or a CDI spec for ``nvidia.com/gpu``.
    """
    root = Path(root)
    names = sorted(runtimes)
    if "nvidia" in names:
        return f"the daemon has the nvidia runtime (runtimes: {', '.join(names)})"
    hooks = [root / directory / HOOK for directory in BIN_DIRS if (root / directory / HOOK).is_file()]
    if hooks:
        return f"Docker's --gpus support runs {_shown(root, hooks[0])}"
    specs = cdi_gpu_specs(root)
    if specs:
        return f"CDI spec {_shown(root, specs[0])} defines nvidia.com/gpu devices"
    return None


def check_docker_gpus(runtimes: Iterable[str], root: Path) -> Check:
    """Whether containers started by this Docker Engine can be handed the NVIDIA GPUs."""
    names = sorted(runtimes)
    mechanism = gpu_mechanism(names, root)
    if mechanism is None:
        return fail(
            "docker gpus",
            f"the Docker Engine cannot hand out NVIDIA GPUs: no nvidia runtime (runtimes: {', '.join(names) or 'none'}),"
            f" no {HOOK}, no CDI spec for nvidia.com/gpu",
            TOOLKIT_FIX,
        )
    return ok("docker gpus", mechanism)


def check_host(root: Path, flavor: str, stack: Mapping[str, str]) -> List[Check]:
    """Driver version and toolkit for the cuda flavor; one "n/a" line for the others, which never use them."""
    if flavor != "cuda":
        return [
            not_applicable(
                "nvidia runtime", f"not checked for the {flavor} flavor (`--flavor cuda` checks the NVIDIA driver and toolkit)"
            )
        ]
    return [check_driver_version(root, stack), check_toolkit(root)]
