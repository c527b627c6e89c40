"""What the training process finds at run time: the device, described for :mod:`trainbox.yolo.device_defaults`,
and the offline AMP check.

Training process only (imports torch). The device is the one Ultralytics
selected (``trainer.device``). On ROCm torch calls the GPU ``cuda`` too;
``torch.version.hip`` tells them apart. Its real arch comes from the KFD
topology (``trainbox.system.kfd``, the doctor's reader), in the order HIP
numbers devices, narrowed by ``ROCR_VISIBLE_DEVICES`` and then
``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` when they list indices:
under ``HSA_OVERRIDE_GFX_VERSION=10.3.0`` an RX 5600 XT (gfx1010) reports
gfx1030 through HIP, torch and ``gcnArchName``, but its topology node keeps
``gfx_target_version 100100``. Without a readable topology the arch is what
HIP reports, unless an override is set (then it is unknown, and AMP stays off).

The AMP check replaces Ultralytics' ``check_amp``, which downloads
``yolo26n.pt`` to compare FP32 and AMP detections on ``bus.jpg``. Here the
model being trained is copied and run on a fixed random image, in FP32 and
under FP16 autocast: AMP passes when the outputs are finite and agree within
Ultralytics' tolerance of 0.5 (pixels, for the boxes), plus 1 % of each value.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, List, Mapping, Optional, Tuple

import torch

from trainbox.system import kfd
from trainbox.yolo.device_defaults import Device

#: The AMP check's input: Ultralytics' check uses max(256, 4 x the largest stride) px and a batch of 8 (2 suffice).
AMP_CHECK_IMGSZ = 256
AMP_CHECK_BATCH = 2
#: Ultralytics' check_amp tolerance (absolute, pixels), and a relative one for large box coordinates.
AMP_ATOL = 0.5
AMP_RTOL = 0.01
#: Device-selection variables that narrow HIP's device list, in the order they apply.
VISIBLE_DEVICES_ENVS = (("ROCR_VISIBLE_DEVICES",), ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))


def cpu_count() -> int:
    """Cores this process may run on (a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _visible(nodes: List[kfd.GpuNode], environ: Mapping[str, str]) -> List[kfd.GpuNode]:
    for names in VISIBLE_DEVICES_ENVS:
        value = next((environ[name] for name in names if environ.get(name)), None)
        if value is None:
            continue
        indices = [part.strip() for part in value.split(",")]
        if not all(part.isdigit() for part in indices):
            return []  # UUIDs: not matched to topology nodes here
        nodes = [nodes[int(i)] for i in indices if int(i) < len(nodes)]
    return nodes


def rocm_arch(index: int, reported: Optional[str], environ: Mapping[str, str], root: Path = Path("/")) -> Optional[str]:
    """The real gfx arch of HIP device ``index``; see the module docstring for where it comes from."""
    nodes = _visible(kfd.gpu_nodes(root), environ)
    if index < len(nodes):
        return nodes[index].arch
    return None if environ.get(kfd.OVERRIDE_ENV) else reported


def describe(
    device: Any, torch_module: Any = torch, environ: Optional[Mapping[str, str]] = None, root: Path = Path("/")
) -> Device:
    """``device`` (a ``torch.device``) as a :class:`Device`; ``torch_module`` and ``root`` are seams for recorded devices."""
    environ = os.environ if environ is None else environ
    cores = cpu_count()
    if device.type != "cuda":
        return Device("cpu", "CPU", cores)
    index = device.index or 0
    props = torch_module.cuda.get_device_properties(index)
    if getattr(torch_module.version, "hip", None):
        reported = getattr(props, "gcnArchName", "").split(":")[0] or None
        if reported is None and environ.get(kfd.OVERRIDE_ENV):
            reported = kfd.override_arch(environ[kfd.OVERRIDE_ENV])
        return Device("rocm", props.name, cores, arch=rocm_arch(index, reported, environ, root), reported_arch=reported)
    return Device("cuda", props.name, cores, capability=(props.major, props.minor))


def _first_tensor(output: Any) -> torch.Tensor:
    """The prediction tensor of a model's eval output (Ultralytics' heads return a tuple or dict around it)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output
    return _first_tensor(next(iter(values)))


def outputs_agree(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> Tuple[bool, str]:
    """Whether a copy of ``model`` gives the same output in FP32 and under ``dtype`` autocast on ``device``."""
    probe = copy.deepcopy(model).to(device).eval()  # the training model keeps its mode and buffers
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(AMP_CHECK_BATCH, 3, AMP_CHECK_IMGSZ, AMP_CHECK_IMGSZ, generator=generator).to(device)
    with torch.no_grad():
        reference = _first_tensor(probe(image)).float()
        with torch.autocast(device.type, dtype=dtype):
            mixed = _first_tensor(probe(image)).float()
    del probe
    precision = str(dtype).replace("torch.", "")
    if not bool(torch.isfinite(mixed).all()):
        return False, f"the model's {precision} output has NaN or inf values"
    worst = float((mixed - reference).abs().max())
    if not torch.allclose(mixed, reference, rtol=AMP_RTOL, atol=AMP_ATOL):
        return False, f"the model's {precision} and float32 outputs differ by up to {worst:.3g}"
    return True, f"the model's {precision} and float32 outputs agree (largest difference {worst:.3g})"


def amp_check(model: torch.nn.Module, device: torch.device) -> Tuple[bool, str]:
    """The offline AMP check (FP16 autocast); off wherever Ultralytics would not use AMP (CPU, MPS)."""
    if device.type != "cuda":
        return False, f"{device.type}: AMP runs on a GPU only"
    return outputs_agree(model, device, torch.float16)


def grad_scaler(enabled: bool) -> Any:
    """The CUDA gradient scaler in the spelling this torch has (``torch.amp`` from 2.3, else ``torch.cuda.amp``)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)
