"""Per-device defaults: mixed precision, DataLoader workers and pinned memory for the device a run trains on.

Pure (no torch): it takes a :class:`Device` described by
:mod:`trainbox.yolo.device_probe` in the training process, at run time, and
returns each decision with the reason for it. A profile's ``amp: auto`` and
``workers: auto`` are resolved here; an explicit value (the profile's number,
or ``amp=``/``workers=`` given on the command line) is kept as given.

AMP (``amp: auto``):

* CPU: off. Ultralytics never uses AMP there (its ``check_amp`` returns False).
* ROCm, RDNA 1 (``gfx101x``: RX 5500/5600/5700): off. FP16 is broken on these
  parts (ROCm/ROCm #1857). The arch is the *real* one from the KFD topology:
  with ``HSA_OVERRIDE_GFX_VERSION=10.3.0`` HIP and torch report gfx1030. An arch
  that cannot be found (override set, no topology readable) is off too.
* CUDA, a GPU that Ultralytics' ``check_amp`` lists as producing NaN losses or
  zero mAP under AMP (GTX 16xx, T400–T2000, K40m; :data:`AMP_BROKEN_GPUS`): off.
* CUDA below compute capability 7.0 (no tensor cores): off; FP16 autocast
  gains no speed there, and these are the cards the check above is about.
* Any other GPU: on, *if* the offline check passes when the model is on the
  device (``device_probe.amp_check``: the model's FP32 and FP16-autocast outputs
  agree). Ultralytics' own check downloads ``yolo26n.pt`` and is never run.

``amp=True``/``fp16`` given explicitly wins over the device rules above but
still gets the offline check (as Ultralytics' ``amp=True`` gets its own check);
``bf16`` and ``False``/``fp32`` are passed to Ultralytics as given.

Workers (``workers: auto``): on a GPU, ``min(8, CPU cores, batch)`` — 8 is
Ultralytics' default, more processes than cores only compete, more than the
images of a batch only queue — but never below 4, what ``fast`` has always
used, so every rung of a fallback ladder stays strictly safer than ``auto``
(``balanced`` has 2). On the CPU, 4: what the profiles meant before ``auto``
(the training process competes with its workers for the same cores).

A profile's ``cuda_workers`` replaces ``workers`` on an NVIDIA GPU (resolved by the same rules): the safer rungs
keep enough spawn-started workers to feed a fast NVIDIA GPU (with 0 or 2 an H100 trained at a tenth of bare
Ultralytics' speed, ``bench/results/gpu.md``), while on the CPU and on ROCm, where seed 001's RX 5600 XT (gfx1010)
lost only 19 % with ``workers=0``, they keep their own ``workers``.

Pinned memory: on for a GPU (page-locked batches let the copy to the device
run asynchronously, ``non_blocking``, as Ultralytics does whenever it sees a
GPU), off on the CPU (nothing is copied).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from trainbox.yolo.profiles import AUTO

#: ``workers: auto``: the least it resolves to (``fast``'s number before ``auto``; also the CPU's).
AUTO_WORKERS_MIN = 4
#: ``workers: auto`` on a GPU: the most (Ultralytics' default ``workers``).
AUTO_WORKERS_MAX = 8
#: Names in ``ultralytics.utils.checks.check_amp``'s list of GPUs whose AMP training gives NaN losses or
#: zero mAP (Ultralytics 8.4.190; a test checks that its source still names each one).
AMP_BROKEN_GPUS = ("1660", "1650", "1630", "t400", "t550", "t600", "t1000", "t1200", "t2000", "k40m")
AMP_BROKEN_VENDORS = ("nvidia", "geforce", "quadro", "tesla")
#: First compute capability with tensor cores (Volta).
TENSOR_CORES = (7, 0)
#: RDNA 1 archs (gfx1010, gfx1011, gfx1012): FP16 is broken there with ROCm (ROCm/ROCm #1857).
RDNA1_PREFIX = "gfx101"

AmpValue = Union[bool, str]


@dataclasses.dataclass(frozen=True)
class Device:
    """The device training runs on, as the training process found it."""

    #: ``cpu``, ``cuda`` (NVIDIA) or ``rocm`` (AMD, which torch also calls ``cuda``).
    kind: str
    name: str
    #: CPU cores this process may use (its affinity).
    cpu_count: int
    #: CUDA: compute capability (major, minor).
    capability: Optional[Tuple[int, int]] = None
    #: ROCm: the real gfx arch (KFD topology), not the one an HSA override makes HIP report.
    arch: Optional[str] = None
    #: ROCm: the arch HIP reports (``gcnArchName``, or the override's), when it differs from ``arch``.
    reported_arch: Optional[str] = None

    @property
    def gpu(self) -> bool:
        return self.kind != "cpu"

    def describe(self) -> str:
        if self.kind == "cuda" and self.capability:
            return f"{self.name} (CUDA, compute capability {self.capability[0]}.{self.capability[1]})"
        if self.kind == "rocm":
            shown = self.arch or "arch unknown"
            if self.reported_arch and self.reported_arch != self.arch:
                shown += f", reported as {self.reported_arch}"
            return f"{self.name} (ROCm, {shown})"
        return f"CPU ({self.cpu_count} cores)"


@dataclasses.dataclass(frozen=True)
class Choice:
    value: Any
    reason: str


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """The decisions for one device; :meth:`record` is what the ``device`` event carries."""

    device: Device
    amp: Choice
    workers: Choice
    pin_memory: Choice

    def record(self, **extra: Any) -> Dict[str, Any]:
        fields = {key: value for key, value in dataclasses.asdict(self.device).items() if value is not None}
        fields["description"] = self.device.describe()
        for name in ("amp", "workers", "pin_memory"):
            choice: Choice = getattr(self, name)
            fields[name], fields[f"{name}_reason"] = choice.value, choice.reason
        fields.update(extra)
        return fields


def normalized_amp(value: AmpValue) -> AmpValue:
    """Ultralytics' spellings folded: ``fp16`` is True, ``fp32`` is False; ``auto`` and ``bf16`` stay."""
    if isinstance(value, str) and value.lower() in ("fp16", "fp32"):
        return value.lower() == "fp16"
    return value


def _amp_broken_by_name(name: str) -> bool:
    lowered = name.lower()
    return any(vendor in lowered for vendor in AMP_BROKEN_VENDORS) and any(gpu in lowered for gpu in AMP_BROKEN_GPUS)


def decide_amp(device: Device, wanted: AmpValue) -> Choice:
    """AMP for ``device``: ``wanted`` as given unless it is ``auto`` (see the module docstring)."""
    wanted = normalized_amp(wanted)
    if wanted != AUTO:
        check = " (fp16: checked offline once the model is on the device)" if wanted is True else ""
        return Choice(wanted, f"amp={wanted}, not auto{check}")
    if not device.gpu:
        return Choice(False, "CPU: Ultralytics never uses AMP there")
    if device.kind == "rocm":
        if device.arch is None:
            return Choice(False, "ROCm GPU whose real arch is unknown (HSA override set, no KFD topology): FP32 to be safe")
        if device.arch.startswith(RDNA1_PREFIX):
            return Choice(False, f"{device.arch} is RDNA 1: FP16 is broken there (ROCm/ROCm #1857)")
        return Choice(True, f"{device.arch}: FP16 autocast, if the offline check passes")
    if _amp_broken_by_name(device.name):
        return Choice(False, f"{device.name}: AMP gives NaN losses or zero mAP on it (Ultralytics' check_amp list)")
    if device.capability is not None and device.capability < TENSOR_CORES:
        major, minor = device.capability
        return Choice(False, f"compute capability {major}.{minor}: no tensor cores, FP16 autocast gains nothing")
    return Choice(True, "tensor cores: FP16 autocast, if the offline check passes")


def _batch_images(batch: Any) -> Optional[int]:
    """Images per batch, when ``batch`` says it (-1 and fractions let Ultralytics' AutoBatch choose)."""
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1 else None


def decide_workers(device: Device, wanted: Union[int, str], batch: Any, cuda_wanted: Optional[Union[int, str]] = None) -> Choice:
    """DataLoader workers for ``device``: ``wanted`` (on an NVIDIA GPU ``cuda_wanted``, when given) as given unless it
    is ``auto`` (see the module docstring)."""
    if device.kind == "cuda" and cuda_wanted is not None:
        chosen = decide_workers(device, cuda_wanted, batch)
        return Choice(chosen.value, f"NVIDIA GPU, the profile's cuda_workers: {chosen.reason}")
    if wanted != AUTO:
        return Choice(wanted, f"workers={wanted}, not auto")
    if not device.gpu:
        return Choice(AUTO_WORKERS_MIN, f"CPU: {AUTO_WORKERS_MIN}, the training process needs the cores too")
    limits = [AUTO_WORKERS_MAX, device.cpu_count]
    images = _batch_images(batch)
    if images is not None:
        limits.append(images)
    chosen = max(AUTO_WORKERS_MIN, min(limits))
    shown = f"min({AUTO_WORKERS_MAX}, {device.cpu_count} cores" + (f", batch {images})" if images is not None else ")")
    return Choice(chosen, f"GPU: {shown}, at least {AUTO_WORKERS_MIN}")


def decide_pin_memory(device: Device) -> Choice:
    if device.gpu:
        return Choice(True, "GPU: page-locked batches copy to it asynchronously")
    return Choice(False, "CPU: nothing is copied to a device")


def decide(
    device: Device, amp: AmpValue, workers: Union[int, str], batch: Any, cuda_workers: Optional[Union[int, str]] = None
) -> DeviceDefaults:
    """Every decision for ``device``, given the profile's (or the override's) ``amp`` and ``workers``, and the
    profile's ``cuda_workers`` (None: ``workers`` on every device)."""
    chosen = decide_workers(device, workers, batch, cuda_workers)
    return DeviceDefaults(device, decide_amp(device, amp), chosen, decide_pin_memory(device))
