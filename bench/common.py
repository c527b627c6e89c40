"""Shared by the benchmarks: the machine's name, statistics, results written atomically."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from trainbox.atomic import write_text_atomic  # noqa: E402
from trainbox.rundir.events import read_events  # noqa: E402
from trainbox.rundir.layout import RunDir  # noqa: E402


def machine() -> Dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def summary(values: Sequence[float]) -> Dict[str, float]:
    """Median and spread (min, max) of repeated measurements."""
    vals = sorted(values)
    return {
        "median": round(statistics.median(vals), 3),
        "min": round(vals[0], 3),
        "max": round(vals[-1], 3),
        "n": len(vals),
    }


def span(stat: Dict[str, float], scale: float = 1.0, digits: int = 2) -> str:
    """A summary as ``median [min–max]`` for a markdown table."""
    return f"{stat['median'] * scale:.{digits}f} [{stat['min'] * scale:.{digits}f}–{stat['max'] * scale:.{digits}f}]"


def cli_env(env: Dict[str, str]) -> Dict[str, str]:
    """This environment, with this checkout's trainbox importable and ``env`` on top (its ``PYTHONPATH`` first)."""
    paths = (env.get("PYTHONPATH"), str(REPO), os.environ.get("PYTHONPATH"))
    return {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def train_cli(args: List[str], env: Dict[str, str], timeout: float = 1800) -> int:
    return subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        env=cli_env(env),
        cwd=REPO,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ).returncode


def events(run_dir: Path) -> List[Dict[str, Any]]:
    return read_events(RunDir(run_dir).events)


#: Bare Ultralytics in a plain process: ``python -c BARE RUN_DIR KEY=VALUE ...`` trains ``yolov8n.yaml`` with those
#: arguments (any other keeps Ultralytics' default) into ``RUN_DIR/train``, offline as trainbox trains (the same
#: environment and font, and the network guard, which refuses and logs any attempt in ``RUN_DIR/network.log``). One
#: callback beats (at most once a second, the first batch at once) when ``TRAIN_HEARTBEAT_FILE`` is set, so time to
#: the first batch is taken as it is for trainbox.
BARE = """
import sys
from pathlib import Path
from trainbox import heartbeat
from trainbox.rundir.layout import RunDir
from trainbox.yolo import offline
from trainbox.yolo.args import parse_value
run = RunDir(Path(sys.argv[1]))
offline.install_network_guard(run.network_log)
offline.prepare_environment(run.ultralytics)
from ultralytics import YOLO
offline.disable_settings_sync()
model = YOLO("yolov8n.yaml")
model.add_callback("on_train_batch_end", lambda trainer: heartbeat.beat("train", batch=1))
args = {key: parse_value(value) for key, value in (pair.split("=", 1) for pair in sys.argv[2:])}
model.train(project=str(run.train.parent), name=run.train.name, exist_ok=True, **args)
"""


def bare_command(run_dir: Path, pairs: Sequence[str]) -> List[str]:
    """The command line of a bare Ultralytics run (see ``BARE``)."""
    return [sys.executable, "-c", BARE, str(run_dir), *pairs]


def epoch_seconds(run_dir: Path) -> float:
    """Steady seconds per epoch from Ultralytics' ``results.csv`` (cumulative time at each epoch's end), after the first."""
    rows = RunDir(run_dir).results.read_text().splitlines()[1:]
    times = [float(row.split(",")[1]) for row in rows]
    if len(times) < 2:
        raise ValueError(f"{run_dir}: a steady state needs at least 2 epochs, results.csv has {len(times)}")
    return (times[-1] - times[0]) / (len(times) - 1)


def write_results(name: str, data: Dict[str, Any], markdown: str, directory: Path = RESULTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine(), **data}
    write_text_atomic(directory / f"{name}.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_text_atomic(directory / f"{name}.md", markdown)
    return directory / f"{name}.json"
