"""One training attempt: ``python -m trainbox.yolo --profile NAME [--run-dir DIR] [KEY=VALUE ...]``.

Environment (set by ``python -m trainbox run``): ``TRAIN_RUN_DIR`` (unless
``--run-dir``), ``TRAIN_HEARTBEAT_FILE``, ``TRAIN_ATTEMPT``,
``TRAIN_STARTUP_TIMEOUT`` (seconds the setup phase may stay silent; default:
the profile's ``startup_timeout``), ``TRAIN_PROFILES_DIR``, ``TRAIN_FAULT``.

Layout (named in ``trainbox.rundir.layout.RunDir``): Ultralytics writes to ``RUN_DIR/train`` (``project=RUN_DIR``,
``name=train``, ``exist_ok``); its config directory (settings, fonts) is
``RUN_DIR/ultralytics``; blocked network attempts go to
``RUN_DIR/network.log``.

Each attempt decides from ``RUN_DIR/train/weights/last.pt``: absent, train
from scratch; resumable, Ultralytics resume (per epoch) — or, when
``weights/midepoch.pt`` continues past it, an exact continuation inside the
epoch (``trainbox.yolo.midepoch``); every epoch trained
but not finalised (a kill between the last save and the final strip), strip
and finish; already stripped, the run is complete. Exit status: 0 when the
run is complete, 2 for bad arguments, a bad profile or an unusable
checkpoint (one line on stderr), otherwise the error's traceback and 1.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from trainbox import errors, heartbeat
from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir
from trainbox.yolo import checkpoint, forkserver, offline, profiles
from trainbox.yolo.args import PROFILE_KEYS, validate_overrides
from trainbox.yolo.settings import from_profile

STARTUP_TIMEOUT_ENV = "TRAIN_STARTUP_TIMEOUT"
DEFAULT_MODEL = "yolov8n.yaml"


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainbox.yolo", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="profile name (env/profiles/NAME.yaml)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: $TRAIN_RUN_DIR")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Ultralytics train arguments")
    return parser.parse_args(argv)


def _startup_timeout(profile: profiles.Profile) -> float:
    value = os.environ.get(STARTUP_TIMEOUT_ENV)
    if not value:
        return profile.startup_timeout
    try:
        seconds = float(value)
    except ValueError:
        raise UserError(f"{STARTUP_TIMEOUT_ENV}={value!r}: expected seconds") from None
    if seconds <= 0:
        raise UserError(f"{STARTUP_TIMEOUT_ENV}={value!r}: must be positive")
    return seconds


def run_attempt(profile: profiles.Profile, overrides: Dict[str, Any], run_dir: Path, startup_timeout: float) -> str:
    """Run (or resume, or finish) the training in ``run_dir``; return a one-line outcome."""
    run = RunDir(run_dir)
    network_log = run.network_log
    offline.install_network_guard(network_log)
    offline.prepare_environment(run.ultralytics)
    if profile.multiprocessing_context == "forkserver" and (overrides.get("workers", profile.workers) or profile.cuda_workers):
        forkserver.start()  # its imports run while this process imports Ultralytics and builds the model

    from ultralytics import YOLO

    from trainbox.yolo.trainer import ProfiledDetectionTrainer

    offline.disable_settings_sync()
    settings = from_profile(profile, overrides, startup_timeout, network_log)
    last = run.last_checkpoint
    weights = last.parent
    state, ckpt = checkpoint.resume_state(run)
    # First beat only now: an unusable checkpoint ends the attempt before it, as a configuration error.
    heartbeat.beat("setup", timeout=settings.startup_timeout, force=True)
    if state is checkpoint.Resume.FINISHED:
        return f"run complete: {last} is a finished checkpoint; nothing to train"
    if state is checkpoint.Resume.TRAINED:
        stripped = checkpoint.strip_atomic(last)
        if run.files.stat(run.best_checkpoint).value is not None:
            checkpoint.strip_atomic(run.best_checkpoint, updates={"train_results": stripped.get("train_results")})
        return f"run complete: every epoch was trained; finalised {last}"

    from trainbox.yolo import midepoch

    last_epoch = ckpt["epoch"] if state is checkpoint.Resume.RESUME else None
    resume_from = midepoch.newer_than_last(run, last_epoch) or (last if state is checkpoint.Resume.RESUME else None)
    args = {key: value for key, value in overrides.items() if key not in PROFILE_KEYS}
    model = args.pop("model", DEFAULT_MODEL)
    # workers and amp are left to the trainer: it decides them for the device Ultralytics selects (device_defaults).
    args.update(
        **_deterministic(overrides),
        project=str(run.train.parent),
        name=run.train.name,
        exist_ok=True,
        val=settings.val,
        compile=settings.compile,
        resume=str(resume_from) if resume_from else False,
    )
    settings.publish()  # for the ranks of a DDP run (device=0,1), which Ultralytics starts through torchrun
    trainer = functools.partial(ProfiledDetectionTrainer, settings=settings)
    YOLO(model).train(trainer=trainer, **args)
    verb = f"resumed from {resume_from.name} and completed" if resume_from else "completed"
    return f"run {verb}: checkpoints in {weights}"


def _deterministic(overrides: Dict[str, Any]) -> Dict[str, Any]:
    """``deterministic=False`` where Ultralytics' default (True) would only warn, unless the user gave ``deterministic=``.

    Ultralytics makes training deterministic only on torch >= 2.0; on an older torch (the CPU and ROCm images pin
    1.13.1, the last that runs on gfx1010: docs/containers.md) its ``deterministic=True`` changes nothing and warns "Upgrade to
    torch>=2.0.0 for deterministic training" at every attempt, about a version the user did not choose. ``False``
    is what that torch does anyway (``unset_deterministic``: its defaults), and ``args.yaml`` then says so.
    """
    from ultralytics.utils.torch_utils import TORCH_2_0

    return {} if TORCH_2_0 or "deterministic" in overrides else {"deterministic": False}


def main(argv: Optional[List[str]] = None) -> int:
    """The child's entry point; returns its exit status (see the module docstring)."""
    ns = _parse(argv)
    try:
        profile = profiles.load(ns.profile)
        overrides = validate_overrides(ns.overrides)
        run_dir_text = ns.run_dir or os.environ.get(heartbeat.RUN_DIR_ENV)
        if not run_dir_text:
            raise UserError(f"no run directory: pass --run-dir or set {heartbeat.RUN_DIR_ENV}")
        run_dir = Path(run_dir_text).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)  # not the run directory: its root, the user's own path
        startup_timeout = _startup_timeout(profile)
        outcome = run_attempt(profile, overrides, run_dir, startup_timeout)
    except UserError as exc:  # a bad profile, argument or checkpoint
        return errors.report(exc)
    print(f"trainbox: {outcome}", file=sys.stderr, flush=True)
    return 0
