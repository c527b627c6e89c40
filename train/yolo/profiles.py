"""Training profiles: validated loader and safety settings in ``env/profiles/*.yaml``.

A profile names everything that used to be changed by hand, one night at a
time: DataLoader workers and their start method, persistence and prefetch,
validation on/off, mixed precision, CPU threads, the stall budgets, and the
``fallback`` profile the next attempt uses after a stall.

``workers`` and ``amp`` may be ``auto``: decided per device by the training
process once it knows its device (:mod:`trainbox.yolo.device_defaults` holds
the rules; this module only accepts the word).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainbox import SOURCE_ROOT
from trainbox.errors import UserError
from trainbox.rundir.events import Cause, Retry
from trainbox.supervise.settings import COMPILE_CAP, IDLE_TIMEOUT, SLOW_RATIO

PROFILES_DIR_ENV = "TRAIN_PROFILES_DIR"
#: A setting decided per device at run time (workers, amp).
AUTO = "auto"


class ProfileError(UserError):
    """A profile that cannot be used; the message is one line naming file and field."""


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    workers: Union[int, Literal["auto"]] = Field(
        description="DataLoader worker processes (0 = load in the main process), or auto: decided per device"
    )
    cuda_workers: Optional[Union[int, Literal["auto"]]] = Field(
        default=None, description="workers on an NVIDIA GPU, where they differ from workers (None: the same)"
    )
    multiprocessing_context: Optional[Literal["fork", "spawn", "forkserver"]] = Field(
        default=None, description="how workers start; None keeps PyTorch's default (fork on Linux)"
    )
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = Field(default=None, ge=1, description="batches loaded ahead per worker")
    val: bool = True
    amp: Union[bool, Literal["auto"]] = Field(default=False, description="mixed precision, or auto: decided per device")
    cpu_threads: Optional[int] = Field(default=None, ge=1, description="torch intra-op threads; None = all cores")
    compile: bool = Field(default=False, description="torch.compile the model; its compile time counts as startup")
    conv_backend: Literal["miopen", "native"] = Field(
        default="miopen",
        description="miopen: the vendor library (MIOpen on ROCm, cuDNN on CUDA); native: PyTorch's own kernels, "
        "no kernel compilation at start (torch.backends.cudnn.enabled = False)",
    )
    midepoch_checkpoint_s: float = Field(
        default=300.0, ge=0, description="write a mid-epoch checkpoint after this many seconds (0: never)"
    )
    midepoch_checkpoint_batches: int = Field(
        default=0, ge=0, description="... or after this many batches, whichever comes first (0: never)"
    )
    startup_timeout: float = Field(gt=0, description="seconds until the first beat and for the first batch")
    stall_timeout: float = Field(gt=0, description="seconds allowed between beats")
    val_timeout: float = Field(gt=0, description="seconds a validation pass may stay silent")
    save_timeout: float = Field(gt=0, description="seconds a checkpoint save may stay silent")
    # Defaults from the one settings table (--idle-timeout, --compile-cap, --slow-ratio), which the options override.
    idle_timeout: float = Field(default=IDLE_TIMEOUT.number, ge=0, description=IDLE_TIMEOUT.help)
    compile_cap: float = Field(default=COMPILE_CAP.number, ge=0, description=COMPILE_CAP.help)
    slow_ratio: float = Field(default=SLOW_RATIO.number, gt=1, allow_inf_nan=False, description=SLOW_RATIO.help)
    stall_retry: Dict[str, List[Retry]] = Field(
        default_factory=dict,
        description="cause -> retries for its 1st, 2nd, ... stall in a row, replacing trainbox.supervise.policy.RETRIES' row",
    )
    fallback: Optional[str] = Field(default=None, description="profile the next attempt uses after a stall")
    expected_speed: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="speed relative to the other profiles: the ladder policy's prior until the run measures it",
    )
    startup_fallback: Optional[str] = Field(
        default=None,
        description="when there is no fallback left: the profile used after a stall before the first batch",
    )

    @field_validator("workers", "cuda_workers", mode="before")
    @classmethod
    def _workers_or_auto(cls, value: Any) -> Any:
        if value is None or value == AUTO or isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError(f"expected a whole number of workers (0 or more) or {AUTO}, got {value!r}")

    @field_validator("amp", mode="before")
    @classmethod
    def _bool_or_auto(cls, value: Any) -> Any:
        if value == AUTO or isinstance(value, bool):
            return value
        raise ValueError(f"expected true, false or {AUTO}, got {value!r}")

    @model_validator(mode="after")
    def _loader_options_need_workers(self) -> Profile:
        if self.workers == 0 and not self.cuda_workers:
            for field in ("multiprocessing_context", "persistent_workers", "prefetch_factor"):
                if getattr(self, field):
                    raise ValueError(f"{field} needs workers > 0 (workers is 0)")
        if self.compile and self.workers and self.multiprocessing_context not in ("spawn", "forkserver"):
            raise ValueError("compile needs spawn or forkserver workers (fork after compiling deadlocks)")
        if self.name in (self.fallback, self.startup_fallback):
            raise ValueError("a fallback names the profile itself")
        causes = [c.value for c in Cause]
        for cause, retries in self.stall_retry.items():
            if cause not in causes:
                raise ValueError(f"stall_retry: unknown cause {cause!r}: choose from {', '.join(causes)}")
            if not retries:
                raise ValueError(f"stall_retry: {cause}: give at least one retry")
        return self


def default_profiles_dir() -> Path:
    """``$TRAIN_PROFILES_DIR``, else ``env/profiles`` of this checkout or install."""
    configured = os.environ.get(PROFILES_DIR_ENV)
    if configured:
        return Path(configured)
    return SOURCE_ROOT / "env" / "profiles"


def _one_line(path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(profile)"
    message = first["msg"].replace("Value error, ", "")
    return f"{path}: field '{field}': {message}"


def load_file(path: Path) -> Profile:
    """Load one profile file; its name is the file's stem."""
    try:
        data = yaml.safe_load(path.read_text())  # not the run directory: a profile
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ProfileError(f"{path}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    if "name" in data and data["name"] != path.stem:
        raise ProfileError(f"{path}: field 'name': must match the file name ({path.stem!r}) or be left out")
    try:
        return Profile(**{**data, "name": path.stem})
    except ValidationError as exc:
        raise ProfileError(_one_line(path, exc)) from None


def available(directory: Optional[Path] = None) -> List[str]:
    directory = directory or default_profiles_dir()
    return sorted(p.stem for p in directory.glob("*.yaml"))  # not the run directory: the profiles


def load(name: str, directory: Optional[Path] = None) -> Profile:
    """Load profile ``name`` and check that its fallback chain ends without a loop."""
    directory = directory or default_profiles_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():  # not the run directory: a profile
        known = available(directory)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ProfileError(
            f"unknown profile {name!r}{hint}: choose one of {', '.join(known) or 'none'} (profiles in {directory})"
        )
    profile = load_file(path)
    fallback_chain(profile, directory)
    return profile


def fallback_chain(profile: Profile, directory: Optional[Path] = None) -> List[Profile]:
    """``profile``, each ``fallback`` in turn, then the last one's ``startup_fallback`` chain if any."""
    directory = directory or default_profiles_dir()
    chain = [profile]
    seen: Dict[str, Profile] = {profile.name: profile}
    while True:
        last = chain[-1]
        field = "fallback" if last.fallback else "startup_fallback"
        name = getattr(last, field)
        if not name:
            return chain
        where = directory / f"{last.name}.yaml"
        if name in seen:
            raise ProfileError(f"{where}: field '{field}': loops back to {name!r}")
        path = directory / f"{name}.yaml"
        if not path.is_file():  # not the run directory: a profile
            raise ProfileError(f"{where}: field '{field}': no profile {name!r}")
        seen[name] = load_file(path)
        chain.append(seen[name])
