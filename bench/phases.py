"""What a training run's marks say (``bench/marks/sitecustomize.py``): time to first batch by phase, steady
throughput in the middle of epochs, the main thread's wait on the DataLoader, and the fixed cost of each epoch.

All times are ``time.time()`` values written by the training process; ``launched`` is when the bench started the
run's first process (the supervisor for trainbox, the training process itself for bare).

* Time to first batch, by phase: ``supervisor`` (launch to the training process's interpreter: trainbox's
  supervisor starting the child; about 0 for bare), ``imports`` (interpreter to Ultralytics' trainer start:
  torch, Ultralytics, trainbox), ``probe`` (trainbox's device description and offline AMP check, or Ultralytics'
  ``check_amp``), ``scan`` (the datasets' label scans), ``setup`` (the rest of the trainer's set-up: model build,
  loaders, optimizer), ``workers`` (the first epoch's start to its first batch out of the loader: worker start
  and the first batch's loading), ``first_step`` (the first batch's forward and backward: kernel selection,
  warm-up).
* Steady: the batches between :data:`MIDDLE` of each epoch (none of an epoch's start or end), images per second,
  and the share of that time the main thread waited for the next batch (from a batch's end callback to the next
  batch's start callback: ``next()`` on the loader). A share near 0 is compute-bound, a large one data-bound.
* Fixed cost per epoch: the epoch's wall time (its start callback to ``on_fit_epoch_end``) less its batches at the
  steady pace; and in it ``val`` (validation during training), ``save`` (validation's end to ``on_model_save``:
  metrics row and checkpoint), ``boundary`` (the rest: worker restarts, the epoch's order, the first and last
  batches' extra time).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The middle of an epoch that counts as steady: from 10 % to 90 % of its batches.
MIDDLE = (0.1, 0.9)
#: Fewer steady batches than this in an epoch are not a measurement.
MIN_STEADY = 3


def read(path: Path) -> Dict[str, Any]:
    """The marks of the process that trained (the one line with the most marks: a DDP launcher writes none)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{path}: no marks: the run trained no batch")
    return max(records, key=lambda record: len(record["marks"]))


def _times(marks: Sequence[Tuple[str, float]], name: str) -> List[float]:
    return [at for mark, at in marks if mark == name]


def _spans(marks: Sequence[Tuple[str, float]], name: str, before: float) -> float:
    """Seconds inside ``name_start`` .. ``name_end`` pairs that start before ``before``."""
    starts, ends = _times(marks, f"{name}_start"), _times(marks, f"{name}_end")
    return sum(end - start for start, end in zip(starts, ends) if start < before)


def first_batch(record: Dict[str, Any], launched: float) -> Dict[str, float]:
    """Time to the first trained batch and its phases (seconds; see the module docstring)."""
    marks = record["marks"]
    pretrain = _times(marks, "on_pretrain_routine_start")[0]
    epoch = _times(marks, "on_train_epoch_start")[0]
    batch_start, batch_end = _times(marks, "on_train_batch_start")[0], _times(marks, "on_train_batch_end")[0]
    probe, scan = _spans(marks, "probe", batch_start), _spans(marks, "scan", batch_start)
    return {
        "total": batch_end - launched,
        "supervisor": record["started"] - launched,
        "imports": pretrain - record["started"],
        "probe": probe,
        "scan": scan,
        "setup": max(0.0, epoch - pretrain - probe - scan),
        "workers": batch_start - epoch,
        "first_step": batch_end - batch_start,
    }


def _epochs(marks: Sequence[Tuple[str, float]]) -> List[Dict[str, Any]]:
    """Each epoch's marks: its start, its batches' start and end times, and its later callbacks."""
    epochs: List[Dict[str, Any]] = []
    for name, at in marks:
        if name == "on_train_epoch_start":
            epochs.append({"start": at, "batch_start": [], "batch_end": []})
        elif epochs and name in ("on_train_batch_start", "on_train_batch_end"):
            epochs[-1][name[len("on_train_") :]].append(at)
        elif epochs and name in ("on_val_start", "on_val_end", "on_model_save", "on_fit_epoch_end"):
            epochs[-1].setdefault(name, at)
    return epochs


def steady(record: Dict[str, Any], batch: int) -> Dict[str, Optional[float]]:
    """Images per second and the loader-wait share over every epoch's middle (see the module docstring)."""
    seconds = waited = 0.0
    images = 0
    for epoch in _epochs(record["marks"]):
        ends, starts = epoch["batch_end"], epoch["batch_start"]
        first, last = int(len(ends) * MIDDLE[0]), int(len(ends) * MIDDLE[1])
        if last - first < MIN_STEADY:
            continue
        seconds += ends[last] - ends[first]
        images += (last - first) * batch
        waited += sum(starts[i] - ends[i - 1] for i in range(first + 1, last + 1))
    if not seconds:
        return {"imgs_per_s": None, "loader_wait_share": None, "batch_s": None}
    return {"imgs_per_s": images / seconds, "loader_wait_share": waited / seconds, "batch_s": batch * seconds / images}


def fixed_costs(record: Dict[str, Any], batch_s: Optional[float]) -> Dict[str, Optional[float]]:
    """Median over the epochs that ended in training of each fixed cost per epoch, in seconds."""
    rows: List[Dict[str, float]] = []
    for epoch in _epochs(record["marks"]):
        end = epoch.get("on_fit_epoch_end")
        if end is None or batch_s is None:
            continue
        total = end - epoch["start"] - len(epoch["batch_end"]) * batch_s
        val = epoch["on_val_end"] - epoch["on_val_start"] if "on_val_end" in epoch else 0.0
        save = epoch["on_model_save"] - epoch.get("on_val_end", epoch["batch_end"][-1]) if "on_model_save" in epoch else 0.0
        rows.append({"total": total, "val": val, "save": save, "boundary": total - val - save})
    if not rows:
        return {key: None for key in ("total", "val", "save", "boundary")}
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def gpu_busy(record: Dict[str, Any], samples: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Mean GPU utilisation (%) over the samples taken inside the epochs' steady middles; None without samples."""
    windows = []
    for epoch in _epochs(record["marks"]):
        ends = epoch["batch_end"]
        first, last = int(len(ends) * MIDDLE[0]), int(len(ends) * MIDDLE[1])
        if last - first >= MIN_STEADY:
            windows.append((ends[first], ends[last]))
    inside = [busy for at, busy in samples if any(start <= at <= end for start, end in windows)]
    return statistics.mean(inside) if inside else None
