"""Recorded host trees (tests/fixtures/hosts) and writable copies of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTS = FIXTURES / "hosts"
HOST_NAMES = ("rx5600xt", "rx5700xt", "rx6800xt", "no-gpu", "nvidia")


def host(name: str) -> Path:
    path = HOSTS / name
    assert path.is_dir(), f"fixture host tree {path} is missing"
    return path


@pytest.fixture
def host_copy(tmp_path: Path):
    """Copy a recorded tree into tmp_path so a test can change modes and groups."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(host(name), target)
        return target

    return copy
