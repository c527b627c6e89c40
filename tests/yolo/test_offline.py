"""No network: the audit-hook guard works (main process and workers), and a full run never trips it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervised import REPO, train_cli
from tests.yolo.conftest import run_child
from trainbox.yolo.offline import advice

GUARD_IN_MAIN = """
import socket, sys
from pathlib import Path
from trainbox.yolo.offline import NetworkBlocked, install_network_guard
log = Path(sys.argv[1])
install_network_guard(log)
socket.getaddrinfo("localhost", 0)
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), timeout=5).close()
assert not log.exists(), "loopback must stay allowed"
import os, subprocess
subprocess.run(["true"], check=True)  # a process that reaches no network stays allowed
assert not log.exists()
attempts = (
    lambda: socket.getaddrinfo("example.com", 443),
    lambda: socket.socket().connect(("192.0.2.1", 80)),
    lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.2", 53)),
    lambda: socket.gethostbyname("example.org"),
    lambda: subprocess.run(["curl", "-sL", "https://example.com/x.zip"]),
    lambda: os.system("cd /tmp && wget -q https://example.com/x.zip"),
    lambda: subprocess.run(["bash", "-c", "git clone https://example.com/r.git"]),
    lambda: os.execvp("pip", ["pip", "download", "x"]),
)
for attempt in attempts:
    try:
        attempt()
    except NetworkBlocked:
        continue
    raise SystemExit("not blocked")
"""

GUARD_IN_WORKER = """
import os, socket, sys
from pathlib import Path
from torch.utils.data import DataLoader, Dataset
from trainbox.yolo.loader import WorkerInit

class Lookup(Dataset):
    def __len__(self):
        return 1
    def __getitem__(self, index):
        try:
            socket.getaddrinfo("example.com", 80)
        except OSError as exc:
            return type(exc).__name__
        return "connected"

if __name__ == "__main__":
    loader = DataLoader(Lookup(), num_workers=1, multiprocessing_context="fork", collate_fn=lambda b: b[0],
                        worker_init_fn=WorkerInit(None, Path(sys.argv[1])))
    print(next(iter(loader)), os.getpid())
"""


def test_guard_blocks_and_records_outside_loopback(tmp_path: Path) -> None:
    log = tmp_path / "network.log"
    subprocess.run([sys.executable, "-c", GUARD_IN_MAIN, str(log)], check=True, cwd=REPO, timeout=60)
    text = log.read_text()
    assert "socket.getaddrinfo host='example.com' port=443" in text
    assert "socket.connect host='192.0.2.1' port=80" in text
    assert "socket.sendto host='192.0.2.2' port=53" in text
    assert "socket.gethostbyname host='example.org'" in text
    for program in ("curl", "wget", "git", "pip"):
        assert f"program='{program}'" in text
    assert "program='true'" not in text


def test_guard_is_installed_in_dataloader_workers(tmp_path: Path) -> None:
    log = tmp_path / "network.log"
    script = tmp_path / "worker_guard.py"
    script.write_text(GUARD_IN_WORKER)
    done = subprocess.run(
        [sys.executable, str(script), str(log)], check=True, cwd=REPO, timeout=120, capture_output=True, text=True
    )
    result, main_pid = done.stdout.splitlines()[-1].split()
    assert result == "NetworkBlocked"
    assert "host='example.com'" in log.read_text() and f"pid={main_pid} " not in log.read_text()


def test_full_run_never_reaches_for_the_network(tmp_path: Path, demo_data: Path) -> None:
    run_dir = tmp_path / "run"
    args = [f"data={demo_data}", "epochs=1", "imgsz=64", "batch=8", "device=cpu", "plots=True", "amp=True"]
    done = run_child(run_dir, "balanced", args)
    assert done.code == 0, done.output[-3000:]
    assert not (run_dir / "network.log").exists(), (run_dir / "network.log").read_text()
    device = (done.beat() or {})["device"]  # amp=True took trainbox's offline check, not Ultralytics' download
    assert (device["kind"], device["amp"], device["amp_check"]) == ("cpu", False, "cpu: AMP runs on a GPU only")
    assert (device["workers"], device["pin_memory"]) == (2, False)
    user_dir = run_dir / "ultralytics" / "Ultralytics"
    assert (user_dir / "Arial.ttf").is_file() and (user_dir / "Arial.Unicode.ttf").is_file()
    settings = json.loads((user_dir / "settings.json").read_text())
    assert settings["sync"] is False
    assert "Using 2 dataloader workers" in done.output
    assert (run_dir / "train" / "labels.jpg").is_file()  # plots ran, with the local font


@pytest.mark.parametrize(
    "argv, env, said",
    [
        (["yolo", "train", "model=yolov8n.yaml"], {}, True),
        (["/opt/venv/bin/yolo", "val"], {"HOME": "/root"}, True),
        (["yolo", "train"], {"YOLO_OFFLINE": "1"}, False),  # already offline: nothing to say
        (["python", "train.py"], {}, False),
        ([], {}, False),
    ],
)
def test_offline_advice_is_for_yolo_commands_only(argv: list, env: dict, said: bool) -> None:
    line = advice(argv, env)
    assert (line is not None) == said
    assert line is None or ("YOLO_OFFLINE=1" in line and "Arial.ttf" in line and "trainbox run" in line)


def test_a_supervised_yolo_command_is_told_once_how_to_stay_offline(tmp_path: Path) -> None:
    """A program called ``yolo`` (here a two-line stand-in: the line is about the command's name) under ``supervise``."""
    yolo = tmp_path / "bin" / "yolo"
    yolo.parent.mkdir()
    yolo.write_text("#!/bin/sh\necho step 1\n")
    yolo.chmod(0o755)
    args = ["supervise", "--run-dir", str(tmp_path / "run"), "--quiet", "--", str(yolo), "train"]
    told = train_cli(args, tmp_path / "run", {"YOLO_OFFLINE": ""})  # the session's offline environment (conftest) unset
    assert told.code == 0, told.stderr
    assert told.stderr.count("an Ultralytics command: it may reach the network") == 1, told.stderr
    offline = train_cli(["supervise", "--run-dir", str(tmp_path / "again"), "--quiet", "--", str(yolo), "train"],
                        tmp_path / "again", {"YOLO_OFFLINE": "1"})  # fmt: skip
    assert offline.code == 0 and "Ultralytics" not in offline.stderr, offline.stderr
