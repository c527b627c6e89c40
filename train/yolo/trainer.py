"""The one seam where a profile meets Ultralytics: a DetectionTrainer subclass.

Passed to ``YOLO(...).train(trainer=...)`` (bound to its settings with
``functools.partial``). Ultralytics' ``BaseTrainer.__init__`` forces
``workers=0`` on CPU and sets torch's threads to ``cpu_count - 1``, and
``check_resume`` replaces the arguments with the checkpoint's on a resumed
attempt (keeping only a few overrides). Everything the profile decides is
therefore applied *after* ``super().__init__``, on fresh and resumed
attempts alike: workers, val, amp, compile, the convolution backend
(``native``: ``torch.backends.cudnn.enabled = False``), CPU threads (again at
every validation start, since a stand-alone validator resets them), and the
DataLoader options via ``get_dataloader``. Nothing in torch or Ultralytics is patched.

Workers, AMP and pinned memory are decided for the device Ultralytics
selected (``self.device``), by :mod:`trainbox.yolo.device_defaults`, right
after ``super().__init__``. FP16 AMP takes a detour around Ultralytics' AMP
check, which downloads ``yolo26n.pt``: Ultralytics' ``_setup_train`` sees
``amp=False``, and ``resume_training`` — the one step of it between that check
and the first use of the gradient scaler (a resumed checkpoint's scaler
state is loaded there) — runs the offline check (``device_probe.amp_check``)
and switches AMP and its scaler on when it passes (so ``batch=-1``, AutoBatch, which runs
before it, sizes the batch for FP32: smaller than with AMP, never too large). The decisions, with their
reasons, then go out in one log line (``trained with ...``, :func:`trainbox.yolo.settings.trained_with`),
in a ``setup`` beat's ``device`` field (the supervisor records it as the attempt's ``device`` event) and
into ``args.yaml``.

The subclass also beats (``beats.TrainingBeats``), fires the ``val_end``
fault site (right after each in-training validation, context ``epoch``),
writes every checkpoint atomically (``checkpoint``), including the final
``strip_optimizer`` writes, and writes and continues from mid-epoch
checkpoints (``midepoch``: ``preprocess_batch`` and ``optimizer_step`` are its
hooks into Ultralytics' loop).

DDP (``device=0,1``): Ultralytics' launcher pickles ``type(trainer)``, its
arguments and its callbacks into a generated script that
``torch.distributed.run`` starts once per rank (``ultralytics.utils.dist``),
and each rank rebuilds this class without ``settings``: it takes them from the
environment (:func:`trainbox.yolo.settings.inherited`), installs the network
guard and switches settings sync off as the runner did in the launcher, and
beats into its own heartbeat file. The launcher hands the ranks Ultralytics'
callbacks only (each rank attaches its own trainbox ones). Rank 0 alone writes
checkpoints; each rank's loader takes its share of the epoch's order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from ultralytics.cfg import DEFAULT_CFG
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import LOGGER, YAML
from ultralytics.utils.torch_utils import unwrap_model

from trainbox import faults
from trainbox.rundir.layout import RunDir
from trainbox.yolo import checkpoint, device_defaults, device_probe, forkserver, loader, midepoch, offline
from trainbox.yolo.beats import TrainingBeats
from trainbox.yolo.settings import RunSettings, for_device, inherited, trained_with


def apply_cpu_threads(threads: Optional[int]) -> int:
    """Set torch's intra-op threads (None: every core); return the number set."""
    count = threads or os.cpu_count() or 1
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


class ProfiledDetectionTrainer(DetectionTrainer):
    """Ultralytics' detection trainer with a trainbox profile applied."""

    def __init__(
        self,
        cfg: Any = DEFAULT_CFG,
        overrides: Optional[Dict[str, Any]] = None,
        _callbacks: Optional[Dict[str, Any]] = None,
        *,
        settings: Optional[RunSettings] = None,
    ) -> None:
        super().__init__(cfg, overrides, _callbacks)
        #: Ultralytics' own callbacks: what a DDP launch hands its ranks (see ``train``).
        self.ultralytics_callbacks = {event: list(functions) for event, functions in self.callbacks.items()}
        if settings is None:  # a DDP rank, rebuilt by Ultralytics' generated script
            settings = inherited()
            if settings.network_log is not None:
                offline.install_network_guard(settings.network_log)
            offline.disable_settings_sync()
        described = device_probe.describe(self.device)
        self.device_defaults = device_defaults.decide(
            described, settings.amp, settings.workers, self.args.batch, settings.cuda_workers
        )
        self.settings = settings = for_device(settings, self.device_defaults)
        if settings.multiprocessing_context == "forkserver" and settings.workers:
            forkserver.start()  # started by the runner already, except in a DDP rank
        self.args.workers = settings.workers
        self.args.val = settings.val
        self.args.amp = False if settings.amp is True else settings.amp  # FP16: checked offline in resume_training
        self.args.compile = settings.compile
        if settings.conv_backend == "native":
            torch.backends.cudnn.enabled = False  # PyTorch's own convolutions: no MIOpen/cuDNN kernel compilation
        apply_cpu_threads(settings.cpu_threads)
        self.beats = TrainingBeats(settings.startup_timeout, settings.val_timeout, settings.save_timeout)
        self.beats.attach(self)
        cadence = midepoch.Cadence(settings.midepoch_checkpoint_s, settings.midepoch_checkpoint_batches)
        self.midepoch = midepoch.MidEpoch(cadence)
        self.add_callback("on_train_start", self.midepoch.on_train_start)
        self.add_callback("on_train_epoch_start", self.midepoch.on_train_epoch_start)
        self.add_callback("on_train_batch_end", self.midepoch.on_train_batch_end)
        self.add_callback("on_train_end", self.midepoch.on_train_end)
        self.add_callback("on_val_start", self._before_validation)

    def train(self) -> Any:
        """Ultralytics' train; a DDP launch hands the ranks only Ultralytics' callbacks."""
        if self.ddp:
            self.hand_over_to_ranks()
        return super().train()

    def hand_over_to_ranks(self) -> None:
        """Before Ultralytics pickles this trainer for its DDP ranks: each rank attaches its own trainbox callbacks."""
        self.callbacks = self.ultralytics_callbacks

    def _before_validation(self, validator: Any) -> None:
        apply_cpu_threads(self.settings.cpu_threads)
        if isinstance(validator.dataloader, loader.ProfileDataLoader):
            validator.dataloader.set_epoch(self.epoch + 1)

    def check_resume(self, overrides: Dict[str, Any]) -> None:
        """Resume as Ultralytics does, but keep this attempt's run directory.

        The checkpoint's arguments carry the absolute ``save_dir`` of the
        attempt that wrote it; a run directory mounted elsewhere (a container)
        must not send checkpoints back to that old path.
        """
        super().check_resume(overrides)
        if self.resume and overrides.get("project"):
            self.args.project, self.args.name, self.args.exist_ok = overrides["project"], overrides["name"], True
            self.args.save_dir = str(Path(overrides["project"]) / overrides["name"])

    def _settle_amp(self) -> None:
        """AMP as decided, FP16 only once the offline check passes; then record the device's decisions."""
        check = None
        if self.settings.amp is True:
            model: Any = self.model  # built and on the device by now (Ultralytics types it as a path too)
            passed, check = device_probe.amp_check(unwrap_model(model), self.device)
            self.amp = passed
            self.args.amp = passed
            self.scaler = device_probe.grad_scaler(enabled=passed)
        record = self.device_defaults.record(amp=self.args.amp, amp_check=check)
        LOGGER.info(trained_with(self.settings, record, torch.get_num_threads(), check))
        self.beats.device(record)
        # Ultralytics wrote args.yaml in its __init__, before the device was decided for.
        YAML.save(Path(self.save_dir) / RunDir.train_args.name, vars(self.args))

    def resume_training(self, ckpt: Optional[Dict[str, Any]]) -> None:
        """Ultralytics' resume from an epoch-end checkpoint; an exact continuation from a mid-epoch one.

        AMP is settled first (see the module docstring): the scaler must be the real one before its state is loaded.
        """
        self._settle_amp()
        if self.resume and ckpt is not None and midepoch.position_of(ckpt) is not None:
            self.midepoch.restore(self, ckpt)
        else:
            super().resume_training(ckpt)
        if self.resume and ckpt is not None:
            checkpoint.trim_results(checkpoint.run_of(self.wdir), self.start_epoch)

    def preprocess_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        self.midepoch.before_batch(self, batch)
        return super().preprocess_batch(batch)

    def optimizer_step(self) -> None:
        super().optimizer_step()
        self.midepoch.after_optimizer_step()

    def get_dataloader(
        self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train"
    ) -> loader.ProfileDataLoader:
        base = super().get_dataloader(dataset_path, batch_size, rank, mode)
        return loader.rebuild(
            base,
            workers=int(self.settings.workers),  # decided for the device in __init__
            multiprocessing_context=self.settings.multiprocessing_context,
            persistent_workers=self.settings.persistent_workers,
            prefetch_factor=self.settings.prefetch_factor,
            pin_memory=self.settings.pin_memory,
            network_log=self.settings.network_log,
            train=mode == "train",
            seed=self.args.seed,
        )

    def validate(self) -> Tuple[Any, Any]:
        result = super().validate()
        self.beats.validated()
        faults.point("val_end", epoch=self.epoch + 1)
        return result

    def save_model(self) -> bool:
        """Ultralytics' save, into a staging directory; then fsync and rename over the real files."""
        self.beats.saving()
        weights, last, best = self.wdir, self.last, self.best
        staging = checkpoint.staging_dir(weights)
        self.wdir, self.last, self.best = staging, staging / last.name, staging / best.name
        try:
            saved = super().save_model()
        finally:
            self.wdir, self.last, self.best = weights, last, best
        checkpoint.publish(staging, weights, epoch=self.epoch + 1)
        midepoch.discard(weights)  # superseded by the epoch-end last.pt
        self.beats.saved()
        return saved

    def final_eval(self) -> None:
        """Ultralytics' final evaluation, with the optimizer-stripping writes made atomic."""
        self.beats.saving()
        files = checkpoint.run_of(self.wdir).files
        ckpt = checkpoint.strip_atomic(self.last) if files.stat(self.last).value is not None else {}
        if files.stat(self.best).value is not None:
            checkpoint.strip_atomic(self.best, updates={"train_results": ckpt.get("train_results")})
        self.beats.saved()
        if files.stat(self.best).value is None:
            return
        LOGGER.info(f"\nValidating {self.best}...")
        self.beats.validation_starts()
        validator: Any = self.validator
        validator.args.plots = self.args.plots
        validator.args.compile = False
        metrics = validator(model=self.best)
        metrics.pop("fitness", None)
        self.metrics = metrics
        self.epoch += 1
        self.run_callbacks("on_fit_epoch_end")
        self.epoch -= 1
