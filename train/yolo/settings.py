"""What one attempt applies: the profile, with the ``workers``/``val``/``amp``/``compile`` overrides (no torch here).

``workers`` and ``amp`` may still be ``auto`` here; the trainer resolves them
(and ``pin_memory``) once it knows its device (:func:`for_device`).

The settings reach Ultralytics' DDP ranks through the environment
(``TRAIN_RUN_SETTINGS``, JSON): ``device=0,1`` makes Ultralytics start
``torch.distributed.run`` on a generated script that rebuilds the trainer
class with Ultralytics' arguments only, and every rank inherits the launcher's
environment.

Ultralytics prints its own argument list as its trainer starts, before the
device is known and so before ``workers`` and ``amp`` are decided for it: its
``amp=True ... workers=8`` are its defaults, not what trains. So the trainer
follows it with one line that says what did (:func:`trained_with`): ``trained
with amp=False, workers=0, ...``, which profile decided it on which device,
and why each value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

from trainbox.yolo.args import PROFILE_KEYS
from trainbox.yolo.device_defaults import DeviceDefaults
from trainbox.yolo.profiles import Profile


@dataclasses.dataclass(frozen=True)
class RunSettings:
    workers: Union[int, str]
    multiprocessing_context: Optional[str]
    persistent_workers: bool
    prefetch_factor: Optional[int]
    val: bool
    amp: Union[bool, str]
    compile: Union[bool, str]
    conv_backend: str
    cpu_threads: Optional[int]
    startup_timeout: float
    val_timeout: float
    save_timeout: float
    midepoch_checkpoint_s: float = 0.0
    midepoch_checkpoint_batches: int = 0
    network_log: Optional[Path] = None
    #: None until :func:`for_device` decides it.
    pin_memory: Optional[bool] = None
    #: The profile these settings come from (for the line that says what trained).
    profile: Optional[str] = None
    #: Workers on an NVIDIA GPU (the profile's; None where ``workers=`` was given or the profile has none).
    cuda_workers: Union[int, str, None] = None

    def publish(self) -> None:
        """Put these settings into this process's environment, for the DDP ranks it starts (:func:`inherited`)."""
        os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(self), default=str)


#: Where a DDP rank finds its attempt's settings (written by :meth:`RunSettings.publish`).
SETTINGS_ENV = "TRAIN_RUN_SETTINGS"


def inherited() -> RunSettings:
    """The settings the launcher published (in a DDP rank); RuntimeError when there are none."""
    text = os.environ.get(SETTINGS_ENV)
    if not text:
        raise RuntimeError(f"no {SETTINGS_ENV} in the environment: a trainbox DDP rank is started by `trainbox run`")
    fields = json.loads(text)
    if fields.get("network_log") is not None:
        fields["network_log"] = Path(fields["network_log"])
    return RunSettings(**fields)


def from_profile(
    profile: Profile, overrides: Dict[str, Any], startup_timeout: float, network_log: Optional[Path] = None
) -> RunSettings:
    """``overrides`` (validated KEY=VALUE) win over the profile for the keys in ``PROFILE_KEYS``."""
    chosen = {key: overrides.get(key, getattr(profile, key)) for key in PROFILE_KEYS}
    return RunSettings(
        workers=chosen["workers"],
        multiprocessing_context=profile.multiprocessing_context,
        persistent_workers=profile.persistent_workers,
        prefetch_factor=profile.prefetch_factor,
        val=chosen["val"],
        amp=chosen["amp"],
        compile=chosen["compile"],
        conv_backend=profile.conv_backend,
        cpu_threads=profile.cpu_threads,
        startup_timeout=startup_timeout,
        val_timeout=profile.val_timeout,
        save_timeout=profile.save_timeout,
        midepoch_checkpoint_s=profile.midepoch_checkpoint_s,
        midepoch_checkpoint_batches=profile.midepoch_checkpoint_batches,
        network_log=network_log,
        profile=profile.name,
        cuda_workers=None if "workers" in overrides else profile.cuda_workers,
    )


def for_device(settings: RunSettings, defaults: DeviceDefaults) -> RunSettings:
    """``settings`` with ``workers``, ``amp`` and ``pin_memory`` as decided for the device found."""
    return dataclasses.replace(
        settings, workers=defaults.workers.value, amp=defaults.amp.value, pin_memory=defaults.pin_memory.value
    )


def trained_with(settings: RunSettings, record: Dict[str, Any], cpu_threads: int, amp_check: Optional[str] = None) -> str:
    """The one line that says what trains: values, then the profile and device that decided them, and why.

    ``record`` is the attempt's ``device`` event (:meth:`trainbox.yolo.device_defaults.DeviceDefaults.record`),
    ``amp_check`` the offline AMP check's outcome when one ran.
    """
    values = f"amp={record['amp']}, workers={record['workers']}, pin_memory={record['pin_memory']}, cpu_threads={cpu_threads}"
    reasons = f"amp: {amp_check or record['amp_reason']}; workers: {record['workers_reason']}; {record['pin_memory_reason']}"
    return (
        f"trainbox: trained with {values} (decided by profile {settings.profile or '?'} for {record['description']}: "
        f"{reasons}). Ultralytics' argument list above shows its own defaults for amp and workers, not these."
    )
