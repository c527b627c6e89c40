"""One run, one directory (trainbox.rundir.owner, trainbox.rundir.layout's run names): a new directory for each
run, ``--resume`` and ``--name`` to go on with one, and a directory of another command's run refused untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.supervised import cli_env
from trainbox.errors import UserError
from trainbox.rundir import layout, owner
from trainbox.rundir.layout import RunDir

STAMP = st.builds(lambda t: time.strftime(layout.RUN_STAMP, time.localtime(t)), st.integers(0, 4_000_000_000))


@pytest.mark.parametrize(
    "argv, name",
    [
        (["python", "train.py", "--lr", "0.1"], "train"),
        (["python3.11", "-u", "/home/me/evalscript.py"], "evalscript"),
        (["yolo", "train", "data=coco8.yaml"], "yolo"),
        (["/usr/bin/env", "python", "-m", "nanogpt.train"], "train"),
        (["torchrun", "--nproc-per-node", "2", "fit.py"], "fit"),
        (["torchrun", "--nproc-per-node=2", "fit.py"], "fit"),
        (["accelerate", "launch", "--num_processes", "2", "run_clm.py"], "run_clm"),
        (["uv", "run", "train.py"], "train"),
        (["python", "-c", "print(1)"], "python"),
        (["./my run!.sh"], "my_run"),
        (["python"], "python"),
        (["env", "PYTHONPATH=/x/faults", "python", "train.py"], "train"),
        (["env", "-u", "HOME", "A_1=2", "yolo", "train"], "yolo"),
        (["python", "-W", "ignore", "-X", "importtime", "-u", "train.py"], "train"),
        (["nice", "-n", "5", "python3", "-W", "ignore", "-m", "pkg.fit"], "fit"),
        (["python", "训练.py"], "训练"),
        (["python", "/home/me/प्रशिक्षण.py"], "प्रशिक्षण"),
        (["python", "run.py"], "run-cmd"),
        (["./demo"], "demo-cmd"),
    ],
)
def test_a_command_is_named_by_its_program_or_the_script_a_runner_runs(argv: List[str], name: str) -> None:
    assert layout.command_name(argv) == name


@given(st.lists(st.text(max_size=30), min_size=1, max_size=6))
def test_any_command_s_name_is_a_folder_name_and_never_trainbox_s_own(argv: List[str]) -> None:
    name = layout.command_name(argv)
    assert name and not set(name) & set("/\\\0 ") and not name.startswith((".", "-")) and len(name) <= 64
    assert name not in layout.OWN_NAMES


def test_a_name_without_a_letter_or_digit_is_a_short_hash_of_it_not_another_command_s() -> None:
    one, other = layout.command_name(["python", "🚀.py"]), layout.command_name(["python", "🔥.py"])
    assert one.startswith("cmd-") and other.startswith("cmd-") and one != other
    assert layout.command_name(["python", "🚀.py"]) == one, "the same script, the same name"


@given(st.lists(st.text(max_size=12), max_size=5), st.lists(st.text(max_size=12), max_size=4))
def test_what_runs_starts_past_env_and_its_assignments(before: List[str], after: List[str]) -> None:
    assignments = [f"V{i}={value}" for i, value in enumerate(before)]
    argv = ["env", *assignments, "yolo", *after]
    assert layout.program_start(argv) == 1 + len(assignments)
    assert layout.program_start(["yolo", *after]) == 0


def test_a_new_run_gets_a_new_directory_named_by_its_command_and_its_start(tmp_path: Path) -> None:
    first = owner.choose("train", None, False, tmp_path)
    assert first.parent == tmp_path and layout.RUN_SUFFIX.fullmatch(first.name[len("train") :])
    assert first.is_dir(), "reserved as it is chosen"
    second = owner.choose("train", None, False, tmp_path)
    assert second.parent == tmp_path and second.name.startswith("train-") and second != first
    assert owner.choose("train", "exp1", False, tmp_path) == tmp_path / "exp1"
    for bad in ("../x", "a/b", "..", ""):
        with pytest.raises(UserError, match="--name"):
            owner.choose("train", bad, False, tmp_path)


@settings(deadline=None)  # real mkdirs: a loaded machine took 0.2 s for one example, a timing and not a failure
@given(st.integers(0, 4_000_000_000), st.integers(2, 6))
def test_runs_of_one_command_started_in_one_second_each_reserve_their_own_directory(started: int, count: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        runs = Path(folder) / "runs"
        made = [owner.reserve(runs, "train", started) for _ in range(count)]
        assert len(set(made)) == count and all(path.is_dir() for path in made)
        stamp = time.strftime(layout.RUN_STAMP, time.localtime(started))
        assert [p.name for p in made] == [f"train-{stamp}"] + [f"train-{stamp}-{n}" for n in range(2, count + 1)]
        assert layout.newest_named(runs, "train", os.listdir(runs)) == made[-1]


def test_a_runs_folder_that_cannot_hold_a_run_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("a file, not a folder")
    with pytest.raises(UserError, match=f"^cannot make a run directory under {tmp_path}/runs/: "):
        owner.reserve(tmp_path / "runs", "train", time.time())


def test_resume_takes_the_newest_run_of_the_same_command(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--resume: no run of `train`"):
        owner.choose("train", None, True, tmp_path)
    for name in (
        "train-20261128-235959",
        "train-20261129-010203",
        "train-20261129-010203-2",
        "trainer-20301231-000000",
        "demo-20301231-000000",
    ):
        (tmp_path / name).mkdir()
    assert owner.choose("train", None, True, tmp_path) == tmp_path / "train-20261129-010203-2"


@given(st.lists(st.one_of(STAMP.map(lambda s: f"train-{s}"), st.text(max_size=30)), max_size=12))
def test_the_newest_run_of_a_command_is_read_from_any_listing(names: List[str]) -> None:
    found = layout.newest_named(Path("runs"), "train", names)
    ours = [n for n in names if n.startswith("train-") and layout.RUN_SUFFIX.fullmatch(n[len("train") :])]
    assert (found is None) == (not ours)
    if found is not None:
        assert found.name in ours and found.name[6:21] == max(n[6:21] for n in ours)


def test_a_directory_of_another_command_s_run_is_refused_and_the_same_command_s_taken(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    owner.check(tmp_path, "train")  # nothing there
    run.state.write_text(json.dumps({"state": "succeeded", "command": "demo"}))
    owner.check(tmp_path, "demo")
    with pytest.raises(UserError, match=f"^{tmp_path} holds a run of `demo`, not of `train`"):
        owner.check(tmp_path, "train")


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = cli_env()
    env.pop("TRAIN_RUN_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "trainbox", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _snapshot(folder: Path) -> Dict[str, Tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def test_each_run_gets_its_own_directory_resume_goes_on_and_another_command_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('step 1/1', flush=True)\n")
    (tmp_path / "other.py").write_text("print('other', flush=True)\n")
    child = ["--", sys.executable, "train.py"]
    assert _cli(tmp_path, "supervise", "--quiet", *child).returncode == 0
    # most likely the same second: the second run's name then ends in -2
    assert _cli(tmp_path, "supervise", "--quiet", *child).returncode == 0
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 2 and all(layout.newest_named(tmp_path / "runs", "train", [name]) for name in runs), runs

    assert _cli(tmp_path, "supervise", "--quiet", "--resume", *child).returncode == 0
    newest = RunDir(tmp_path / "runs" / runs[-1])
    assert [json.loads(line)["event"] for line in newest.events.read_text().splitlines()] == ["start", "exit"] * 2

    before = _snapshot(newest.root)
    refused = _cli(tmp_path, "supervise", "--run-dir", str(newest.root), "--", sys.executable, "other.py")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"trainbox: error: {newest.root} holds a run of `train`, not of `other`: leave out --run-dir for a new run, "
        "or give another directory (--resume goes on with the newest run of `other`)"
    ]
    assert _snapshot(newest.root) == before, "nothing in the refused directory was touched"

    shown = _cli(tmp_path, "status")
    assert shown.returncode == 0
    assert shown.stdout.splitlines()[0] == f"run       runs/{runs[-1]} (the newest run under runs/; --run-dir for another)"


def test_three_runs_of_one_command_started_together_each_run_in_a_directory_of_their_own(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('step 1/1', flush=True)\n")
    env = cli_env()
    env.pop("TRAIN_RUN_DIR", None)
    argv = [sys.executable, "-m", "trainbox", "supervise", "--quiet", "--", sys.executable, "train.py"]
    children = [subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [child.communicate(timeout=180)[1] for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], errors
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert len(runs) == 3 and all(layout.newest_named(tmp_path / "runs", "train", [name]) for name in runs), runs


def test_a_script_named_in_another_alphabet_keeps_its_name_and_env_before_it_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / "训练.py").write_text("print('step 1/1', flush=True)\n")
    assert _cli(tmp_path, "supervise", "--quiet", "--", "env", "PYTHONPATH=/x/faults", sys.executable, "训练.py").returncode == 0
    (only,) = os.listdir(tmp_path / "runs")
    assert only.startswith("训练-") and json.loads(RunDir(tmp_path / "runs" / only).state.read_text())["command"] == "训练"
