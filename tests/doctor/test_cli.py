"""``python -m trainbox doctor`` handler on recorded trees: one line per check, exit status 1 on a failure."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import List

import pytest

from tests.hosts import H100_DRIVER, host
from trainbox.doctor import cli


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


def test_h100_host_defaults_to_cuda(h100_host, capsys: pytest.CaptureFixture) -> None:
    status, out = _run(["--root", str(h100_host()), "--no-docker", "--min-free-gib", "1"], capsys)
    assert status == 0, out
    assert f"ok    nvidia driver: driver {H100_DRIVER} runs CUDA 13.2" in out
    assert "the cuda image needs about 1 GiB" in out


def test_old_driver_fails_on_the_cli(h100_host, capsys: pytest.CaptureFixture) -> None:
    status, out = _run(["--root", str(h100_host(driver="535.183.01")), "--no-docker", "--min-free-gib", "1"], capsys)
    assert status == 1
    (line,) = [text for text in out.splitlines() if text.startswith("FAIL")]
    assert line.endswith("-> fix: upgrade the NVIDIA driver to >= 580.65.06 (CUDA 13.2 in the image)")


def test_flavor_choices_and_default_in_the_help() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["--flavor", "cuda"]).flavor == "cuda"
    help_text = " ".join(parser.format_help().split())
    assert "{rocm,cuda,cpu}" in help_text
    assert "rocm when /dev/kfd exists, cuda when /dev/nvidiactl exists, else cpu" in help_text
