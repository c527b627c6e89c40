"""``supervise --ladder FILE``: rungs validated on load, each attempt CMD + its rung, a stall steps down by its cause."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.supervised import train_cli
from trainbox import errors
from trainbox.rundir.events import Retry
from trainbox.supervise.ladder.command import CommandLadder, LadderError, LadderFile, Rung, load
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
        ("rungs:\n  - name: fast\n    arg: [x]\n", "line 3: rung 'fast': field 'arg': Extra inputs are not permitted"),
        ("rungs: []\n", "line 1: field 'rungs': List should have at least 1 item"),
        ("rung:\n  - name: a\n", "line 1: field 'rungs': Field required"),
        ("rungs:\n  - args: [x]\n", "line 2: rung 1: field 'name': Field required"),
        ("rungs:\n  - name: a\n  - name: a\n", "field 'rungs': rung name 'a' is used twice (rungs 1 and 2)"),
        ("rungs:\n  - {name: two words}\n", "line 2: rung 'two words': field 'name': String should match pattern"),
        ("rungs:\n  - {name: a, env: {X: }}\n", "line 2: rung 'a': field 'env.X': Input should be a valid string"),
        ("rungs:\n  - {name: a, env: {'A=B': x}}\n", "rung 'a': field 'env': 'A=B' is not an environment variable name"),
        ("rungs:\n  - {name: a, args: --x}\n", "line 2: rung 'a': field 'args': Input should be a valid list"),
        ('rungs:\n  - name: a\n  - name: b\n    args: [x, "a\\0b"]\n', "line 4: rung 'b': field 'args': a NUL byte cannot"),
        ('rungs:\n  - name: b\n    env: {X: "a\\0b"}\n', "line 3: rung 'b': field 'env': X: a NUL byte cannot"),
        ('rungs:\n  - name: b\n    resume: ["\\0"]\n', "line 3: rung 'b': field 'resume': a NUL byte cannot"),
        ("rungs: [a\n", "not valid YAML at line 1 (while parsing a flow sequence, expected ',' or ']', but got '<stream end>'"),
        ("rungs:\n  - name: a\n    args: [x\n  - name: b\n", "not valid YAML at line 3 (while parsing a flow sequence"),
        ('rungs:\n  - name: a\n    args: ["x]\n', "not valid YAML at line 3 (while scanning a quoted scalar"),
        ("- name: a\n", "expected a mapping with 'rungs', got list"),
        ("[a]: x\n", "not valid YAML at line 1 (while constructing a mapping, found unhashable key)"),
    ],
)
def test_a_bad_ladder_is_refused_in_one_line_naming_the_rung_and_the_line(tmp_path: Path, text: str, says: str) -> None:
    path = ladder_file(tmp_path, text)
    with pytest.raises(LadderError) as refused:
        load(path)
    line = errors.line(refused.value)
    assert refused.value.code == errors.ExitCode.USAGE and "\n" not in line
    assert line.startswith(f"trainbox: error: ladder {path}") and says in line, line


def test_scalars_are_the_text_written_not_what_yaml_1_1_makes_of_them(tmp_path: Path) -> None:
    text = "rungs:\n  - name: 010\n    args: [0x10, 010, 1:30, 1.10, true, ~, '']\n    env: {A: 0o7, B: 1_000, C: no}\n"
    with pytest.raises(LadderError, match="field 'args.5': Input should be a valid string"):
        load(ladder_file(tmp_path, text))  # an empty value is nothing, and nothing is not a word
    (rung,) = load(ladder_file(tmp_path, text.replace(", ~", "")))
    assert rung == Rung(name="010", args=["0x10", "010", "1:30", "1.10", "true", ""], env={"A": "0o7", "B": "1_000", "C": "no"})
    (fast,) = load(ladder_file(tmp_path, "rungs:\n  - {name: a, expected_speed: 0.5}\n"))
    assert fast.expected_speed == 0.5, "a number field still takes a number written as one"


def test_the_duplicate_name_check_is_one_pass(tmp_path: Path) -> None:
    """A ladder of many rungs starts at once: each name is compared with what a set holds, not with every other."""
    compared = []

    class Name(str):
        def __eq__(self, other: object) -> bool:
            compared.append(other)
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    rungs = [Rung.model_construct(name=Name(f"r{i}")) for i in range(2000)]
    assert LadderFile.model_validate({"rungs": rungs}).rungs == rungs
    assert len(compared) < 100, f"{len(compared)} comparisons for 2000 rungs"


def test_a_missing_ladder_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LadderError, match="cannot read it"):
        load(tmp_path / "nowhere.yaml")


def test_the_cli_refuses_a_bad_ladder_before_anything_starts(tmp_path: Path) -> None:
    path = ladder_file(tmp_path, "rungs:\n  - name: fast\n    args: [x]\n    envs: {}\n")
    run_dir = tmp_path / "run"
    result = train_cli(["supervise", "--run-dir", str(run_dir), "--ladder", str(path), "--", sys.executable, "-c", ""])
    assert result.code == errors.ExitCode.USAGE
    assert result.stderr == f"trainbox: error: ladder {path} line 4: rung 'fast': field 'envs': Extra inputs are not permitted\n"
    assert not run_dir.exists(), "nothing was started or written"
