"""GPU state for incident reports: real commands on PATH, a recorded kernel log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.paths import FIXTURES
from trainbox.system import gpu_state


def _program(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_kernel_lines_keep_gpu_messages_only() -> None:
    lines = gpu_state.gpu_kernel_lines((FIXTURES / "kernel/amdgpu-ring-timeout.txt").read_text())
    text = "\n".join(lines)
    for wanted in (
        "ring gfx_0.0.0 timeout",
        "GPU reset begin",
        "page fault",
        "added device 1002:731f",
        "blocked for more than 120 seconds",
        "hung_task_timeout_secs",
        "NVRM: Xid",
    ):
        assert wanted in text
    for unwanted in ("bounce buffering", "IRQ sharing", "xhci_hcd", "EXT4-fs"):
        assert unwanted not in text
    assert gpu_state.gpu_kernel_lines(text, limit=2) == lines[-2:]


def test_gpu_state_here_says_what_is_missing() -> None:
    state = gpu_state.read()
    text = state.smi
    for section in ("== rocm-smi\n", "== nvidia-smi\n"):
        assert section in text
    assert state.kernel.startswith("== kernel messages")
    for tool in ("rocm-smi", "nvidia-smi"):
        path_has_it = any((Path(d) / tool).exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d)
        assert (f"{tool}: not installed" in text) is not path_has_it


def test_smi_output_and_a_hung_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _program(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI 550.54  GPU 0: RTX 3070  8MiB / 8192MiB'")
    _program(tmp_path, "rocm-smi", "sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    started = time.monotonic()
    state = gpu_state.read(timeout=2)
    assert time.monotonic() - started < 5
    assert "rocm-smi: no answer within" in state.smi
    assert "rocm-smi --showpids: skipped, the time budget is spent" in state.smi
    assert "nvidia-smi: skipped, the time budget is spent" in state.smi
    assert "kernel messages" in state.kernel


def test_smi_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _program(tmp_path, "rocm-smi", "echo 'ERROR: GPU[0] : Unable to open /dev/kfd' >&2; exit 2")
    _program(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI 550.54  GPU 0: RTX 3070'")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    text = gpu_state.read().smi
    assert "rocm-smi: failed: ERROR: GPU[0] : Unable to open /dev/kfd" in text
    assert "== nvidia-smi\nNVIDIA-SMI 550.54  GPU 0: RTX 3070\n" in text
