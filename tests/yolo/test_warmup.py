"""Warm-up keys, cold/warm state and budgets, and a real warm-up of yolov8n on the CPU."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.hosts import host
from trainbox.yolo import kernels, warmup
from trainbox.yolo.demo_data import write_demo_dataset
from trainbox.yolo.warmup import CacheState


@pytest.fixture(scope="module")
def demo_yaml(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_demo_dataset(tmp_path_factory.mktemp("demo"), train=2, val=2, imgsz=64))


def _key(target: str = "gfx1030_18", batch: int = 16) -> warmup.WarmupKey:
    return warmup.WarmupKey(
        torch="1.13.1", target=target, model="yolov8n.yaml", nc=2, imgsz=640, batch=batch, conv_backend="miopen"
    )


def test_target_is_the_kdb_name_of_device_0() -> None:
    environ = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    assert warmup.miopen_target(host("rx5600xt"), environ) == "gfx1030_18"
    assert warmup.miopen_target(host("rx6800xt"), {}) == "gfx1030_36"
    assert warmup.miopen_target(host("no-gpu"), environ) == warmup.NO_TARGET


def test_run_key_from_overrides(demo_yaml: str) -> None:
    from trainbox.yolo.runner import DEFAULT_MODEL

    environ = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    key = warmup.run_key({"data": demo_yaml, "imgsz": 320}, root=host("rx5600xt"), environ=environ)
    assert (key.target, key.model, key.imgsz, key.batch, key.conv_backend) == ("gfx1030_18", DEFAULT_MODEL, 320, 16, "miopen")
    assert key.nc == 2
    native = warmup.run_key({"data": demo_yaml}, conv_backend="native", root=host("rx5600xt"), environ=environ)
    assert native.target == warmup.NO_TARGET and native.imgsz == 640
    with pytest.raises(ValueError, match="conv_backend"):
        warmup.run_key({}, conv_backend="cudnn")


def test_cold_until_a_warm_up_for_this_key(tmp_path: Path) -> None:
    key = _key()
    assert warmup.kernel_cache_state(key, tmp_path) is CacheState.COLD
    marker = warmup.write_marker(key, tmp_path / "kernels", {"train_first_s": 312.0})
    assert marker.parent == tmp_path / "kernels"
    assert json.loads(marker.read_text())["key"]["target"] == "gfx1030_18"
    assert warmup.kernel_cache_state(key, tmp_path / "kernels") is CacheState.WARM
    assert warmup.kernel_cache_state(replace(key, batch=8), tmp_path / "kernels") is CacheState.COLD
    assert warmup.kernel_cache_state(replace(key, torch="2.0.0"), tmp_path / "kernels") is CacheState.COLD
    assert warmup.kernel_cache_state(_key(target=warmup.NO_TARGET), tmp_path) is CacheState.NOT_APPLICABLE
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [key.marker_name]


def test_torn_marker_reads_cold(tmp_path: Path) -> None:
    key = _key()
    (tmp_path / key.marker_name).write_text('{"key": {"torch"')
    assert warmup.kernel_cache_state(key, tmp_path) is CacheState.COLD


def test_startup_budget() -> None:
    assert warmup.startup_budget(1200, CacheState.COLD) == 1200
    assert warmup.startup_budget(1200, CacheState.WARM) == warmup.WARM_STARTUP_S
    assert warmup.startup_budget(120, CacheState.WARM) == 120
    assert warmup.startup_budget(1200, CacheState.NOT_APPLICABLE) == 1200


def test_key_from_the_ladders_raw_pairs(demo_yaml: str) -> None:
    environ = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}
    key = warmup.key_for_pairs(
        [f"data={demo_yaml}", "imgsz=[480, 640]", "batch=8", "epochs=3"], root=host("rx5600xt"), environ=environ
    )
    assert (key.nc, key.imgsz, key.batch, key.target) == (2, 640, 8, "gfx1030_18")
    unchecked = warmup.key_for_pairs(["data=/nonexistent.yaml", "workers=8"], root=host("rx5600xt"), environ=environ)
    assert (unchecked.nc, unchecked.imgsz, unchecked.batch) == (warmup.DEFAULT_NC, 640, 16)


def test_warm_up_needs_fixed_shapes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fixed batch"):
        kernels.warm_up(_key(batch=-1), "cpu", tmp_path)


def test_cache_dir_follows_miopen() -> None:
    assert warmup.kernel_cache_dir({"MIOPEN_CUSTOM_CACHE_DIR": "/cache/miopen/kernels"}) == Path("/cache/miopen/kernels")
    assert warmup.kernel_cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/miopen")


def test_warm_up_runs_the_model_on_cpu(demo_yaml: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("YOLO_OFFLINE", "YOLO_AUTOINSTALL", "YOLO_CONFIG_DIR"):  # warm_up sets them for its process
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    key = warmup.WarmupKey(
        torch=warmup.torch_version(),
        target=warmup.NO_TARGET,
        model="yolov8n.yaml",
        nc=2,
        imgsz=32,
        batch=2,
        conv_backend="miopen",
    )
    result = kernels.warm_up(key, "cpu", tmp_path)
    assert set(result["timings_s"]) == {"train_first_s", "train_second_s", "val_forward_s"}
    assert all(seconds > 0 for seconds in result["timings_s"].values())
    assert result["marker"] is None and "no MIOpen kernels" in result["why_no_marker"]
    assert list(tmp_path.iterdir()) == []
