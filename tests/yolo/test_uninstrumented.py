"""Ultralytics' own CLI, ``yolo train`` as it is (no trainbox code in it), supervised by its progress bar.

Offline as ``trainbox run`` makes it (the environment of :func:`trainbox.yolo.offline.prepare_environment`, set for
the session by tests/yolo/conftest.py), on the demo data. The hang comes from trainbox.faults' ``output`` site
(tests/fixtures/uninstrumented/sitecustomize.py): the main thread stops just before it draws a line of the first
epoch's bar, as a hung batch would leave it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.supervised import REPO, survivors, train_cli
from tests.yolo.conftest import TINY
from trainbox.errors import ExitCode

#: The hang comes at the first write after the first that showed epoch 1 of 2 in the train bar's first column
#: ("%11s" of "1/2", then the memory column's padding; a validation bar's count, "1/2 3.1it/s", has one space):
#: a later draw of epoch 1's bar, or its last. A count of lines cannot place it: Ultralytics draws its bars at most
#: every 0.1 s, so a fast machine draws fewer states than a slow one (the 52nd line end fell in epoch 1's bar on
#: 2 busy cores and in the validation's on a faster machine).
HANG = {"TRAIN_FAULT": "sleep@output,attempt=0,seen>=1", "TRAIN_FAULT_TEXT": "1/2  "}


def test_yolo_train_hung_in_its_first_epoch_is_found_restarted_and_finishes(tmp_path: Path, demo_data: Path) -> None:
    yolo = str(Path(sys.executable).parent / "yolo")
    command = [yolo, "train", "model=yolov8n.yaml", f"data={demo_data}", "epochs=2", *TINY, "workers=0", "amp=False"]
    command += [f"project={tmp_path}", "name=train", "exist_ok=True"]
    run_dir = tmp_path / "run"
    # yolo train has stretches without a counter (the optimizer stripped, the model fused for the final validation:
    # over 10 s on 2 busy cores), so the stall budget is long; the hung tree is idle, and the idle rule finds it.
    budgets = ["--startup-timeout", "120", "--stall-timeout", "60", "--idle-timeout", "10"]
    options = [*budgets, "--grace", "5", "--backoff", "0.5", "--quiet"]
    paths = [str(REPO / "tests" / "fixtures" / "uninstrumented"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(path for path in paths if path), **HANG}
    result = train_cli(["supervise", "--run-dir", str(run_dir), *options, "--", *command], run_dir, env)
    assert not survivors(run_dir)

    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert (stall["budget"], stall["rule"], stall["cause"]) == ("stall", "idle", "idle")
    assert stall["last_beat"]["pattern"] == "ultralytics"
    assert stall["at"].startswith("phase train, epoch 1 batch "), stall["at"]
    tail = (result.incident() / "output-tail.txt").read_text().splitlines()
    assert "1/2" in tail[-1] and "/4" in tail[-1], f"the epoch bar's last state: {tail[-1:]}"
    lines = (tmp_path / "train" / "results.csv").read_text().splitlines()
    assert [int(float(line.split(",")[0])) for line in lines[1:]] == [1, 2], "the restarted attempt trained both epochs"
