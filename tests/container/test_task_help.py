"""Every task that `invoke --list` reports answers --help and -h with its usage and creates nothing.

invoke's parser hands ``--help`` to a task still missing a positional argument
as that argument's value (``invoke bundle --help`` once started a 4 GB bundle
named ``--help``); tasks.py answers it. The list of tasks comes from invoke
itself, so a task added later is covered without touching this file. No
Docker needed: asking for help must not even reach the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List, Set

import pytest

from tests.paths import REPO

ROOT = REPO


def invoke(args: List[str]) -> subprocess.CompletedProcess:
    # No bytecode caches: they are not the task's doing, and would hide what is.
    env: Dict[str, str] = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DOCKER_HOST": "unix:///nonexistent.sock"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def task_names() -> List[str]:
    listed = invoke(["--list", "--list-format", "json"])
    assert listed.returncode == 0, listed.stderr
    return sorted(task["name"] for task in json.loads(listed.stdout)["tasks"])


#: What the test run itself writes into the checkout while other workers run beside this one: Hypothesis's example
#: database and character tables (its first fuzz test of a fresh clone writes them, at any moment) and pytest's cache.
TEST_RUNNERS_OWN = (".hypothesis/", ".pytest_cache/")


def checkout_entries() -> Set[str]:
    """Every file git sees in the checkout, ignored ones included (a bundle or .env is ignored), but the test run's own."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        line for line in listed.stdout.splitlines() if "__pycache__" not in line and not line[3:].startswith(TEST_RUNNERS_OWN)
    }


def test_the_task_list_is_complete() -> None:
    """A guard on task_names(): the tasks with positional arguments (the ones that went wrong) are among them."""
    assert {"bundle", "restore", "verify", "build", "train"} <= set(task_names())


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("name", task_names())
def test_help_prints_usage_and_creates_nothing(name: str, flag: str) -> None:
    before = checkout_entries()
    answered = invoke([name, flag])
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert answered.stdout.startswith(f"Usage: inv[oke] [--core-opts] {name} "), answered.stdout
    assert "Docstring:" in answered.stdout and "Options:" in answered.stdout
    assert answered.stderr == ""
    assert checkout_entries() == before


@pytest.mark.parametrize(
    "args, spelled",
    [
        (["bundle", "-x"], "OUT '-x'"),
        (["restore", "--nope.tar"], "BUNDLE '--nope.tar'"),
        (["verify", "-q"], "FILE '-q'"),
        (["restore", "b.tar", "--into", "-d"], "--into '-d'"),
        (["fingerprint", "--out", "-o.json"], "--out '-o.json'"),
        (["status", "--run-dir", "-x"], "--run-dir '-x'"),
        (["setup", "--ca-cert", "ok.crt", "--ca-cert", "-c.crt"], "--ca-cert '-c.crt'"),
    ],
)
def test_a_path_that_starts_with_a_dash_is_refused(args: List[str], spelled: str) -> None:
    before = checkout_entries()
    refused = invoke(args)
    name = spelled.split("'")[1]
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stdout + refused.stderr
    assert (
        refused.stderr
        == f"trainbox: error: {spelled} looks like an option, not a path: for a file of that name, write ./{name}\n"
    )
    assert checkout_entries() == before
