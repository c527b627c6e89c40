"""bench/gpu.py in its quick CPU mode: the variants asked for train and every figure it reports is there and positive.

Three of the five: bare (its own code path), fast-compile (a trainbox profile, with compile run eagerly) and safe (no
workers). fast and balanced go through the same code as those two with other settings, which the profile tests
check; each tiny run costs about 30 CPU-seconds, and the suite runs on two cores."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from tests.supervised import REPO

VARIANTS = ("bare", "fast-compile", "safe")
FIGURES = ("epoch_s", "first_batch_s", "peak_mib", "wall_s", "speed", "phase_imports", "phase_workers", "phase_first_step")
PHASES = ("supervisor", "imports", "probe", "scan", "setup", "workers", "first_step")


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
        phases = sum(row[f"phase_{key}"]["median"] for key in PHASES)
        assert phases == pytest.approx(row["first_batch_s"]["median"], abs=0.01), f"{name}: phases do not add up"
    assert result["variants"]["bare"]["speed"]["median"] == 1.0
    for name in VARIANTS[1:]:
        device = result["variants"][name]["device"]
        assert (device["kind"], device["amp"], device["pin_memory"]) == ("cpu", False, False)
    assert result["variants"]["fast-compile"]["compile_off"] is True
    markdown = (tmp_path / "gpu-quick.md").read_text()
    assert f"python bench/gpu.py --device cpu --variants {','.join(VARIANTS)} --quick" in markdown, markdown[:400]
    assert "| safe |" in markdown


def _bench_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_marks_give_steady_speed_loader_wait_and_fixed_costs() -> None:
    """Made-up marks of a 2-epoch run of 20 batches of 4 images, 0.1 s each (0.02 s of it waiting for data), with a
    1 s validation and a 0.5 s save after each epoch: the figures are those, whatever the epochs' first batches took."""
    phases = _bench_module("bench_phases", REPO / "bench" / "phases.py")
    marks, now = [("on_pretrain_routine_start", 1.0), ("on_pretrain_routine_end", 3.0)], 4.0
    for _ in range(2):
        marks.append(("on_train_epoch_start", now))
        now += 2.0  # the epoch's first batch waits for its workers
        for _ in range(20):
            marks += [("on_train_batch_start", now + 0.02), ("on_train_batch_end", now + 0.1)]
            now += 0.1
        marks += [("on_val_start", now), ("on_val_end", now + 1.0), ("on_model_save", now + 1.5), ("on_fit_epoch_end", now + 1.5)]
        now += 1.5
    record = {"started": 0.5, "marks": marks}
    steady = phases.steady(record, batch=4)
    assert steady["imgs_per_s"] == pytest.approx(40.0) and steady["loader_wait_share"] == pytest.approx(0.2)
    fixed = phases.fixed_costs(record, steady["batch_s"])
    assert fixed == pytest.approx({"total": 3.5, "val": 1.0, "save": 0.5, "boundary": 2.0})
    first = phases.first_batch(record, launched=0.0)
    assert first["total"] == pytest.approx(6.1) and first["workers"] == pytest.approx(2.02)
    assert sum(value for key, value in first.items() if key != "total") == pytest.approx(first["total"])


def test_the_marks_hook_runs_once_a_module_has_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marks = _bench_module("bench_marks", REPO / "bench" / "marks" / "sitecustomize.py")
    (tmp_path / "freshly_loaded.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: List[int] = []
    finder = marks.AfterImport({"freshly_loaded": lambda module: seen.append(module.VALUE)})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "freshly_loaded", raising=False)
    assert importlib.import_module("freshly_loaded").VALUE == 1 and seen == [1]
