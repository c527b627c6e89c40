"""The lines a run ends with (trainbox.supervise.endings), from plain data: milliseconds."""

from __future__ import annotations

from pathlib import Path

from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir
from trainbox.supervise import endings
from trainbox.supervise.output.progress import HOW_TO_GIVE_PROGRESS
from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import NO_PROGRESS_READ, Counters, Outcome, OutcomeKind

NEVER_SLOW = {"slow_s": 0.0, "slow_episodes": 0}


def test_a_run_that_was_slow_says_for_how_long_and_one_that_was_not_says_nothing() -> None:
    assert endings.slow_part(NEVER_SLOW) == ""
    assert endings.slow_part({"slow_s": 750.0, "slow_episodes": 2}) == ", slow for 12.5 min in 2 episode(s)"
    counts = Counters(restarts=1, stalls=1, crashes=0)
    assert endings.completed_line(2, counts, NEVER_SLOW) == "completed after 2 attempt(s) (1 stall(s), 0 crash(es))"


def test_giving_up_lists_the_attempts_and_where_to_look(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    stalled = Outcome(OutcomeKind.STALLED, detail={"progress_source": "none"})
    crashed = Outcome(OutcomeKind.EXITED, code=1, beats=3)
    history = [endings.describe(crashed, Launch(["python", "train.py"], 60.0, 30.0, profile="fast"))]
    assert history == ["exit status 1 with profile fast after 3 beat(s)"]
    line = endings.gave_up_line(2, Counters(restarts=1, crashes=1), 1, history, "restart budget spent", stalled, run, NEVER_SLOW)
    assert line.startswith("giving up after 2 attempts and 1 restart(s) (restart budget spent; --max-restarts 1): ")
    assert "In order: exit status 1 with profile fast after 3 beat(s)." in line
    assert "incident" not in line and "history" not in line, "no file is named that the run directory does not hold"
    run.events.write_text("")
    run.incident_dir.directory.mkdir()
    line = endings.gave_up_line(2, Counters(restarts=1, crashes=1), 1, history, "restart budget spent", stalled, run, NEVER_SLOW)
    assert f"Incident reports are in {run.incident_dir.directory}, the history is in {run.events}." in line
    assert line.endswith(f"The last attempt showed no progress at all. {HOW_TO_GIVE_PROGRESS}")


def test_output_that_ran_without_progress_is_quoted_with_how_to_give_progress(tmp_path: Path) -> None:
    last = Outcome(OutcomeKind.STALLED, detail={"last_output": ["epoch 1 loss 0.3", "epoch 2 loss 0.2"]})
    line = endings.gave_up_line(2, Counters(), 3, [], NO_PROGRESS_READ, last, RunDir(tmp_path), NEVER_SLOW)
    assert HOW_TO_GIVE_PROGRESS in line
    assert line.endswith(" The child's last output:\n    epoch 1 loss 0.3\n    epoch 2 loss 0.2")
    assert "configuration error" in endings.misconfigured_line(Outcome(OutcomeKind.EXITED, code=2))


def test_a_give_up_after_a_hang_says_another_machine_may_help_and_the_programs_own_failure_does_not() -> None:
    assert endings.gave_up_code(Outcome(OutcomeKind.STALLED), "restart budget spent") == ExitCode.HUNG
    assert endings.gave_up_code(Outcome(OutcomeKind.SLOW), "restart budget spent") == ExitCode.HUNG
    assert endings.gave_up_code(Outcome(OutcomeKind.STALLED), "stalls again at step 3 (cause idle)") == ExitCode.HUNG
    assert endings.gave_up_code(Outcome(OutcomeKind.EXITED, code=1), "restart budget spent") == ExitCode.GAVE_UP
    assert endings.gave_up_code(Outcome(OutcomeKind.STALLED), NO_PROGRESS_READ) == ExitCode.GAVE_UP
