"""Shared fixtures for the Ultralytics runner tests: demo data, child runs, checkpoint reads.

Everything trains for real (yolov8n.yaml on CPU, 32 images of 64 px, batch 8)
in child processes; test modules import Ultralytics only inside tests, after
the offline environment is in place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

from tests.supervised import REPO, TEST_IMAGES
from trainbox.yolo import offline
from trainbox.yolo.demo_data import write_demo_dataset

#: Tiny, fast training arguments shared by every run.
TINY = ("imgsz=64", "batch=8", "device=cpu", "plots=False")


@pytest.fixture(scope="session", autouse=True)
def offline_ultralytics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test process reaches no network either: Ultralytics' offline environment, set before tests import it."""
    return offline.prepare_environment(tmp_path_factory.mktemp("ultralytics-config"))


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data.yaml of the demo dataset at the tests' size (tests.supervised.TEST_IMAGES: 32 train, 8 val, 96 px)."""
    return write_demo_dataset(tmp_path_factory.mktemp("demo"), *TEST_IMAGES)


@dataclass
class ChildRun:
    code: int
    output: str
    run_dir: Path

    @property
    def last(self) -> Path:
        return self.run_dir / "train" / "weights" / "last.pt"

    def results_epochs(self) -> List[int]:
        """The ``epoch`` column of results.csv (1-based, one row per completed epoch)."""
        lines = (self.run_dir / "train" / "results.csv").read_text().splitlines()
        return [int(float(line.split(",")[0])) for line in lines[1:]]

    def beat(self) -> Optional[Dict[str, Any]]:
        path = self.run_dir / "heartbeat.json"
        return json.loads(path.read_text()) if path.exists() else None


def child_env(run_dir: Path, attempt: int = 0, fault: str = "", **extra: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("TRAIN_FAULT", None)
    env.update(
        TRAIN_RUN_DIR=str(run_dir),
        TRAIN_HEARTBEAT_FILE=str(run_dir / "heartbeat.json"),
        TRAIN_ATTEMPT=str(attempt),
        TRAIN_PROFILES_DIR=str(REPO / "env" / "profiles"),
        **extra,
    )
    if fault:
        env["TRAIN_FAULT"] = fault
    return env


def run_child(
    run_dir: Path, profile: str, args: Sequence[str], attempt: int = 0, fault: str = "", timeout: float = 300
) -> ChildRun:
    """One unsupervised attempt of ``python -m trainbox.yolo``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "trainbox.yolo", "--profile", profile, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(run_dir, attempt, fault),
        cwd=REPO,
        timeout=timeout,
    )
    return ChildRun(done.returncode, done.stdout, run_dir)


def load_checkpoint(path: Path) -> Dict[str, Any]:
    """A checkpoint's dictionary (needs torch and Ultralytics in the test process)."""
    from ultralytics.utils.patches import torch_load

    return torch_load(path, map_location="cpu")
