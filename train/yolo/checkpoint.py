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

Everything here happens in the run directory, through :mod:`trainbox.rundir.safe`
(:func:`run_of` finds it from Ultralytics' weights folder): a ``last.pt`` that
is a link, a FIFO or a folder is refused in one line rather than loaded, the
staging folder is emptied of its own files only, and a rename never writes
through a link. Ultralytics' own writes into the staging folder are its own.
"""

from __future__ import annotations

import enum
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Optional, Tuple

from trainbox import faults
from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import Refusal, names

STAGING_DIR = ".staging"
#: What the staging folder may hold: Ultralytics' checkpoints (``last.pt``, ``best.pt``, ``epoch<n>.pt``).
STAGED = re.compile(r"[^/\0]+\.pt")
#: results.csv is a row per epoch; more than this is not Ultralytics' file and is left alone.
MAX_RESULTS_BYTES = 64 << 20
#: How deep Ultralytics' weights folder lies in the run directory (``train/weights``).
_WEIGHTS_DEPTH = len(PurePosixPath(RunDir.last_checkpoint.path).parent.parts)


class CheckpointError(UserError):
    """A checkpoint exists but cannot be used; the message says what to do."""


class Resume(enum.Enum):
    SCRATCH = "no checkpoint: train from scratch"
    RESUME = "resume from last.pt"
    TRAINED = "every epoch trained, final evaluation not done"
    FINISHED = "finished: last.pt has no optimizer state"


def run_of(weights: Path) -> RunDir:
    """The run directory whose Ultralytics weights folder is ``weights`` (``RUN_DIR/train/weights``)."""
    return RunDir(Path(weights).parents[_WEIGHTS_DEPTH - 1])


def resume_state(run: RunDir) -> Tuple[Resume, Dict[str, Any]]:
    """What ``run``'s last.pt means for this attempt, with the loaded checkpoint (empty when absent)."""
    last = run.last_checkpoint
    found = run.files.stat(last)
    if found.refused is Refusal.MISSING:
        return Resume.SCRATCH, {}
    if found.value is None or not stat.S_ISREG(found.value.st_mode):
        refusal = found.refused or Refusal.DIRECTORY
        raise CheckpointError(f"{refusal.line(last)}: move it away to train from scratch")
    from ultralytics.utils.patches import torch_load

    try:
        ckpt = torch_load(last, map_location="cpu")  # run directory, checked: a regular file reached without a link
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


def trim_results(run: RunDir, epochs: int) -> int:
    """Drop rows of Ultralytics' ``results.csv`` past epoch ``epochs`` (1-based); return how many.

    Ultralytics appends an epoch's row before saving its checkpoint, so an
    attempt killed in between leaves a row that the resumed attempt would
    append a second time. Blank or torn rows (a crash mid-append, a hand edit)
    are dropped too: they carry no epoch, and every later reader would trip on them.
    An empty file, or one that is refused or over MAX_RESULTS_BYTES, is left alone.
    """
    got = run.files.read_bytes(run.results, MAX_RESULTS_BYTES)
    lines = got.value.decode("utf-8", "replace").splitlines(keepends=True) if got.value is not None else []
    if not lines:
        return 0
    header, rows = lines[0], lines[1:]
    kept = [row for row in rows if (epoch := _epoch_of(row)) is not None and epoch <= epochs]
    if len(kept) != len(rows):
        run.files.replace(run.results, (header + "".join(kept)).encode())
    return len(rows) - len(kept)


def staging_dir(weights: Path) -> Path:
    """An empty staging directory inside ``weights`` (same filesystem, so renames are atomic)."""
    files, staging = run_of(weights).files, weights / STAGING_DIR
    files.clear(staging, STAGED)
    refused = files.make_dirs(staging)
    if refused is not None:
        raise CheckpointError(f"{refused.line(staging)}: cannot stage the checkpoint there; move it away")
    return staging


def publish(staging: Path, weights: Path, epoch: int) -> None:
    """Move every staged checkpoint over its target, ``last.pt`` first, each fsynced before its rename."""
    files = run_of(weights).files
    first = (RunDir.last_checkpoint.name, RunDir.best_checkpoint.name)
    listed = [name for name in files.list_dir(staging, 10_000).value or [] if STAGED.fullmatch(name)]
    staged = sorted(listed, key=lambda name: (name != first[0], name != first[1], name))
    for index, name in enumerate(staged):
        if index == 0:
            faults.point("save", epoch=epoch)
        refused = files.move_over(staging / name, weights / name)
        if refused is not None:
            raise CheckpointError(f"{refused.line(weights / name)}: the checkpoint cannot be put there; move it away")
    files.clear(staging, STAGED)
    files.remove_folder(staging, names(STAGING_DIR))


def strip_atomic(path: Path, updates: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Ultralytics' ``strip_optimizer`` of ``path``, written to a temp file and renamed over it."""
    from ultralytics.utils.torch_utils import strip_optimizer

    files = run_of(path.parent).files
    tmp = path.with_name(f".{path.name}.strip.tmp")
    own = names(tmp.name)
    files.remove(tmp, own)  # nothing planted there is written through: Ultralytics writes a new file
    try:
        stripped = strip_optimizer(path, s=str(tmp), updates=updates)
        if stripped:
            refused = files.move_over(tmp, path)
            if refused is not None:
                raise CheckpointError(f"{refused.line(path)}: the final checkpoint cannot be put there; move it away")
    finally:
        files.remove(tmp, own)
    return stripped
