"""What one attempt applies: the profile, with the ``workers``/``val``/``amp``/``compile`` overrides (no torch here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, Optional, Union

from trainbox.profiles import Profile
from trainbox.yolo.args import PROFILE_KEYS


@dataclasses.dataclass(frozen=True)
class RunSettings:
    workers: int
    multiprocessing_context: Optional[str]
    persistent_workers: bool
    prefetch_factor: Optional[int]
    val: bool
    amp: bool
    compile: Union[bool, str]
    conv_backend: str
    cpu_threads: Optional[int]
    startup_timeout: float
    val_timeout: float
    save_timeout: float
    midepoch_checkpoint_s: float = 0.0
    midepoch_checkpoint_batches: int = 0
    network_log: Optional[Path] = None


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
    )
