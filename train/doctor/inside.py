"""``python -m trainbox doctor --inside``: what the training process in the image really loads and where it caches.

* which libMIOpen (ROCm) or libcudnn (CUDA) the process mapped, from
  ``/proc/self/maps`` after a convolution has run;
* whether the kdb MIOpen asks for (``<arch>_<multiprocessors>.kdb``) is in the
  directory that MIOpen reads system databases from
  (``$MIOPEN_SYSTEM_DB_PATH``, else ``<libdir>/../share/miopen/db``);
* where the user find-db and the compiled-kernel cache live
  (``$MIOPEN_USER_DB_PATH`` / ``$MIOPEN_CUSTOM_CACHE_DIR``, defaults under
  ``$HOME``) and whether they are on a mount that outlives the container;
* on CUDA: device 0's compute capability (and whether the torch build has
  kernels for it), the CUDA version torch was built with and cuDNN's;
  where torch.compile caches (``$TORCHINDUCTOR_CACHE_DIR``, else
  ``<tmp>/torchinductor_<user>``; ``$TRITON_CACHE_DIR``, else under the
  former) and whether that outlives the container;
* whether HIP/CUDA sees a device, and a tiny convolution timed cold, then warm.

The wheel's own MIOpen (embedded databases) never reads kdb files from disk
and keeps compiled kernels in memory only (../shared/notes/rocm-gfx1010.md);
the SONAME shown tells ROCm's ``libMIOpen.so.1`` from the wheel's copy.

On a CPU build of torch every GPU check reports "n/a" with the reason. torch
is imported inside the functions: the host-side ``python -m trainbox doctor``
imports this module's parent package without it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from trainbox.doctor import elf
from trainbox.doctor.mounts import MOUNTINFO, Mount, mount_of, parse_mountinfo
from trainbox.doctor.result import Check, fail, not_applicable, ok, warn
from trainbox.system import caches, kfd

PROC_MAPS = Path("/proc/self/maps")
CONV_LIBRARIES = {"rocm": "libMIOpen", "cuda": "libcudnn"}
VOLUME_FIX = "mount a volume there (compose's rocm service mounts miopen-db and miopen-kernels); restarts recompile otherwise"
COMPILE_CACHE_FIX = (
    "mount a volume there (compose's cuda service mounts torch-inductor and torch-triton on $TORCHINDUCTOR_CACHE_DIR"
    " and $TRITON_CACHE_DIR, env/cuda.env); torch.compile recompiles at every start otherwise"
)
#: ``sm_90`` (a cubin: runs on 9.x from 9.0 up), ``sm_90a`` (only on 9.0), ``compute_90`` (PTX: JIT-compiled on 9.0 and newer).
_CUDA_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


@dataclass(frozen=True)
class CudaDevice:
    """What torch says about CUDA device 0 and the CUDA libraries it was built with."""

    name: str
    capability: Tuple[int, int]
    #: ``torch.version.cuda``, e.g. ``13.2``.
    cuda: str
    #: ``torch.backends.cudnn.version()``: None when torch has no usable cuDNN.
    cudnn: Optional[int]
    #: ``torch.cuda.get_arch_list()``, e.g. ``sm_90``, ``compute_120``.
    arch_list: Tuple[str, ...]


def loaded_libraries(maps_text: str, stem: str) -> List[str]:
    """Distinct paths of mapped files whose name starts with ``stem`` (e.g. ``libMIOpen``), in map order."""
    found: List[str] = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and Path(fields[5]).name.startswith(stem) and fields[5] not in found:
            found.append(fields[5])
    return found


def system_db_dir(library: Path, environ: Mapping[str, str]) -> Path:
    """Where a non-embedded MIOpen reads .kdb files (MIOpen db_path.cpp)."""
    configured = environ.get("MIOPEN_SYSTEM_DB_PATH")
    return Path(configured) if configured else Path(library).parent.parent / "share" / "miopen" / "db"


def check_kdb(library: Path, kdb: str, environ: Mapping[str, str]) -> Check:
    """Whether ``<kdb>.kdb`` is where ``library`` looks for system databases."""
    directory = system_db_dir(library, environ)
    path = directory / f"{kdb}.kdb"
    if path.is_file():
        target = f" -> {path.resolve().name}" if path.is_symlink() else ""
        return ok("miopen kdb", f"{path}{target} ({path.stat().st_size // 1024} KiB)")
    present = sorted(p.name for p in directory.glob("*.kdb")) if directory.is_dir() else []
    return fail(
        "miopen kdb",
        f"MIOpen asks for {path}, missing (there: {', '.join(present) or 'nothing'}): kernels compile at the first batch",
        f"add {kdb} to MIOPEN_KDB_ALIASES in env/stack.env and rebuild (`invoke build --flavor rocm`)"
        if present
        else "set MIOPEN_SYSTEM_DB_PATH to the image's kdb directory (env/gfx1010.env)",
    )


def check_cache_dir(name: str, directory: Path, mounts: List[Mount], fix: str = VOLUME_FIX) -> Check:
    """Whether ``directory`` is writable and on a mount that survives the container; ``fix`` says which volume to add."""
    mount = mount_of(str(directory), mounts)
    where = mount.describe() if mount else "no mount found in mountinfo"
    existing = next((p for p in [directory, *directory.parents] if p.exists()), Path("/"))
    if not os.access(existing, os.W_OK):
        return fail(name, f"{directory}: not writable ({existing} is read-only for this user)", fix)
    if mount is None or not mount.persistent:
        return fail(name, f"{directory}: {where}", fix)
    return ok(name, f"{directory}: {where}")


def check_compile_caches(environ: Mapping[str, str], user: str, mounts: List[Mount]) -> List[Check]:
    """Whether torch.compile's kernel caches outlive the container (else every start compiles again, minutes)."""
    inductor, triton = caches.compile_dirs(environ, user)
    return [
        check_cache_dir("inductor cache", inductor, mounts, COMPILE_CACHE_FIX),
        check_cache_dir("triton cache", triton, mounts, COMPILE_CACHE_FIX),
    ]


def cudnn_version_text(version: int) -> str:
    """``torch.backends.cudnn.version()`` as text: 91002 → 9.10.2 (cuDNN 9 packs major*10000), 8907 → 8.9.7 (major*1000)."""
    major, rest = divmod(version, 10000) if version >= 90000 else divmod(version, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def runs_on(capability: Tuple[int, int], arch_list: Sequence[str]) -> bool:
    """Whether a torch built for ``arch_list`` has kernels for a GPU of compute ``capability``.

    A cubin (``sm_XY``) runs on the same major from its minor up; an
    arch-specific one (``sm_90a``) only on exactly that capability; PTX
    (``compute_XY``) is JIT-compiled by the driver for that capability and newer.
    """
    for arch in arch_list:
        match = _CUDA_ARCH.fullmatch(arch)
        if match is None:
            continue
        kind, built, suffix = match.group(1), (int(match.group(2)), int(match.group(3))), match.group(4)
        if suffix == "a":
            fits = built == capability
        elif kind == "compute":
            fits = built <= capability
        else:
            fits = built[0] == capability[0] and built[1] <= capability[1]
        if fits:
            return True
    return False


def check_cuda(device: CudaDevice) -> Check:
    """Device 0's compute capability against the build's kernels, and the CUDA and cuDNN versions torch uses."""
    major, minor = device.capability
    shown = f"{device.name}, compute capability {major}.{minor} (sm_{major}{minor}), CUDA {device.cuda}"
    if not runs_on(device.capability, device.arch_list):
        return fail(
            "cuda",
            f"{shown}: this torch has kernels for {', '.join(device.arch_list) or 'no arch'} only",
            f"pin a torch with sm_{major}{minor} kernels (CUDA_TORCH_VERSION in env/stack.env), `invoke build --flavor cuda`",
        )
    if device.cudnn is None:
        return fail(
            "cuda",
            f"{shown}, no cuDNN: convolutions run on slow fallback kernels",
            "rebuild the image (`invoke build --flavor cuda`): torch needs the nvidia-cudnn wheel from cuda.lock",
        )
    return ok("cuda", f"{shown}, cuDNN {cudnn_version_text(device.cudnn)}")


def no_cuda_reason(hip: Optional[str], cuda: Optional[str]) -> str:
    """Why the CUDA checks do not apply, from ``torch.version.hip`` and ``torch.version.cuda`` (no CUDA device visible)."""
    if hip:
        return f"a ROCm build of torch (HIP {hip}), not CUDA"
    if cuda:
        return f"torch.cuda.is_available() is False (CUDA {cuda} build, no NVIDIA GPU visible)"
    return "a CPU build of torch (no CUDA)"


def cuda_device(torch: Any) -> CudaDevice:
    """The :class:`CudaDevice` of device 0, from torch (only with a visible CUDA device)."""
    props = torch.cuda.get_device_properties(0)
    return CudaDevice(
        name=props.name,
        capability=(props.major, props.minor),
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
        arch_list=tuple(torch.cuda.get_arch_list()),
    )


def _backend(torch: Any) -> Optional[str]:
    if getattr(torch.version, "hip", None):
        return "rocm"
    if getattr(torch.version, "cuda", None) and torch.cuda.is_available():
        return "cuda"
    return None


def _device_arch(torch: Any, environ: Mapping[str, str], root: Path) -> str:
    """The arch HIP reports for device 0: gcnArchName (newer torch), else the override, else the KFD topology."""
    name = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    if name:
        return name.split(":")[0]
    if environ.get(kfd.OVERRIDE_ENV):
        return kfd.override_arch(environ[kfd.OVERRIDE_ENV])
    nodes = kfd.gpu_nodes(root)
    return nodes[0].arch if nodes else "unknown"


def check_device(torch: Any, backend: Optional[str]) -> Check:
    build = f"torch {torch.__version__}"
    if backend is None:
        if getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None):
            return not_applicable("gpu", f"{build}: torch.cuda.is_available() is False; training runs on the CPU")
        return not_applicable("gpu", f"{build} is a CPU build; training runs on the CPU")
    if not torch.cuda.is_available():
        return fail(
            "gpu",
            f"{build} (HIP {torch.version.hip}) sees no device",
            "run `python -m trainbox doctor` on the host, then start the container with /dev/kfd, /dev/dri and the"
            " render/video GIDs (`invoke train` or compose's rocm service do)",
        )
    props = torch.cuda.get_device_properties(0)
    runtime = f"HIP {torch.version.hip}" if backend == "rocm" else f"CUDA {torch.version.cuda}"
    return ok(
        "gpu",
        f"{build} ({runtime}) sees {torch.cuda.device_count()} device(s); 0: {props.name},"
        f" {props.multi_processor_count} multiprocessors, {props.total_memory / 1024**3:.1f} GiB",
    )


def timed_convolution(torch: Any, device: str) -> Tuple[float, float]:
    """Seconds for a small conv forward+backward, first (cold: library load, kernel search/compile) then again (warm)."""
    conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(device)
    sample = torch.randn(2, 3, 64, 64, device=device)
    times = []
    for _ in range(2):
        started = time.perf_counter()
        conv(sample).sum().backward()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times[0], times[1]


def is_main_library(path: str, stem: str) -> bool:
    """``libcudnn.so.9`` or a wheel's renamed ``libcudnn-1a2b3c4d.so.9``, not a part of it such as ``libcudnn_ops.so.9``."""
    return re.fullmatch(rf"{re.escape(stem)}(-[0-9a-f]+)?\.so(\.[0-9.]+)?", Path(path).name) is not None


def check_library(maps_text: str, backend: Optional[str]) -> Tuple[Check, Optional[Path]]:
    """The convolution library mapped into this process; two copies of it (not cuDNN 9's sub-libraries) warn."""
    if backend is None:
        return not_applicable("conv library", "no GPU convolution library: convolutions run on the CPU"), None
    stem = CONV_LIBRARIES[backend]
    paths = loaded_libraries(maps_text, stem)
    if not paths:
        return fail(
            "conv library", f"no {stem} mapped after a GPU convolution", "check the torch build (`pip show torch`) in the image"
        ), None
    copies = [p for p in paths if is_main_library(p, stem)] or paths
    shown = ", ".join(f"{p} (SONAME {elf.soname(Path(p)) or 'none'})" for p in copies)
    parts = len(paths) - len(copies)
    if parts:
        shown += f", with {parts} more {stem}* libraries"
    if len(copies) > 1:
        return warn(
            "conv library", f"{len(copies)} copies mapped: {shown}", "rebuild the image; two copies mean two runtimes"
        ), Path(copies[0])
    return ok("conv library", shown), Path(copies[0])


def inside_checks(
    environ: Optional[Mapping[str, str]] = None,
    maps: Path = PROC_MAPS,
    mountinfo: Path = MOUNTINFO,
    root: Path = Path("/"),
) -> List[Check]:
    """Every inside check, in this process (imports torch and runs a convolution)."""
    import torch

    environ = os.environ if environ is None else environ
    backend = _backend(torch)
    checks = [check_device(torch, backend)]
    device = "cuda" if backend and torch.cuda.is_available() else "cpu"
    cold, warm = timed_convolution(torch, device)
    library_check, library = check_library(maps.read_text(), backend if device != "cpu" else None)
    checks.append(library_check)
    mounts = parse_mountinfo(mountinfo.read_text())
    if backend == "rocm" and library is not None:
        props = torch.cuda.get_device_properties(0)
        checks.append(check_kdb(library, f"{_device_arch(torch, environ, root)}_{props.multi_processor_count}", environ))
        user_db, cache = caches.miopen_dirs(environ)
        checks.append(check_cache_dir("miopen user db", user_db, mounts))
        checks.append(check_cache_dir("miopen kernel cache", cache, mounts))
        if environ.get("MIOPEN_DISABLE_CACHE", "0") not in ("0", ""):
            checks.append(
                warn(
                    "miopen kernel cache",
                    "MIOPEN_DISABLE_CACHE is set: compiled kernels are never kept",
                    "unset MIOPEN_DISABLE_CACHE",
                )
            )
    else:
        reason = "no MIOpen in this process (not a ROCm build on a visible GPU)"
        checks.append(not_applicable("miopen kdb", reason))
        checks.append(not_applicable("miopen caches", reason))
    if backend == "cuda":
        checks.append(check_cuda(cuda_device(torch)))
        checks.extend(check_compile_caches(environ, caches.user(environ), mounts))
    else:
        reason = no_cuda_reason(getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None))
        checks.append(not_applicable("cuda", reason))
        checks.append(not_applicable("torch.compile caches", reason))
    checks.append(ok("convolution", f"on {device}: cold {cold * 1000:.1f} ms, warm {warm * 1000:.1f} ms"))
    return checks
