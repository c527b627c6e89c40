"""``python -m train doctor`` handler on recorded trees: one line per check, exit status 1 on a failure."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import List

import pytest

from tests.doctor.conftest import host
from train.doctor import cli


def _run(argv: List[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    status = cli.main(parser.parse_args(argv))
    return status, capsys.readouterr().out


def test_rx5600xt_passes(capsys: pytest.CaptureFixture) -> None:
    status, out = _run(["--root", str(host("rx5600xt")), "--no-docker", "--min-free-gib", "1"], capsys)
    assert status == 0, out
    assert "gfx1010, 36 CUs" in out
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0; configured" in out
    assert "MIOpen asks for gfx1030_18.kdb; the ROCm image provides it" in out
    assert out.rstrip().endswith("all checks passed")


def test_failure_ends_its_line_with_the_fix(host_copy, capsys: pytest.CaptureFixture) -> None:
    root: Path = host_copy("rx5600xt")
    shutil.rmtree(root / "sys/module/amdgpu")
    status, out = _run(["--root", str(root), "--no-docker", "--flavor", "rocm", "--min-free-gib", "1"], capsys)
    assert status == 1
    (line,) = [text for text in out.splitlines() if text.startswith("FAIL")]
    assert line.startswith("FAIL  amdgpu: ") and "-> fix: sudo modprobe amdgpu" in line
