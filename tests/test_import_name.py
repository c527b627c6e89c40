"""The documented commands, run from a user's folder that holds their own ``train.py`` and ``train/`` package, and
a folder named ``trainbox/`` (the clone itself, seen from its parent folder).

The import name is ``trainbox`` (the folder stays ``train/``), and the children trainbox starts itself
do not have the working directory on sys.path: a decoy ``ultralytics.py`` here would otherwise be
imported by the runner and its spawn-started DataLoader workers instead of the real one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from tests.supervised import SMALL_DEMO_DATA, Finished

#: The most common name there is for a training script, instrumented as docs/your-own-script.md says.
USER_SCRIPT = """\
import sys
import time

from trainbox.heartbeat import beat

print("user train.py running as", __name__, flush=True)
if __name__ != "__main__":
    raise SystemExit("the user's train.py was imported as a module")
for step in range(5):
    beat("train", step=step, force=True)
    time.sleep(0.05)
print("user script done", flush=True)
"""
DECOY = "raise SystemExit('{what} from the working directory was imported instead of the real one')\n"


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "train").mkdir(parents=True)
    (folder / "train.py").write_text(USER_SCRIPT)
    (folder / "train" / "__init__.py").write_text(DECOY.format(what="the user's train/ package"))
    (folder / "ultralytics.py").write_text(DECOY.format(what="ultralytics.py"))
    (folder / "trainbox" / "env").mkdir(parents=True)  # a clone of trainbox: a folder, no __init__.py
    return folder


def run_in(folder: Path, command: List[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout)


def trainbox_script() -> str:
    found = shutil.which("trainbox", path=str(Path(sys.executable).parent))
    assert found, "the console script `trainbox` is installed beside this Python (pip install -e .)"
    return found


@pytest.mark.parametrize("entry", ["console script", "python -m"])
def test_supervise_runs_the_users_train_py(user_folder: Path, entry: str) -> None:
    head = [trainbox_script()] if entry == "console script" else [sys.executable, "-m", "trainbox"]
    run_dir = user_folder / "runs" / "mine"
    done = run_in(
        user_folder,
        [*head, "supervise", "--run-dir", str(run_dir), "--stall-timeout", "60", "--", sys.executable, "train.py"],
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "user train.py running as __main__" in done.stdout and "user script done" in done.stdout
    finished = Finished(done.returncode, done.stdout, done.stderr, run_dir)
    assert finished.kinds() == ["start", "exit"] and finished.of("exit")[0]["beats"] >= 1


def test_cli_help_demo_data_and_health_from_the_users_folder(user_folder: Path) -> None:
    helped = run_in(user_folder, [sys.executable, "-m", "trainbox", "--help"])
    assert helped.returncode == 0 and "supervise" in helped.stdout, helped.stderr
    demo = run_in(user_folder, [sys.executable, "-m", "trainbox", "demo-data", "data"])
    assert demo.returncode == 0 and (user_folder / "data" / "data.yaml").is_file(), demo.stderr
    health = run_in(user_folder, [trainbox_script(), "health", "--run-dir", str(user_folder / "no-run")])
    assert health.returncode == 1 and health.stdout.startswith("unhealthy: "), health.stdout + health.stderr


@pytest.mark.training
def test_run_trains_from_the_users_folder_with_spawned_workers(user_folder: Path) -> None:
    """``balanced`` starts its 2 DataLoader workers with spawn: they unpickle Ultralytics' dataset too."""
    assert run_in(user_folder, [sys.executable, "-m", "trainbox", "demo-data", "data", *SMALL_DEMO_DATA]).returncode == 0
    run_dir = user_folder / "runs" / "yolo"
    done = run_in(
        user_folder,
        [
            sys.executable,
            "-m",
            "trainbox",
            "run",
            "--profile",
            "balanced",
            "--run-dir",
            str(run_dir),
            "--quiet",
            "data=data/data.yaml",
            "epochs=1",
            "imgsz=64",
        ],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "device", "exit"] and events[-1]["reason"] == "completed"
    assert (run_dir / "train" / "weights" / "last.pt").is_file()
    log = (run_dir / "logs" / "attempt-0.log").read_text()
    assert "imported instead of the real one" not in log
