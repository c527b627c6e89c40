"""bench/gpu.py in its quick CPU mode: every variant trains and every figure it reports is there and positive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervised import REPO

VARIANTS = ("bare", "fast", "fast-compile", "balanced", "safe")
FIGURES = ("epoch_s", "first_batch_s", "peak_mib", "wall_s", "speed")


@pytest.mark.training
def test_quick_cpu_bench_reports_every_variant(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    result = json.loads((tmp_path / "gpu-quick.json").read_text())
    assert set(result["variants"]) == set(VARIANTS)
    for name, row in result["variants"].items():
        for figure in FIGURES + (() if name == "bare" else ("supervisor_cpu_share",)):
            assert row[figure]["n"] == 1 and row[figure]["min"] > 0, f"{name}: {figure} = {row[figure]}"
        assert row["network_refusals"] == 0, f"{name} reached for the network"
    assert result["variants"]["bare"]["speed"]["median"] == 1.0
    for name in VARIANTS[1:]:
        device = result["variants"][name]["device"]
        assert (device["kind"], device["amp"], device["pin_memory"]) == ("cpu", False, False)
    assert result["variants"]["fast-compile"]["compile_off"] is True
    markdown = (tmp_path / "gpu-quick.md").read_text()
    assert "python bench/gpu.py --device cpu --quick" in markdown and "| fast |" in markdown
