"""AMP, workers and pinned memory decided per device: CPU, CUDA GPUs, and AMD parts from the doctor's recorded hosts."""

from __future__ import annotations

import inspect

import pytest

from tests.paths import FIXTURES
from trainbox.system import kfd
from trainbox.yolo.device_defaults import AMP_BROKEN_GPUS, AUTO, Device, decide, decide_amp, decide_workers

HOSTS = FIXTURES / "hosts"

CPU = Device("cpu", "CPU", cpu_count=2)
H100 = Device("cuda", "NVIDIA H100 80GB HBM3", cpu_count=16, capability=(9, 0))


def _amd(host: str, cpu_count: int = 16) -> Device:
    """The first GPU of a recorded host, as the training process describes it under the image's HSA override."""
    node = kfd.gpu_nodes(HOSTS / host)[0]
    return Device("rocm", "AMD Radeon", cpu_count, arch=node.arch, reported_arch="gfx1030")


def test_cpu_trains_in_fp32_with_four_workers_and_no_pinning() -> None:
    chosen = decide(CPU, AUTO, AUTO, batch=8)
    assert (chosen.amp.value, chosen.workers.value, chosen.pin_memory.value) == (False, 4, False)
    assert "Ultralytics never uses AMP" in chosen.amp.reason


def test_cuda_gpu_with_tensor_cores_gets_amp_eight_workers_and_pinned_memory() -> None:
    chosen = decide(H100, AUTO, AUTO, batch=64)
    assert (chosen.amp.value, chosen.workers.value, chosen.pin_memory.value) == (True, 8, True)
    assert "offline check" in chosen.amp.reason
    assert chosen.workers.reason == "GPU: min(8, 16 cores, batch 64), at least 4"


@pytest.mark.parametrize(
    "cores, batch, workers",
    [(16, 64, 8), (6, 64, 6), (16, 5, 5), (2, 64, 4), (16, 2, 4), (16, -1, 8), (16, 0.7, 8)],
)
def test_auto_workers_on_a_gpu_is_min_of_eight_cores_and_batch_never_below_four(cores: int, batch: object, workers: int) -> None:
    device = Device("cuda", "NVIDIA H100 80GB HBM3", cpu_count=cores, capability=(9, 0))
    assert decide_workers(device, AUTO, batch).value == workers


@pytest.mark.parametrize(
    "name, capability, words",
    [
        ("NVIDIA GeForce GTX 1660 SUPER", (7, 5), "Ultralytics' check_amp list"),
        ("NVIDIA T1000 8GB", (7, 5), "Ultralytics' check_amp list"),
        ("Tesla P100-PCIE-16GB", (6, 0), "no tensor cores"),
        ("NVIDIA GeForce GTX 1080 Ti", (6, 1), "no tensor cores"),
    ],
)
def test_cuda_gpus_where_amp_does_not_pay_or_breaks_stay_fp32(name: str, capability: tuple, words: str) -> None:
    chosen = decide_amp(Device("cuda", name, 8, capability=capability), AUTO)
    assert chosen.value is False and words in chosen.reason


def test_rtx_card_with_tensor_cores_gets_amp() -> None:
    assert decide_amp(Device("cuda", "NVIDIA GeForce RTX 2080 Ti", 8, capability=(7, 5)), AUTO).value is True


@pytest.mark.parametrize("host", ["rx5600xt", "rx5700xt"])
def test_rdna1_gpu_from_the_doctors_fixtures_stays_fp32(host: str) -> None:
    device = _amd(host)
    assert device.arch == "gfx1010"
    chosen = decide(device, AUTO, AUTO, batch=16)
    assert chosen.amp.value is False and "RDNA 1" in chosen.amp.reason and "ROCm/ROCm #1857" in chosen.amp.reason
    assert (chosen.workers.value, chosen.pin_memory.value) == (8, True)
    assert "gfx1010, reported as gfx1030" in chosen.record()["description"]


def test_rdna2_gpu_gets_amp_subject_to_the_offline_check() -> None:
    device = _amd("rx6800xt")
    assert device.arch == "gfx1030"
    assert decide_amp(device, AUTO).value is True


def test_rocm_gpu_of_unknown_real_arch_stays_fp32() -> None:
    chosen = decide_amp(Device("rocm", "AMD Radeon", 8, arch=None, reported_arch="gfx1030"), AUTO)
    assert chosen.value is False and "unknown" in chosen.reason


@pytest.mark.parametrize(
    "device, given, expected",
    [
        (_amd("rx5600xt"), True, True),
        (_amd("rx5600xt"), "fp16", True),
        (H100, False, False),
        (H100, "fp32", False),
        (H100, "bf16", "bf16"),
        (CPU, True, True),
    ],
)
def test_an_explicit_amp_wins_over_the_device_rules(device: Device, given: object, expected: object) -> None:
    chosen = decide_amp(device, given)  # type: ignore[arg-type]
    assert chosen.value == expected and chosen.reason.startswith(f"amp={expected}, not auto")


def test_explicit_workers_win_on_every_device() -> None:
    for device in (CPU, H100, _amd("rx5600xt")):
        assert decide_workers(device, 2, batch=64).value == 2


def test_the_record_carries_the_device_and_every_decision_with_its_reason() -> None:
    record = decide(H100, AUTO, AUTO, batch=64).record(amp=True, amp_check="agree")
    assert record["kind"] == "cuda" and record["capability"] == (9, 0) and "arch" not in record
    assert record["description"] == "NVIDIA H100 80GB HBM3 (CUDA, compute capability 9.0)"
    assert {key for key in record if key.endswith("_reason")} == {"amp_reason", "workers_reason", "pin_memory_reason"}
    assert record["amp_check"] == "agree"


def test_the_amp_broken_list_is_still_ultralytics_own() -> None:
    from ultralytics.utils.checks import check_amp

    source = inspect.getsource(check_amp).lower()
    assert all(name in source for name in AMP_BROKEN_GPUS), "Ultralytics' check_amp list changed: update AMP_BROKEN_GPUS"


def test_a_profiles_cuda_workers_apply_on_nvidia_gpus_only() -> None:
    """The safer rungs keep workers enough to feed an NVIDIA GPU; the CPU and ROCm keep the profile's own."""
    rx5600 = Device("rocm", "AMD Radeon RX 5600 XT", 12, arch="gfx1010", reported_arch="gfx1030")
    assert decide(H100, False, 0, batch=64, cuda_workers=AUTO).workers.value == 8
    assert "cuda_workers" in decide(H100, False, 0, batch=64, cuda_workers=AUTO).workers.reason
    assert decide(rx5600, False, 0, batch=64, cuda_workers=AUTO).workers.value == 0
    assert decide(CPU, False, 2, batch=64, cuda_workers=AUTO).workers.value == 2
    assert decide(H100, False, 2, batch=64).workers.value == 2
