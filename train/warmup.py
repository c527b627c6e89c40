"""MIOpen warm-up: compile and cache the convolution kernels of a run before it starts, and tell cold from warm.

MIOpen compiles a kernel the first time it meets a convolution shape, which on
a cold cache keeps the first batch busy for minutes at 100% CPU. ``warm_up``
runs the model at the training shapes (forward+backward at ``batch``, and
the validation forward at ``2 x batch``, the batch Ultralytics validates
with) so that MIOpen compiles them into ``$MIOPEN_CUSTOM_CACHE_DIR``, a
volume in compose. It then writes a marker file into that directory, keyed
by everything that changes the kernels: torch version, the target MIOpen
compiles for (the kdb name, e.g. ``gfx1030_18``), model, class count, image
size, batch and convolution backend.

For the runner (the ladder, host side):
``startup_budget(profile.startup_timeout, kernel_cache_state(key_for_pairs(overrides, profile.conv_backend)))``:

* ``COLD`` (no marker for this key): the profile's long ``startup_timeout``;
* ``WARM`` (marker present): ``min(startup_timeout, WARM_STARTUP_S)``;
* ``NOT_APPLICABLE`` (no AMD GPU, or the ``native`` convolution backend):
  nothing compiles; the profile's budget (a large dataset's label scan still
  counts as startup).

Computing the key and the state never imports torch (host-side supervisor).
Limits: validation batches are letterboxed per image (``rect``), so their
exact shapes depend on the dataset and a few may still compile during the
first validation (its own ``val_timeout`` budget covers that); with the
wheel's embedded MIOpen (image built with ``MIOPEN=wheel``) compiled kernels
live in memory only, no ``*.ukdb`` appears, and ``warm_up`` writes no marker,
so the state stays ``COLD``.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import yaml

from trainbox.doctor import kfd
from trainbox.doctor.inside import user_dirs

MARKER_PREFIX = "trainbox-warm-"
#: First-batch budget on a warm cache: imports, dataset scan, model build and worker start, no compiling.
WARM_STARTUP_S = 300.0
CONV_BACKENDS = ("miopen", "native")
#: What MIOpen compiles for when there is nothing to compile.
NO_TARGET = "none"
DEFAULT_NC = 80


class CacheState(enum.Enum):
    COLD = "cold"
    WARM = "warm"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class WarmupKey:
    """Everything that decides which convolution kernels a run compiles."""

    torch: str
    target: str
    model: str
    nc: int
    imgsz: int
    batch: int
    conv_backend: str

    @property
    def marker_name(self) -> str:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
        return f"{MARKER_PREFIX}{digest}.json"


def torch_version() -> str:
    """Installed torch version without importing it ("absent" on a host without torch)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "absent"


def miopen_target(root: Path = Path("/"), environ: Optional[Mapping[str, str]] = None) -> str:
    """The kdb name MIOpen uses for HIP device 0 (the first KFD GPU node), or ``none`` without an AMD GPU."""
    environ = os.environ if environ is None else environ
    nodes = kfd.gpu_nodes(root)
    if not nodes:
        return NO_TARGET
    override = environ.get(kfd.OVERRIDE_ENV) or None
    return kfd.kdb_name(nodes[0], override)


def class_count(data: Optional[str]) -> int:
    """``nc`` of a dataset YAML (its ``nc`` or the length of ``names``); Ultralytics' 80 without a readable one."""
    try:
        spec = yaml.safe_load(Path(data).read_text()) if data else None
    except (OSError, yaml.YAMLError):
        spec = None
    if not isinstance(spec, dict):
        return DEFAULT_NC
    if "nc" in spec:
        return int(spec["nc"])
    return len(spec.get("names") or ()) or DEFAULT_NC


def _side(value: Any) -> int:
    """Ultralytics trains at the largest side of a list ``imgsz``."""
    return int(max(value)) if isinstance(value, (list, tuple)) else int(value)


def run_key(
    overrides: Mapping[str, Any],
    conv_backend: str = "miopen",
    root: Path = Path("/"),
    environ: Optional[Mapping[str, str]] = None,
) -> WarmupKey:
    """The key of a run from its validated Ultralytics overrides (``trainbox.yolo.args.validate_overrides``)."""
    from trainbox.yolo.args import load_defaults
    from trainbox.yolo.runner import DEFAULT_MODEL

    if conv_backend not in CONV_BACKENDS:
        raise ValueError(f"conv_backend must be one of {', '.join(CONV_BACKENDS)}, not {conv_backend!r}")
    defaults = load_defaults()
    return WarmupKey(
        torch=torch_version(),
        target=miopen_target(root, environ) if conv_backend == "miopen" else NO_TARGET,
        model=str(overrides.get("model") or DEFAULT_MODEL),
        nc=class_count(overrides.get("data")),
        imgsz=_side(overrides.get("imgsz", defaults["imgsz"][0])),
        batch=int(overrides.get("batch", defaults["batch"][0])),
        conv_backend=conv_backend,
    )


def key_for_pairs(
    pairs: Sequence[str],
    conv_backend: str = "miopen",
    root: Path = Path("/"),
    environ: Optional[Mapping[str, str]] = None,
) -> WarmupKey:
    """The key of a run from its raw ``KEY=VALUE`` arguments, as the ladder holds them (parsed, not validated)."""
    from trainbox.yolo.args import parse_value

    overrides = {key.strip(): parse_value(text) for key, sep, text in (p.partition("=") for p in pairs) if sep}
    return run_key(overrides, conv_backend, root, environ)


def kernel_cache_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """``$MIOPEN_CUSTOM_CACHE_DIR``, else MIOpen's default under ``$HOME``."""
    return user_dirs(os.environ if environ is None else environ)[1]


def kernel_cache_state(key: WarmupKey, cache_dir: Optional[Path] = None) -> CacheState:
    """COLD unless a warm-up with this exact key left its marker in the kernel cache."""
    if key.target == NO_TARGET:
        return CacheState.NOT_APPLICABLE
    marker = (cache_dir or kernel_cache_dir()) / key.marker_name
    try:
        recorded = json.loads(marker.read_text()).get("key")
    except (OSError, ValueError):
        return CacheState.COLD
    return CacheState.WARM if recorded == asdict(key) else CacheState.COLD


def startup_budget(profile_s: float, state: CacheState, warm_s: float = WARM_STARTUP_S) -> float:
    """First-batch budget: at most ``warm_s`` on a warm cache, else the profile's (long) ``profile_s``.

    Without MIOpen (``NOT_APPLICABLE``) the profile's budget stays: nothing
    compiles, but a large dataset's label scan still counts as startup.
    """
    return min(profile_s, warm_s) if state is CacheState.WARM else profile_s


def write_marker(key: WarmupKey, cache_dir: Path, timings: Mapping[str, float]) -> Path:
    """Record that ``key``'s kernels are compiled into ``cache_dir``; written atomically, never seen half-written."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"key": asdict(key), "timings_s": dict(timings), "written": time.time()}, indent=2, sort_keys=True)
    handle, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{MARKER_PREFIX}")
    with os.fdopen(handle, "w") as out:
        out.write(body)
    target = cache_dir / key.marker_name
    os.replace(tmp, target)
    return target


def _sum_outputs(value: Any) -> Any:
    """Sum of every tensor in a model output (tensor, or nested list/tuple/dict of them)."""
    if isinstance(value, (list, tuple)):
        parts = [_sum_outputs(v) for v in value]
    elif isinstance(value, dict):
        parts = [_sum_outputs(v) for v in value.values()]
    else:
        return value.float().sum()
    return sum(p for p in parts if p is not None)


def warm_up(key: WarmupKey, device: str, cache_dir: Path) -> Dict[str, Any]:
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
    if key.target == NO_TARGET or not getattr(torch.version, "hip", None) or device == "cpu":
        result["why_no_marker"] = "no MIOpen kernels to cache (no AMD GPU, CPU device or native convolutions)"
    elif not any(cache_dir.rglob("*.ukdb")):
        result["why_no_marker"] = (
            f"no *.ukdb in {cache_dir}: this MIOpen keeps compiled kernels in memory (image built with MIOPEN=wheel?)"
        )
    else:
        result["marker"] = str(write_marker(key, cache_dir, timings))
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
    from trainbox import errors, profiles
    from trainbox.yolo.args import validate_overrides

    try:
        profile = profiles.load(args.profile, args.profiles_dir)
        overrides = validate_overrides(args.overrides)
    except errors.UserError as exc:
        return errors.report(exc)
    key = run_key(overrides, profile.conv_backend)
    cache_dir = kernel_cache_dir()
    before = kernel_cache_state(key, cache_dir)
    if args.device:
        device = args.device
    else:
        import torch

        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    result = warm_up(key, device, cache_dir)
    report = {"key": asdict(key), "device": device, "cache_dir": str(cache_dir), "state_before": before.value, **result}
    report["state_after"] = kernel_cache_state(key, cache_dir).value
    print(json.dumps(report, indent=2))
    return 0
