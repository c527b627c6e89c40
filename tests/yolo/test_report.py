"""The report of a real Ultralytics run that hung after validation, was killed and resumed (``python -m trainbox run``)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from tests.supervised import train_cli
from tests.yolo.conftest import TINY
from tests.yolo.test_run import BUDGETS
from trainbox.rundir.layout import RunDir
from trainbox.view import runview


def test_report_of_a_hung_and_resumed_ultralytics_run(tmp_path: Path, demo_data: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["run", "--profile", "safe", "--run-dir", str(run_dir), *BUDGETS, f"data={demo_data}", "epochs=3", *TINY]
    done = train_cli(args, run_dir=run_dir, env={"TRAIN_FAULT": "sleep@val_end,attempt=0,epoch=2"}, timeout=480)
    assert done.code == 0, done.stderr[-3000:]
    assert done.kinds() == ["start", "device", "stall", "restart", "start", "device", "exit"]

    view = runview.read(run_dir)
    assert [row["epoch"] for row in view.results] == [1, 2, 3], "Ultralytics' results.csv, one row per epoch across attempts"
    assert {"train/box_loss", "val/cls_loss", "metrics/mAP50-95(B)"} <= set(view.results[-1])
    trained = [s for s in view.samples if s.get("phase") == "train" and s.get("imgs_per_s")]
    assert {s["attempt"] for s in trained} == {0, 1}, "throughput samples from both attempts"
    phases = {phase for s in view.samples for phase in s.get("silences", {})}
    assert {"startup", "setup", "train"} <= phases
    (stall,) = view.stalls
    assert stall.phase == "train" and stall.incident is not None and view.loss(stall).regained

    page = RunDir(run_dir).report.read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert page.count("data:image/png;base64,") == 3
    assert re.search(r"epochs in results.csv\s+3 of 3", text) and "last metrics/mAP50-95(B)" in text
    assert re.search(r"restarts, stalls, crashes\s+1, 1, 0", text) and re.search(r"final profile\s+safe", text)
    assert f"stall {stall.budget_s:g} s" in text and stall.incident.name in text
