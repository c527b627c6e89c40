"""Crash-safe checkpoints and the resume decision.

Ultralytics writes ``last.pt``/``best.pt`` with ``Path.write_bytes``
(truncate, write, no fsync) and ``strip_optimizer`` with ``torch.save`` in
place: a kill in between leaves a torn or empty file and no way to resume.
Here the trainer lets Ultralytics serialise each checkpoint into a staging
directory beside the weights, then each staged file is fsynced and renamed
over its target (``last.pt`` first): until that rename the previous
checkpoint is untouched.

Fault site ``save``: in the training process, after the new ``last.pt`` has
been written to its staging file and before it is made durable and renamed;
context ``epoch`` (1-based, the epoch the checkpoint completes).
"""

from __future__ import annotations

import enum
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from trainbox import faults
from trainbox.atomic import fsync_path, write_text_atomic
from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir

STAGING_DIR = ".staging"


class CheckpointError(UserError):
    """A checkpoint exists but cannot be used; the message says what to do."""


class Resume(enum.Enum):
    SCRATCH = "no checkpoint: train from scratch"
    RESUME = "resume from last.pt"
    TRAINED = "every epoch trained, final evaluation not done"
    FINISHED = "finished: last.pt has no optimizer state"


def resume_state(last: Path) -> Tuple[Resume, Dict[str, Any]]:
    """What ``last`` means for this attempt, with the loaded checkpoint (empty when absent)."""
    if not last.exists():
        return Resume.SCRATCH, {}
    from ultralytics.utils.patches import torch_load

    try:
        ckpt = torch_load(last, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means the same thing here
        raise CheckpointError(
            f"{last} cannot be loaded ({type(exc).__name__}: {exc}); move it away to train from scratch"
        ) from None
    if not isinstance(ckpt, dict) or "epoch" not in ckpt:
        raise CheckpointError(f"{last} is not an Ultralytics training checkpoint; move it away to train from scratch")
    if ckpt.get("epoch", -1) < 0 or ckpt.get("optimizer") is None:
        return Resume.FINISHED, ckpt
    epochs = (ckpt.get("train_args") or {}).get("epochs")
    if isinstance(epochs, int) and ckpt["epoch"] + 1 >= epochs:
        return Resume.TRAINED, ckpt
    return Resume.RESUME, ckpt


def _epoch_of(row: str) -> Optional[float]:
    """The epoch in a ``results.csv`` row, or None for a blank or torn row."""
    try:
        return float(row.split(",", 1)[0])
    except ValueError:
        return None


def trim_results(csv: Path, epochs: int) -> int:
    """Drop rows of Ultralytics' ``results.csv`` past epoch ``epochs`` (1-based); return how many.

    Ultralytics appends an epoch's row before saving its checkpoint, so an
    attempt killed in between leaves a row that the resumed attempt would
    append a second time. Blank or torn rows (a crash mid-append, a hand edit)
    are dropped too: they carry no epoch, and every later reader would trip on them.
    An empty file is left alone.
    """
    if not csv.exists():
        return 0
    lines = csv.read_text(encoding="utf-8").splitlines(keepends=True)
    if not lines:
        return 0
    header, rows = lines[0], lines[1:]
    kept = [row for row in rows if (epoch := _epoch_of(row)) is not None and epoch <= epochs]
    if len(kept) != len(rows):
        write_text_atomic(csv, header + "".join(kept))
    return len(rows) - len(kept)


def staging_dir(weights: Path) -> Path:
    """An empty staging directory inside ``weights`` (same filesystem, so renames are atomic)."""
    staging = weights / STAGING_DIR
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, weights: Path, epoch: int) -> None:
    """Move every staged checkpoint over its target, ``last.pt`` first, each fsynced before its rename."""
    first = (RunDir.last_checkpoint.name, RunDir.best_checkpoint.name)
    staged = sorted(staging.glob("*.pt"), key=lambda p: (p.name != first[0], p.name != first[1], p.name))
    for index, path in enumerate(staged):
        if index == 0:
            faults.point("save", epoch=epoch)
        fsync_path(path)
        os.replace(path, weights / path.name)
    fsync_path(weights)
    shutil.rmtree(staging, ignore_errors=True)


def strip_atomic(path: Path, updates: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Ultralytics' ``strip_optimizer`` of ``path``, written to a temp file and renamed over it."""
    from ultralytics.utils.torch_utils import strip_optimizer

    tmp = path.with_name(f".{path.name}.strip.tmp")
    try:
        stripped = strip_optimizer(path, s=str(tmp), updates=updates)
        if stripped:
            fsync_path(tmp)
            os.replace(tmp, path)
            fsync_path(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return stripped
