"""Running the real CLI as a subprocess and reading what it left behind (shared by tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import psutil

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def events(self) -> List[Dict[str, Any]]:
        path = self.run_dir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def kinds(self) -> List[str]:
        return [e["event"] for e in self.events]

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def stacks(self, attempt: int) -> str:
        directory = self.run_dir / "incidents" / str(attempt) / "stacks"
        return "\n".join(p.read_text() for p in sorted(directory.glob("*.txt")))


def cli_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    full_env = dict(os.environ)
    full_env.pop("TRAIN_FAULT", None)
    full_env.update(env or {})
    return full_env


def start_cli(args: Sequence[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start ``python -m trainbox ARGS`` in the background (the test signals or waits for it)."""
    return subprocess.Popen([sys.executable, "-m", "trainbox", *args], env=cli_env(env), cwd=REPO)


def train_cli(
    args: Sequence[str],
    run_dir: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 600,
) -> Finished:
    """Run ``python -m trainbox ARGS`` to completion."""
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        capture_output=True,
        text=True,
        env=cli_env(env),
        timeout=timeout,
        cwd=REPO,
    )
    return Finished(done.returncode, done.stdout, done.stderr, run_dir or Path("."))


def faulty_child(*args: str) -> List[str]:
    """The beating child from trainbox.faults, as a command line."""
    return [sys.executable, "-m", "trainbox.faults", *args]


def survivors(run_dir: Path) -> List[psutil.Process]:
    """Processes still alive that were started for this run (their environment names it)."""
    marker = str(run_dir)
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("TRAIN_RUN_DIR") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found
