"""Mid-epoch checkpoints and an exact continuation from them.

Ultralytics checkpoints once per epoch, and stores the weights as its EMA in
half precision: a hang at 80% of a 4.6-hour epoch loses 3.7 hours. Every
``midepoch_checkpoint_s`` seconds or ``midepoch_checkpoint_batches`` batches
(profile settings), right after an optimizer step (so no gradient is
half-accumulated), ``MidEpoch`` writes ``weights/midepoch.pt`` atomically:

* the fields of an Ultralytics checkpoint (so the file is a valid resume
  point for Ultralytics too), with ``epoch`` = the last *completed* epoch;
* under ``trainbox``: the position (next batch of the epoch), the live model
  and the EMA in full precision, the optimizer and scaler, the running mean
  of the epoch's losses and the training process's RNG states.

``last.pt``, ``best.pt`` and ``results.csv`` stay Ultralytics' epoch-end
files; ``midepoch.pt`` is removed once its epoch ends (a newer ``last.pt``
supersedes it), so a plain ``yolo train resume`` on the result keeps working.

Continuing inside an epoch from batch ``k``: the sampler starts at batch
``k`` (``position``), and Ultralytics' loop counts that epoch's batches from
0 again, so everything it derives from the batch index is corrected through
the trainer's overridable steps: warm-up learning rate, momentum and
gradient accumulation are recomputed from the true iteration in
``preprocess_batch``; the accumulation countdown, which Ultralytics keeps in
a local variable, is matched by adjusting ``accumulate`` until its next
optimizer step; the epoch's running loss is recomputed after each batch.

Under DDP (``device=0,1``) every rank keeps the same position (each trains the
same number of batches of its share) and loads the same file; rank 0 alone
writes it, with the model unwrapped from DistributedDataParallel so the file
is the same as a single device's.
"""

from __future__ import annotations

import random
import stat
import time
from copy import deepcopy
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Dict, Optional

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from ultralytics.utils import LOGGER, RANK

from trainbox import faults, heartbeat
from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import names, temporaries
from trainbox.yolo.checkpoint import run_of
from trainbox.yolo.position import Position, record

#: ``RunDir.midepoch_checkpoint``'s file name: the trainer knows only its weights folder (``trainer.wdir``).
MIDEPOCH_NAME = RunDir.midepoch_checkpoint.name


@dataclass(frozen=True)
class Cadence:
    """When to write a mid-epoch checkpoint: after ``seconds`` or ``batches``, whichever comes first (0 = never)."""

    seconds: float
    batches: int

    def due(self, since_s: float, since_batches: int) -> bool:
        return (self.seconds > 0 and since_s >= self.seconds) or (self.batches > 0 and since_batches >= self.batches)


def position_of(ckpt: Dict[str, Any]) -> Optional[Position]:
    """The mid-epoch position a checkpoint continues from, None for an epoch-end checkpoint."""
    extras = ckpt.get("trainbox") if isinstance(ckpt, dict) else None
    return Position(**extras["position"]) if extras else None


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel (a DDP rank's ``trainer.model``); any other model as it is."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _float_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _rng_state() -> Dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _remove_torn(weights: Path) -> None:
    """Temporary files of a write that was killed (the finished file never depends on them)."""
    run_of(weights).files.clear(weights, temporaries(MIDEPOCH_NAME))


def discard(weights: Path) -> None:
    """Remove the mid-epoch checkpoint once an epoch-end ``last.pt`` supersedes it."""
    run_of(weights).files.remove(weights / MIDEPOCH_NAME, names(MIDEPOCH_NAME))
    _remove_torn(weights)


def newer_than_last(run: RunDir, last_epoch: Optional[int]) -> Optional[Path]:
    """``run``'s mid-epoch checkpoint when it continues past ``last.pt`` (completed epoch ``last_epoch``, 0-based).

    A ``midepoch.pt`` that is not a regular file reached without a link (:mod:`trainbox.rundir.safe`) is none.
    """
    path = run.midepoch_checkpoint
    found = run.files.stat(path).value
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    from ultralytics.utils.patches import torch_load

    try:
        position = position_of(torch_load(path, map_location="cpu"))  # run directory, checked: a regular file (above)
    except Exception:  # noqa: BLE001 - an unreadable mid-epoch file only means: use last.pt
        return None
    if position is None or (last_epoch is not None and position.epoch <= last_epoch):
        return None
    return path


class MidEpoch:
    """Per-attempt state of mid-epoch checkpointing and of continuing inside an epoch."""

    def __init__(self, cadence: Cadence) -> None:
        self.cadence = cadence
        self.resume_at: Optional[Position] = None
        self.shift = 0  # batches of the current epoch trained before this attempt
        self.lag = 0  # true minus loop iteration of the last optimizer step
        self.loop_batch = -1
        self.stepped = False
        self.tloss: Optional[Dict[str, Any]] = None
        self.last_save = time.monotonic()
        self.batches_since_save = 0
        self.nominal_accumulate = 1
        self.adjusted = False
        self.saves = 0
        self.save_seconds = 0.0

    # -- callbacks -------------------------------------------------------------
    def on_train_start(self, trainer: Any) -> None:
        self.nominal_accumulate = trainer.accumulate
        self.last_save = time.monotonic()
        if self.resume_at is not None:
            trainer.beats.step += self.resume_at.batch

    def on_train_end(self, trainer: Any) -> None:
        if self.saves:
            mean = self.save_seconds / self.saves
            LOGGER.info(f"trainbox: {self.saves} mid-epoch checkpoint(s) written, {mean:.3f} s each on average")

    def on_train_epoch_start(self, trainer: Any) -> None:
        at = self.resume_at
        self.shift = at.batch if at is not None and at.epoch == trainer.epoch else 0
        self.resume_at = None
        self.loop_batch = -1
        if not self.shift:
            self.tloss = None
        trainer.beats.batch = self.shift
        trainer.train_loader.start_at(Position(trainer.epoch, self.shift))

    def before_batch(self, trainer: Any, batch: Dict[str, Any]) -> None:
        """Called from ``preprocess_batch``: after Ultralytics' warm-up step, before the forward pass."""
        self.loop_batch += 1
        self.stepped = False
        record("train", trainer.epoch, self.shift + self.loop_batch, batch.get("im_file", ()))
        if not (self.shift or self.lag):
            if self.adjusted:
                nb = len(trainer.train_loader)
                nw = trainer._get_warmup_iterations(nb)
                if not (nw and self.loop_batch + nb * trainer.epoch <= nw):  # past warm-up nothing resets it
                    trainer.accumulate = self.nominal_accumulate
                self.adjusted = False
            return
        self.adjusted = True
        nb = len(trainer.train_loader)
        true_ni = self.shift + self.loop_batch + nb * trainer.epoch
        nw = trainer._get_warmup_iterations(nb)
        accumulate = self.nominal_accumulate
        if self.shift:
            accumulate = self._warm_up(trainer, true_ni, nw)
        elif nw and true_ni <= nw:
            accumulate = trainer.accumulate
        trainer.accumulate = max(1, accumulate - self.shift + self.lag)

    def _warm_up(self, trainer: Any, true_ni: int, nw: int) -> int:
        """Ultralytics' warm-up formulas at the true iteration; return the true accumulation."""
        args, epoch = trainer.args, trainer.epoch
        warming = bool(nw) and true_ni <= nw
        xi = [0, nw]
        for group in trainer.optimizer.param_groups:
            target = group["initial_lr"] * trainer.lf(epoch)
            if warming:
                start = args.warmup_bias_lr if group.get("param_group") == "bias" else 0.0
                group["lr"] = float(np.interp(true_ni, xi, [start, target]))
            else:
                group["lr"] = target
            if "momentum" in group:
                group["momentum"] = (
                    float(np.interp(true_ni, xi, [args.warmup_momentum, args.momentum])) if warming else args.momentum
                )
        if warming:
            return max(1, int(np.interp(true_ni, xi, [1, self.nominal_accumulate]).round()))
        return self.nominal_accumulate

    def after_optimizer_step(self) -> None:
        self.lag = self.shift
        self.stepped = True

    def on_train_batch_end(self, trainer: Any) -> None:
        done = self.shift + self.loop_batch  # batches of this epoch before this one
        items = trainer.loss_items
        if self.tloss is None or done == 0:
            self.tloss = dict(items)
        else:
            self.tloss = {k: (self.tloss[k] * done + v) / (done + 1) for k, v in items.items()}
        trainer.tloss = self.tloss
        self.batches_since_save += 1
        next_batch = done + 1
        since = time.monotonic() - self.last_save
        # The supervisor asks for one before it restarts a slow attempt (--on-slow restart, trainbox.supervise.pace.watch).
        due = self.cadence.due(since, self.batches_since_save) or heartbeat.checkpoint_requested()
        if self.stepped and next_batch < len(trainer.train_loader) and due and RANK in (-1, 0):  # DDP: rank 0 writes
            self.save(trainer, Position(trainer.epoch, next_batch))

    # -- writing and reading -------------------------------------------------------
    def save(self, trainer: Any, position: Position) -> Optional[Path]:
        started = time.monotonic()
        trainer.beats.saving()
        ema = trainer.ema.ema
        ckpt = {
            "epoch": position.epoch - 1,
            "best_fitness": trainer.best_fitness,
            "stopper": {"best_fitness": trainer.stopper.best_fitness, "best_epoch": trainer.stopper.best_epoch},
            "model": None,
            "ema": deepcopy(ema).half(),
            "updates": trainer.ema.updates,
            "optimizer": deepcopy(trainer.optimizer.state_dict()),
            "scaler": trainer.scaler.state_dict(),
            "train_args": vars(trainer.args),
            "train_metrics": {**trainer.metrics, "fitness": trainer.fitness},
            "date": datetime.now().astimezone().isoformat(),
            "trainbox": {
                "position": position.to_dict(),
                "model": _float_state(_unwrapped(trainer.model)),
                "ema": _float_state(ema),
                "tloss": self.tloss,
                "rng": _rng_state(),
            },
        }
        path = trainer.wdir / MIDEPOCH_NAME
        _remove_torn(trainer.wdir)

        def write(handle: BinaryIO) -> None:
            torch.save(ckpt, handle)  # run directory, checked: into the file RunFiles.replace_with opened
            handle.flush()
            faults.point("midsave", epoch=position.epoch + 1, batch=position.batch)

        refused = run_of(trainer.wdir).files.replace_with(path, write)
        if refused is not None:
            LOGGER.warning(f"trainbox: no mid-epoch checkpoint: {refused.line(path)}")
            return None
        self.last_save = time.monotonic()
        self.batches_since_save = 0
        self.saves += 1
        self.save_seconds += self.last_save - started
        trainer.beats.beat("save", None, force=True, midepoch_save_s=round(self.last_save - started, 3))
        trainer.beats.saved()
        heartbeat.checkpointed()
        return path

    def restore(self, trainer: Any, ckpt: Dict[str, Any]) -> None:
        """Continue exactly where ``ckpt`` was written (called instead of Ultralytics' resume_training)."""
        extras = ckpt["trainbox"]
        trainer._load_checkpoint_state(ckpt)
        _unwrapped(trainer.model).load_state_dict(extras["model"])
        trainer.ema.ema.load_state_dict(extras["ema"])
        trainer.start_epoch = extras["position"]["epoch"]
        self.resume_at = Position(**extras["position"])
        self.tloss = extras["tloss"]
        # Ultralytics' loop starts with its last optimizer step at iteration -1; the true last step was
        # the batch before the checkpoint.
        self.lag = len(trainer.train_loader) * self.resume_at.epoch + self.resume_at.batch
        _set_rng_state(extras["rng"])
