"""``python -m trainbox demo``: the demo's dataset and arguments, assembled for ``run`` (train/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict

import pytest

from trainbox import cli
from trainbox.rundir.layout import RunDir
from trainbox.yolo.demo_data import DEMO_TRAIN_ARGS


def test_demo_trains_its_dataset_with_its_arguments_under_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, argparse.Namespace] = {}

    def run(args: argparse.Namespace) -> int:
        seen["args"] = args
        return 0

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "epochs=2"]) == 0
    data = RunDir(tmp_path / "run").demo_data / "data.yaml"
    assert data.is_file() and seen["args"].profile == "safe"
    kept = [pair for pair in DEMO_TRAIN_ARGS if not pair.startswith("epochs=")]
    assert seen["args"].overrides == [*kept, "epochs=2", f"data={data}"], "the user's epochs= replaces the demo's"


def test_demo_refuses_a_dataset_of_its_own(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "data=parts/data.yaml"]) == 2
    assert capsys.readouterr().err == (
        "trainbox: error: demo trains its own dataset: for yours, `python -m trainbox run --profile NAME data=PATH`\n"
    )
    assert not (tmp_path / "run").exists()


def test_demo_refuses_bad_input_before_writing_its_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "epochs=abc"]) == 2
    assert capsys.readouterr().err == "trainbox: error: epochs=abc: expected int\n"
    assert cli.main(["demo", "--run-dir", str(tmp_path / "run"), "--profile", "saef"]) == 2
    assert "unknown profile 'saef'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
