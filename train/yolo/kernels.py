"""``python -m trainbox warmup``: compile a run's convolution kernels before it starts (the training side).

Runs the model at the run's shapes (forward and backward at ``batch``, the validation forward at ``2 x batch``)
so that MIOpen compiles them into its kernel cache, then records the warm cache with
:func:`trainbox.yolo.warmup.write_marker`. Which run a cache is warm for, and what that does to the startup budget,
is the host side's business (:mod:`trainbox.yolo.warmup`), which never imports torch; this module does.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict

from trainbox.yolo import warmup


def _sum_outputs(value: Any) -> Any:
    """Sum of every tensor in a model output (tensor, or nested list/tuple/dict of them)."""
    if isinstance(value, (list, tuple)):
        parts = [_sum_outputs(v) for v in value]
    elif isinstance(value, dict):
        parts = [_sum_outputs(v) for v in value.values()]
    else:
        return value.float().sum()
    return sum(p for p in parts if p is not None)


def warm_up(key: warmup.WarmupKey, device: str, cache_dir: Path) -> Dict[str, Any]:
    """Run ``key.model`` at the key's shapes on ``device``; write the marker when MIOpen kept kernels on disk.

    Returns timings (s) of the first and second training step and of the
    validation forward, whether a marker was written, and why not.
    """
    if key.batch < 1 or key.imgsz < 1:
        raise ValueError(f"warm-up needs a fixed batch and imgsz, got batch={key.batch} imgsz={key.imgsz}")
    import torch

    from trainbox.yolo import offline

    offline.prepare_environment(Path(tempfile.gettempdir()) / "trainbox-warmup-ultralytics")
    from ultralytics import YOLO
    from ultralytics.nn.tasks import DetectionModel

    torch.backends.cudnn.enabled = key.conv_backend == "miopen"
    # As Ultralytics' trainer builds it: the architecture (a .pt's own YAML) with the dataset's class count.
    cfg: Any = key.model
    if key.model.endswith(".pt"):
        cfg = YOLO(key.model).model.yaml  # type: ignore[union-attr]
    model = DetectionModel(cfg, nc=key.nc, verbose=False).to(device).float()
    timings: Dict[str, float] = {}
    model.train()
    images = torch.rand(key.batch, 3, key.imgsz, key.imgsz, device=device)
    for step in ("train_first_s", "train_second_s"):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        _sum_outputs(model(images)).backward()
        if device != "cpu":
            torch.cuda.synchronize()
        timings[step] = round(time.perf_counter() - started, 3)
    model.eval()
    started = time.perf_counter()
    with torch.no_grad():
        model(torch.rand(2 * key.batch, 3, key.imgsz, key.imgsz, device=device))
    if device != "cpu":
        torch.cuda.synchronize()
    timings["val_forward_s"] = round(time.perf_counter() - started, 3)
    result: Dict[str, Any] = {"timings_s": timings, "marker": None}
    if key.target == warmup.NO_TARGET or not getattr(torch.version, "hip", None) or device == "cpu":
        result["why_no_marker"] = "no MIOpen kernels to cache (no AMD GPU, CPU device or native convolutions)"
    elif not any(cache_dir.rglob("*.ukdb")):
        result["why_no_marker"] = (
            f"no *.ukdb in {cache_dir}: this MIOpen keeps compiled kernels in memory (image built with MIOPEN=wheel?)"
        )
    else:
        result["marker"] = str(warmup.write_marker(key, cache_dir, timings))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, help="profile name from env/profiles (its conv_backend applies)")
    parser.add_argument("--profiles-dir", type=Path, default=None, help="where profiles live (default: env/profiles)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda:0 when a GPU is visible, else cpu)")
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="the run's Ultralytics arguments (model=, data=, imgsz=, batch=)"
    )


def main(args: argparse.Namespace) -> int:
    """``python -m trainbox warmup``: warm the kernel cache for a run's shapes and print what happened as JSON."""
    from trainbox import errors
    from trainbox.yolo import profiles
    from trainbox.yolo.args import validate_overrides

    try:
        profile = profiles.load(args.profile, args.profiles_dir)
        overrides = validate_overrides(args.overrides)
    except errors.UserError as exc:
        return errors.report(exc)
    key = warmup.run_key(overrides, profile.conv_backend)
    cache_dir = warmup.kernel_cache_dir()
    before = warmup.kernel_cache_state(key, cache_dir)
    if args.device:
        device = args.device
    else:
        import torch

        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    result = warm_up(key, device, cache_dir)
    report = {"key": asdict(key), "device": device, "cache_dir": str(cache_dir), "state_before": before.value, **result}
    report["state_after"] = warmup.kernel_cache_state(key, cache_dir).value
    print(json.dumps(report, indent=2))
    return 0
