"""``supervise --ladder FILE``: rungs validated on load, each attempt CMD + its rung, a stall steps down by its cause."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.supervised import train_cli
from trainbox import errors
from trainbox.rundir.events import Retry
from trainbox.supervise.ladder.command import CommandLadder, LadderError, Rung, load
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome, OutcomeKind

LADDER = """\
rungs:
  - name: fast
    args: ["--num_workers", 4]
  - name: careful
    args: ["--num_workers", "0", "--no_compile"]
    env: {OMP_NUM_THREADS: 2, TOKENIZERS_PARALLELISM: "false"}
"""
COMMAND = Launch(argv=["python", "train.py", "--lr", "0.1"], startup_timeout=60, stall_timeout=30, env={"A": "1"})


def ladder_file(tmp_path: Path, text: str = LADDER) -> Path:
    path = tmp_path / "ladder.yaml"
    path.write_text(text)
    return path


def stall(cause: str) -> Outcome:
    return Outcome(OutcomeKind.STALLED, beats=3, detail={"cause": cause})


def test_each_rung_appends_its_args_and_adds_its_env(tmp_path: Path) -> None:
    ladder = CommandLadder(COMMAND, load(ladder_file(tmp_path)))
    fast = ladder.first()
    assert (fast.profile, list(fast.argv), dict(fast.env)) == ("fast", [*COMMAND.argv, "--num_workers", "4"], {"A": "1"})
    assert (fast.startup_timeout, fast.stall_timeout) == (60, 30), "the budgets are the command's"
    careful = ladder.after(stall("loader_deadlock"))
    assert careful.retry is Retry.LADDER and careful.reason == "loader_deadlock: down the ladder to careful"
    assert list(careful.launch.argv) == [*COMMAND.argv, "--num_workers", "0", "--no_compile"]
    assert dict(careful.launch.env) == {"A": "1", "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}


def test_the_cause_chooses_the_move_as_for_profiles(tmp_path: Path) -> None:
    ladder = CommandLadder(COMMAND, load(ladder_file(tmp_path)))
    same = ladder.after(stall("busy_python"))  # a busy spin may be a one-off: the same rung once more
    assert (same.launch.profile, same.retry, same.reason) == ("fast", Retry.SAME, "busy_python: fast once more")
    crash = ladder.after(Outcome(OutcomeKind.EXITED, code=1))
    assert (crash.launch.profile, crash.retry) == ("fast", None), "a crash keeps the rung"
    native = ladder.after(stall("kernel_compile"))  # a command has no convolution backend: the next rung
    assert (native.launch.profile, native.retry) == ("careful", Retry.NATIVE)
    last = ladder.after(stall("idle"))
    assert (last.launch.profile, last.reason) == ("careful", "idle: careful again: no rung left below it")


def test_numbers_written_without_quotes_are_their_text(tmp_path: Path) -> None:
    rungs = load(ladder_file(tmp_path, "rungs:\n  - {name: a, args: [--lr, 0.5, -n, 2], env: {X: 1.5}}\n"))
    assert rungs == [Rung(name="a", args=["--lr", "0.5", "-n", "2"], env={"X": "1.5"})]


@pytest.mark.parametrize(
    "text, says",
    [
        ("rungs:\n  - name: fast\n    arg: [x]\n", "field 'rungs.0.arg': Extra inputs are not permitted"),
        ("rungs: []\n", "field 'rungs': List should have at least 1 item"),
        ("rung:\n  - name: a\n", "field 'rungs': Field required"),
        ("rungs:\n  - args: [x]\n", "field 'rungs.0.name': Field required"),
        ("rungs:\n  - name: a\n  - name: a\n", "field 'rungs': rung name 'a' is used twice"),
        ("rungs:\n  - {name: two words}\n", "field 'rungs.0.name': String should match pattern"),
        ("rungs:\n  - {name: a, env: {X: true}}\n", "field 'rungs.0.env.X': Input should be a valid string"),
        ("rungs:\n  - {name: a, env: {'A=B': x}}\n", "field 'rungs.0.env': 'A=B' is not an environment variable name"),
        ("rungs:\n  - {name: a, args: --x}\n", "field 'rungs.0.args': Input should be a valid list"),
        ("rungs: [a\n", "not valid YAML (line 2)"),
        ("- name: a\n", "expected a mapping with 'rungs', got list"),
        ("1: x\n", "its keys must be words"),
    ],
)
def test_a_bad_ladder_is_refused_in_one_line_naming_the_field(tmp_path: Path, text: str, says: str) -> None:
    path = ladder_file(tmp_path, text)
    with pytest.raises(LadderError) as refused:
        load(path)
    line = errors.line(refused.value)
    assert refused.value.code == errors.ExitCode.USAGE and "\n" not in line
    assert line.startswith(f"trainbox: error: ladder {path}: ") and says in line


def test_a_missing_ladder_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LadderError, match="cannot read it"):
        load(tmp_path / "nowhere.yaml")


def test_the_cli_refuses_a_bad_ladder_before_anything_starts(tmp_path: Path) -> None:
    path = ladder_file(tmp_path, "rungs:\n  - name: fast\n    args: [x]\n    envs: {}\n")
    run_dir = tmp_path / "run"
    result = train_cli(["supervise", "--run-dir", str(run_dir), "--ladder", str(path), "--", sys.executable, "-c", ""])
    assert result.code == errors.ExitCode.USAGE
    assert result.stderr == f"trainbox: error: ladder {path}: field 'rungs.0.envs': Extra inputs are not permitted\n"
    assert not run_dir.exists(), "nothing was started or written"
