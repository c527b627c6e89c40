"""Bench instrumentation of an unmodified training process: the same marks for bare Ultralytics and for trainbox.

``bench/gpu.py`` puts this folder first on ``PYTHONPATH`` of every run it starts. Where ``TRAIN_BENCH_MARKS`` names
a file, each process that runs an Ultralytics training callback appends one JSON line to it when it exits: its pid,
when its interpreter started and, as ``time.time()`` values, every mark below. Processes that train nothing (the
supervisor, DataLoader workers, the forkserver) write nothing. Standard library only, nothing changed in the
program: Ultralytics' own callback table gets the marks (``default_callbacks``, which every trainer and validator
copies), and a few functions are wrapped as their module finishes importing.

Marks: ``ultralytics`` (its import finished), ``scan`` (each ``YOLODataset`` built: label scan and cache, start and
end), ``probe`` (trainbox's device description and offline AMP check; Ultralytics' ``check_amp``), and Ultralytics'
``on_pretrain_routine_start``/``_end``, ``on_train_start``, ``on_train_epoch_start``/``_end``,
``on_val_start``/``_end``, ``on_model_save``, ``on_fit_epoch_end``, and every ``on_train_batch_start``/``_end``.

``TRAIN_BENCH_ABLATE`` switches one of trainbox's differences from bare back, in the training process, for the
ablation (``bench/gpu.py``): ``val-workers`` (validation loads with twice the training workers, as Ultralytics'),
``no-exact-resume`` (no per-sample seeds and no positioned sampler: the plain dataset in Ultralytics' order),
``plain-checkpoints`` (Ultralytics' own save: no staging, no fsync), ``no-heartbeat`` (no heartbeat file writes).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

MARKS_ENV = "TRAIN_BENCH_MARKS"
ABLATE_ENV = "TRAIN_BENCH_ABLATE"
STARTED = time.time()
marks: List[Tuple[str, float]] = []
trained = False


def mark(name: str) -> None:
    marks.append((name, time.time()))


def _callback(name: str) -> Callable[[Any], None]:
    def record(_owner: Any) -> None:
        global trained
        trained = True
        mark(name)

    return record


CALLBACKS = (
    "on_pretrain_routine_start", "on_pretrain_routine_end", "on_train_start", "on_train_epoch_start",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_end", "on_val_start", "on_val_end",
    "on_model_save", "on_fit_epoch_end", "on_train_end",
)  # fmt: skip


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(f"{name}_start")
        try:
            return function(*args, **kwargs)
        finally:
            mark(f"{name}_end")

    return wrapper


def _callbacks(module: Any) -> None:
    for name in CALLBACKS:
        module.default_callbacks.setdefault(name, []).append(_callback(name))


def _dataset(module: Any) -> None:
    module.YOLODataset.__init__ = timed("scan", module.YOLODataset.__init__)


def _checks(module: Any) -> None:
    module.check_amp = timed("probe", module.check_amp)


def _probe(module: Any) -> None:
    module.describe = timed("probe", module.describe)
    module.amp_check = timed("probe", module.amp_check)


def _ablate_loader(module: Any) -> None:
    rebuild, what = module.rebuild, os.environ.get(ABLATE_ENV)

    @functools.wraps(rebuild)
    def ablated(base: Any, workers: int, *args: Any, train: bool, **kwargs: Any) -> Any:
        if what == "val-workers" and not train:
            workers *= 2  # Ultralytics validates with twice the training workers
        if what == "no-exact-resume" and train:
            built = rebuild(base, workers, *args, train=False, **kwargs)
            built.worker_init_fn.train = True
            return built
        return rebuild(base, workers, *args, train=train, **kwargs)

    module.rebuild = ablated


def _ablate_trainer(module: Any) -> None:
    from ultralytics.models.yolo.detect import DetectionTrainer

    module.ProfiledDetectionTrainer.save_model = DetectionTrainer.save_model


def _ablate_heartbeat(module: Any) -> None:
    module._Beater.beat = lambda self, *args: False


ABLATIONS: Dict[str, Tuple[str, Callable[[Any], None]]] = {
    "val-workers": ("trainbox.yolo.loader", _ablate_loader),
    "no-exact-resume": ("trainbox.yolo.loader", _ablate_loader),
    "plain-checkpoints": ("trainbox.yolo.trainer", _ablate_trainer),
    "no-heartbeat": ("trainbox.heartbeat", _ablate_heartbeat),
}


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``hooks[name](module)`` right after module ``name`` has been executed, before anyone uses it."""

    def __init__(self, hooks: Dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if name not in self.hooks:
            return None
        hook = self.hooks.pop(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this module's loader only
        return spec


def _write() -> None:
    if not trained:
        return
    record = {"pid": os.getpid(), "started": STARTED, "marks": marks}
    fd = os.open(os.environ[MARKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def install() -> None:
    hooks: Dict[str, Callable[[Any], None]] = {
        "ultralytics": lambda module: mark("ultralytics"),
        "ultralytics.utils.callbacks.base": _callbacks,
        "ultralytics.data.dataset": _dataset,
        "ultralytics.utils.checks": _checks,
        "trainbox.yolo.device_probe": _probe,
    }
    ablation = ABLATIONS.get(os.environ.get(ABLATE_ENV, ""))
    if ablation is not None:
        hooks[ablation[0]] = ablation[1]
    sys.meta_path.insert(0, AfterImport(hooks))
    atexit.register(_write)


if os.environ.get(MARKS_ENV):
    install()
