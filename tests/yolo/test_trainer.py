"""The trainer's AMP detour: Ultralytics' own check (a download) never runs; trainbox's offline check decides.

No GPU here: the device probe's check is monkeypatched to pass, as it would on a CUDA GPU, and the trainer's
setup runs for real on the CPU up to the first batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import yaml

from trainbox.yolo import profiles
from trainbox.yolo.settings import from_profile


@pytest.fixture()
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")  # the CPU here
def test_amp_is_switched_on_by_the_offline_check_never_by_ultralytics(
    demo_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_threads: None
) -> None:
    import ultralytics.engine.trainer

    from trainbox.yolo import device_probe
    from trainbox.yolo.trainer import ProfiledDetectionTrainer

    def refuse(model: Any) -> bool:
        raise AssertionError("Ultralytics' check_amp ran: it downloads yolo26n.pt")

    checked = []

    def passes(model: torch.nn.Module, device: torch.device) -> tuple:
        checked.append(device.type)
        return True, "the model's float16 and float32 outputs agree (recorded)"

    monkeypatch.setattr(ultralytics.engine.trainer, "check_amp", refuse)
    monkeypatch.setattr(device_probe, "amp_check", passes)
    overrides = {"model": "yolov8n.yaml", "data": str(demo_data), "imgsz": 64, "batch": 8, "device": "cpu", "plots": False}
    overrides.update(project=str(tmp_path), name="train", exist_ok=True)
    settings = from_profile(profiles.load("safe"), {"amp": True}, 60.0)
    trainer = ProfiledDetectionTrainer(overrides=overrides, settings=settings)
    assert trainer.settings.amp is True and trainer.args.amp is False, "Ultralytics' setup must see amp=False"

    trainer._setup_train()

    assert checked == ["cpu"]
    assert trainer.amp is True and trainer.args.amp is True
    assert yaml.safe_load((tmp_path / "train" / "args.yaml").read_text())["amp"] is True
