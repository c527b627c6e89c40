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
from trainbox.events import read_events  # noqa: E402
from trainbox.rundir import RunDir  # noqa: E402


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
    """This environment, with this checkout's trainbox importable and ``env`` on top."""
    return dict(os.environ, PYTHONPATH=str(REPO), **env)


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


def write_results(name: str, data: Dict[str, Any], markdown: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine(), **data}
    write_text_atomic(RESULTS / f"{name}.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    write_text_atomic(RESULTS / f"{name}.md", markdown)
    return RESULTS / f"{name}.json"
