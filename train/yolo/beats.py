"""Heartbeats from Ultralytics' callbacks, and the ``train_batch`` fault site.

Every beat carries ``epoch`` (1-based, as Ultralytics prints it), ``batch``
(train batches completed in this epoch, 1..nb; Ultralytics does not expose
the index, so it is counted here) and ``step`` (train batches completed in
the run, continuing across resumed attempts). Phases and their budgets:

* ``setup``, ``timeout=TRAIN_STARTUP_TIMEOUT``: from the start of the child
  until its first train batch completes (imports, dataset scan, model build,
  worker start, and on ROCm the kernel compilation of the first batch);
* ``workers``, same budget: an epoch whose train loader must start worker
  processes first (non-persistent workers start afresh each epoch, and
  spawn-started workers import torch), until that epoch's first batch;
* ``train``, no timeout (the supervisor's stall budget): between batches;
* ``val``, the profile's ``val_timeout``: a validation pass, beating per
  validation batch (``val_batch``); the final evaluation from before its
  validator loads the best checkpoint and starts its loader's workers;
* ``save``, the profile's ``save_timeout``: writing checkpoints.

Every beat after the training starts also carries ``total_steps`` (epochs x
batches per epoch: the work the ladder policy weighs against), and the beat
after a checkpoint is written ``checkpoint_ts`` (its unix time: the supervisor
sees a new checkpoint in a new value, :mod:`trainbox.supervise.ladder.run`).

Train beats add ``loss`` (the epoch's running mean of the summed loss items)
and ``imgs_per_s`` (this epoch's average). A setup beat adds ``device`` (the
device found and the AMP, workers and pinned-memory decisions with their
reasons); as every field left out, it stays in the beats that follow.

Fault site ``train_batch``: in the training process after each train batch's
beat, context ``epoch``, ``batch``, ``step`` as above.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from trainbox import faults, heartbeat


class TrainingBeats:
    """Callback set that turns Ultralytics' training events into heartbeats."""

    def __init__(self, startup_timeout: float, val_timeout: float, save_timeout: float) -> None:
        self.startup_timeout = startup_timeout
        self.val_timeout = val_timeout
        self.save_timeout = save_timeout
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self.val_batch = 0
        self.first_batch_done = False
        self.epoch_started = time.monotonic()
        self.images = 0
        self.total_steps: Optional[int] = None

    def attach(self, trainer: Any) -> None:
        """Register on ``trainer``; its validator shares the callback lists."""
        trainer.add_callback("on_train_start", self.on_train_start)
        trainer.add_callback("on_train_epoch_start", self.on_train_epoch_start)
        trainer.add_callback("on_train_batch_end", self.on_train_batch_end)
        trainer.add_callback("on_val_start", self.on_val_start)
        trainer.add_callback("on_val_batch_end", self.on_val_batch_end)

    def beat(self, phase: str, timeout: Optional[float], force: bool = False, **metrics: Any) -> bool:
        return heartbeat.beat(
            phase, epoch=self.epoch, batch=self.batch, step=self.step, timeout=timeout, force=force,
            total_steps=self.total_steps, **metrics,
        )  # fmt: skip

    def setup(self) -> None:
        """The child's first beat: setup has started, with the startup budget."""
        self.beat("setup", self.startup_timeout, force=True)

    def device(self, record: Dict[str, Any]) -> None:
        """Still setup: the device found and what was decided for it (``device_defaults``); later beats keep it."""
        # Without epoch/batch/step: a beat that has them counts as the first training step (the startup fallback's cue).
        heartbeat.beat("setup", timeout=self.startup_timeout, force=True, device=record)

    def on_train_start(self, trainer: Any) -> None:
        self.step = trainer.start_epoch * len(trainer.train_loader)
        self.total_steps = trainer.epochs * len(trainer.train_loader)

    def on_train_epoch_start(self, trainer: Any) -> None:
        self.epoch, self.batch, self.images = trainer.epoch + 1, 0, 0
        self.epoch_started = time.monotonic()
        if not self.first_batch_done:
            self.beat("setup", self.startup_timeout, force=True)
        elif trainer.train_loader.num_workers > 0 and not getattr(trainer.train_loader, "workers_running", True):
            self.beat("workers", self.startup_timeout, force=True)
        else:
            self.beat("train", None, force=True)

    def on_train_batch_end(self, trainer: Any) -> None:
        self.batch += 1
        self.step += 1
        self.images += trainer.batch_size
        loss = sum(float(value) for value in trainer.tloss.values()) if trainer.tloss else None
        elapsed = time.monotonic() - self.epoch_started
        self.beat(
            "train",
            None,
            force=not self.first_batch_done,
            loss=round(loss, 5) if loss is not None else None,
            imgs_per_s=round(self.images / elapsed, 2) if elapsed > 0 else None,
        )
        self.first_batch_done = True
        faults.point("train_batch", epoch=self.epoch, batch=self.batch, step=self.step)

    def validation_starts(self) -> None:
        """Under the val budget from here: at ``on_val_start``, and for the final evaluation before its validator is
        called, since outside training Ultralytics' validator loads the model and builds its data loader (starting
        its workers) before ``on_val_start``."""
        self.val_batch = 0
        self.beat("val", self.val_timeout, force=True, val_batch=0)

    def on_val_start(self, validator: Any) -> None:
        self.validation_starts()

    def on_val_batch_end(self, validator: Any) -> None:
        self.val_batch += 1
        self.beat("val", self.val_timeout, val_batch=self.val_batch)
        faults.point("val_batch", epoch=self.epoch, batch=self.val_batch)

    def validated(self) -> None:
        """Validation ended: back to the stall budget."""
        self.beat("train", None, force=True)

    def saving(self) -> None:
        self.beat("save", self.save_timeout, force=True)

    def saved(self) -> None:
        self.beat("train", None, force=True, saved_epoch=self.epoch, checkpoint_ts=round(time.time(), 3))
