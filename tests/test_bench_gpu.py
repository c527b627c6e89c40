"""bench/gpu.py in its quick CPU mode: the variants asked for train and every figure it reports is there and positive.

Three of the five: bare (its own code path), fast-compile (a trainbox profile, with compile run eagerly) and safe (no
workers). fast and balanced go through the same code as those two with other settings, which the profile tests
check; each tiny run costs about 30 CPU-seconds, and the suite runs on two cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervised import REPO

VARIANTS = ("bare", "fast-compile", "safe")
FIGURES = ("epoch_s", "first_batch_s", "peak_mib", "wall_s", "speed")


@pytest.mark.training
def test_quick_cpu_bench_reports_the_variants_asked_for(tmp_path: Path) -> None:
    bench = str(REPO / "bench" / "gpu.py")
    command = [sys.executable, bench, "--device", "cpu", "--quick", "--variants", ",".join(VARIANTS), "--out", str(tmp_path)]
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
    assert f"python bench/gpu.py --device cpu --variants {','.join(VARIANTS)} --quick" in markdown, markdown[:400]
    assert "| safe |" in markdown
