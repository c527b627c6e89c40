"""MIOpen warm-up: compile and cache the convolution kernels of a run before it starts, and tell cold from warm.

MIOpen compiles a kernel the first time it meets a convolution shape, which on
a cold cache keeps the first batch busy for minutes at 100% CPU. :func:`trainbox.yolo.kernels.warm_up`
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

import enum
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import yaml

from trainbox.atomic import write_text_atomic
from trainbox.system import caches, kfd

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
    return caches.miopen_dirs(os.environ if environ is None else environ)[1]


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
    target = cache_dir / key.marker_name
    write_text_atomic(target, body)
    return target
