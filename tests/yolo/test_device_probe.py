"""The device as the training process finds it (recorded torch.cuda properties, the doctor's KFD fixtures), and the
offline AMP check on a real model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, Optional

import pytest
import torch

from tests.paths import FIXTURES
from trainbox.yolo import device_probe

HOSTS = FIXTURES / "hosts"
OVERRIDE = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}


def _torch(props: Dict[str, Any], hip: Optional[str] = None, cuda: Optional[str] = "13.2") -> Any:
    """A torch module as far as ``describe`` reads it, answering with recorded device properties."""
    return SimpleNamespace(
        version=SimpleNamespace(hip=hip, cuda=None if hip else cuda),
        cuda=SimpleNamespace(get_device_properties=lambda index: SimpleNamespace(**props)),
    )


#: torch.cuda.get_device_properties(0) on the H100 of issue 16 (the fields describe reads).
H100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multi_processor_count": 132}
#: The same on torch 1.13.1+rocm5.2 with the image's override: HIP reports gfx1030 as 10.3, no gcnArchName yet.
RX5600XT = {"name": "AMD Radeon RX 5600 XT", "major": 10, "minor": 3, "multi_processor_count": 18}


def test_cpu_device() -> None:
    device = device_probe.describe(torch.device("cpu"))
    assert device.kind == "cpu" and device.cpu_count == device_probe.cpu_count() >= 1


def test_cuda_device_from_recorded_properties() -> None:
    device = device_probe.describe(torch.device("cuda:0"), _torch(H100), environ={}, root=HOSTS / "nvidia")
    assert (device.kind, device.name, device.capability, device.arch) == ("cuda", H100["name"], (9, 0), None)


def test_gfx1010_is_found_under_the_override_that_makes_it_report_gfx1030() -> None:
    device = device_probe.describe(torch.device("cuda"), _torch(RX5600XT, hip="5.2.21151"), OVERRIDE, HOSTS / "rx5600xt")
    assert (device.kind, device.arch, device.reported_arch) == ("rocm", "gfx1010", "gfx1030")


def test_gcn_arch_name_of_newer_torch_is_the_reported_arch_only() -> None:
    props = dict(RX5600XT, gcnArchName="gfx1030:sramecc-:xnack-")
    device = device_probe.describe(torch.device("cuda"), _torch(props, hip="6.2"), OVERRIDE, HOSTS / "rx5600xt")
    assert (device.arch, device.reported_arch) == ("gfx1010", "gfx1030")


@pytest.mark.parametrize(
    "environ, root, arch",
    [
        ({**OVERRIDE, "ROCR_VISIBLE_DEVICES": "0"}, "rx5600xt", "gfx1010"),
        ({**OVERRIDE, "HIP_VISIBLE_DEVICES": "1"}, "rx5600xt", None),  # device 1 of a one-GPU host: unknown
        (OVERRIDE, "no-gpu", None),  # no topology, and the override hides the real arch
        ({}, "no-gpu", "gfx1030"),  # no topology, no override: what HIP reports is real
        ({}, "rx6800xt", "gfx1030"),
    ],
)
def test_real_arch_follows_visible_devices_and_needs_the_topology_under_an_override(
    environ: Dict[str, str], root: str, arch: Optional[str]
) -> None:
    assert device_probe.rocm_arch(0, "gfx1030", environ, HOSTS / root) == arch


def test_fp32_and_autocast_outputs_of_a_real_yolo_model_agree() -> None:
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", verbose=False)
    passed, reason = device_probe.outputs_agree(model, torch.device("cpu"), torch.bfloat16)  # CPU autocast is bf16
    assert passed, reason
    assert model.training, "the training model keeps its mode (the check runs on a copy)"


class BreaksUnderAutocast(torch.nn.Module):
    """A convolution whose reduced-precision result comes out wrong, as broken FP16 kernels' do."""

    def __init__(self, wrong: float) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.wrong = wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y if y.dtype == torch.float32 else y + self.wrong  # autocast computed it in reduced precision


@pytest.mark.parametrize("wrong, words", [(float("nan"), "NaN or inf"), (2.0, "outputs differ by up to 2")])
def test_wrong_or_non_finite_autocast_output_fails_the_check(wrong: float, words: str) -> None:
    passed, reason = device_probe.outputs_agree(BreaksUnderAutocast(wrong), torch.device("cpu"), torch.bfloat16)
    assert not passed and words in reason, reason


def test_amp_is_never_checked_or_used_off_the_gpu() -> None:
    passed, reason = device_probe.amp_check(torch.nn.Identity(), torch.device("cpu"))
    assert not passed and reason == "cpu: AMP runs on a GPU only"
