"""What a restart cannot do (trainbox.supervise.resume.unused): an unrecognised command's checkpoints are watched
with a stat, and the restart names the newest and the options that would hand it back."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.paths import FIXTURES
from tests.supervise.output.test_uninstrumented import SHORT
from tests.supervised import Finished, survivors, train_cli
from trainbox.errors import ExitCode
from trainbox.supervise.resume import unused
from trainbox.supervise.resume.unused import Written, glob_of, resume_option, scan

LOOP = FIXTURES / "resumable" / "loop.py"


def test_the_newest_checkpoint_like_thing_written_since_the_run_began_is_found_by_its_name(tmp_path: Path) -> None:
    old = tmp_path / "checkpoints" / "yesterday.pt"
    old.parent.mkdir()
    old.write_bytes(b"PK")
    os.utime(old, (1000.0, 1000.0))
    for name, when in (("step_000250.pt", 2000.0), ("step_000275.pt", 2001.0), ("notes.txt", 2002.0)):
        (tmp_path / "checkpoints" / name).write_bytes(b"PK\x03\x04")
        os.utime(tmp_path / "checkpoints" / name, (when, when))
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.pt").write_bytes(b"PK")  # hidden: passed over
    found = scan(tmp_path, since=1500.0)
    assert found == Written(tmp_path / "checkpoints" / "step_000275.pt", 2001.0)
    folder = tmp_path / "out" / "checkpoint-500"
    folder.mkdir(parents=True)
    os.utime(folder, (3000.0, 3000.0))
    assert scan(tmp_path, since=1500.0) == Written(folder, 3000.0)
    assert scan(tmp_path, since=1500.0, skip=[tmp_path / "out"]) == found, "the run directory is left out"
    assert scan(tmp_path / "gone", since=0.0) is None


def test_a_look_stats_a_bounded_number_of_entries(tmp_path: Path) -> None:
    for n in range(unused.MAX_ENTRIES + 50):
        (tmp_path / f"{n:06d}.txt").touch()
    (tmp_path / "zzzz").mkdir()
    (tmp_path / "zzzz" / "step-1.pt").write_bytes(b"PK")
    assert scan(tmp_path, since=0.0) is None, "past MAX_ENTRIES nothing is looked at"


def test_the_glob_finds_the_checkpoint_and_its_siblings() -> None:
    root = Path("/w")
    assert glob_of(Path("/w/checkpoints/step_000275.pt"), root) == "checkpoints/step_*.pt"
    assert glob_of(Path("/w/out/checkpoint-500"), root) == "out/checkpoint-*"
    assert glob_of(Path("/elsewhere/last[1].pt"), root) == "/elsewhere/last[[]*].pt"


def test_the_script_s_own_resume_option_is_read_from_its_argparse_without_running_it() -> None:
    script = (
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--out')\n"
        "p.add_argument('--checkpoint-dir')\np.add_argument('-r', '--resume', type=str)\nraise SystemExit('never run')\n"
    )
    assert resume_option(script) == ("--resume", False)
    assert resume_option("p.add_argument('--resume', action='store_true')") == ("--resume", True)
    assert resume_option("p.add_argument('--ckpt_path')") == ("--ckpt_path", False)
    assert resume_option("p.add_argument('--checkpoint-dir')") is None, "where it saves is not how it resumes"
    assert resume_option("def (:") is None
    assert resume_option((FIXTURES / "programs" / "pytorch_examples" / "mnist_main.py").read_text()) == ("--resume", False)


@given(st.text(max_size=300))
def test_any_script_text_gives_an_option_or_none(source: str) -> None:
    found = resume_option(source)
    assert found is None or found[0].startswith("--")


def supervised(work: Path, name: str, *options: str) -> Finished:
    """``supervise`` of the loop in ``work``, saving ``checkpoints/step-N.pt`` every 25 steps, hung at step 60."""
    run_dir = work / "runs" / name
    paths = [str(FIXTURES / "uninstrumented"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "TRAIN_FAULT": "sleep@output,attempt=0,lines>=61"}
    args = ["supervise", "--run-dir", str(run_dir), *SHORT, *options, "--quiet", "--", *LOOP_COMMAND]
    done = train_cli(args, run_dir, env, cwd=work)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    assert done.code == ExitCode.OK, done.stderr
    return done


def shown(done: Finished) -> int:
    """The last step attempt 0 printed before it hung (``step 61/80 loss ...``)."""
    steps = re.findall(r"^step (\d+)/", (done.run_dir / "logs" / "attempt-0.log").read_text(), re.M)
    return int(steps[-1])


LOOP_COMMAND = [sys.executable, str(LOOP), "--steps", "80", "--every", "25", "--out", "checkpoints", "--step-s", "0.02"]
OPTIONS = "--resume-args '--resume {checkpoint}' --checkpoint 'checkpoints/step-*.pt'"


def test_an_unrecognised_script_saving_checkpoints_is_told_how_its_restart_could_resume(tmp_path: Path) -> None:
    """A user's script that saves checkpoints/step-25.pt every 25 steps and takes --resume PATH, hung at step 60:
    the restart runs it from step 0 (nothing says how it resumes), and says so, naming the checkpoint and the options;
    the work done again is every step before; a run given those options resumes."""
    done = supervised(tmp_path, "mine")
    restart, newest = done.of("restart")[0], tmp_path / "checkpoints" / "step-50.pt"
    assert restart["resumed"]["from"] is None and restart["resumed"]["written"]["path"] == str(newest)
    assert restart["resumed"]["options"] == OPTIONS, restart["resumed"]
    assert restart["resumed"]["why"].startswith("checkpoints written, not used on restart: ")
    assert "from the start: checkpoints written, not used on restart: " in done.stderr and OPTIONS in done.stderr
    assert done.of("start")[1]["argv"] == LOOP_COMMAND, "run as given: trainbox was not told how it resumes"
    assert json.loads((tmp_path / "checkpoints" / "done.json").read_text())["started_after"] == 0
    redone, last = done.of("redone")[0], shown(done)
    assert (redone["redone"], redone["unit"]) == (last, "step"), "from nothing: every step shown before the hang"
    status = train_cli(["status", "--run-dir", str(done.run_dir)], done.run_dir).stdout
    assert f"from the start (checkpoints written, not used on restart: {newest}; {OPTIONS})" in status, status

    told = supervised(tmp_path, "told", *shlex.split(OPTIONS))  # the options, as the line gave them
    assert told.of("restart")[0]["resumed"]["from"] == str(newest), "this run's own step-50.pt"
    again = told.of("redone")[0]
    assert (again["redone"], again["unit"]) == (shown(told) - 50, "step"), "steps 51 on, up to the last shown, again"
