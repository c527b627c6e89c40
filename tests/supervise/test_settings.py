"""Supervisor settings: one table behind the CLI's options, their defaults and help, and the spec's validation."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.supervised import REPO, cli_env
from trainbox.cli import build_parser
from trainbox.supervise.planner import Launch
from trainbox.supervise.settings import (
    CHECKPOINT,
    COMPILE_CAP,
    DEADLINE,
    IDLE_TIMEOUT,
    LADDER_POLICY,
    LAUNCH_SETTINGS,
    METRICS_TEXTFILE,
    NOTIFY,
    NOTIFY_ON,
    ON_SLOW,
    ON_STALL,
    PROGRESS_PATTERN,
    RESUME_ARGS,
    SETTINGS,
    SLOW_RATIO,
    STARTUP_TIMEOUT,
    Setting,
    SupervisorSettings,
    supervisor_settings,
)
from trainbox.yolo.profiles import Profile, default_profiles_dir

#: Options of `supervise` and `run` that are not supervisor settings (where the run goes, a Slurm job step's
#: included, what it prints, and which rungs it runs: a profile ladder or a ladder file).
NOT_SETTINGS = {
    "-h", "--help", "--run-dir", "--name", "--resume", "--slurm", "--quiet", "--profile", "--profiles-dir", "--ladder"
}  # fmt: skip


def options(command: str) -> Dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: action for action in sub.choices[command]._actions for flag in action.option_strings}


@pytest.mark.parametrize("command", ["supervise", "run"])
def test_cli_options_are_the_table(command: str) -> None:
    found = options(command)
    extra = {flag for flag in found if flag not in NOT_SETTINGS}
    assert extra == {s.flag for s in SETTINGS}, "an option that is not in SETTINGS, or a setting without an option"
    for setting in SETTINGS:
        action = found[setting.flag]
        profile_supplies = command == "run" and setting.profile_supplies
        unset = profile_supplies or setting.repeatable  # a repeatable option collects from None
        assert action.default == (None if unset else setting.default), setting.flag
        assert action.help and action.help.startswith(setting.help), setting.flag
        assert action.help.endswith("(default: the profile's)" if profile_supplies else f"(default: {setting.default_text})")
        assert action.dest == setting.dest


def test_health_tells_with_the_same_notify_options() -> None:
    """`health --act` tells of a hung supervisor itself: its --notify and --notify-on are the table's."""
    found = options("health")
    for setting in (NOTIFY, NOTIFY_ON):
        action = found[setting.flag]
        assert action.default == setting.default and action.help and action.help.startswith(setting.help)
    assert METRICS_TEXTFILE.flag not in found


def test_spec_fields_and_defaults_are_the_table() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(SupervisorSettings)}
    assert fields == {s.field: s.default for s in supervisor_settings()}
    launch_defaults = {f.name: f.default for f in dataclasses.fields(Launch)}
    assert {s.field for s in LAUNCH_SETTINGS} <= set(launch_defaults)
    for setting in (IDLE_TIMEOUT, COMPILE_CAP, SLOW_RATIO):  # the profile keys and Launch take their defaults from the table
        assert launch_defaults[setting.field] == setting.default
        assert Profile.model_fields[setting.field].default == setting.default
        assert not any(setting.field in p.read_text() for p in default_profiles_dir().glob("*.yaml")), "one default"


def test_a_choice_takes_its_words_and_nothing_else() -> None:
    assert ON_STALL.default == "restart" and ON_STALL.choices == ("restart", "report")
    assert SupervisorSettings(on_stall="report").on_stall == "report"
    with pytest.raises(ValueError, match="--on-stall must be one of restart, report, got 'kill'"):
        SupervisorSettings(on_stall="kill")
    assert ON_STALL.from_text("report") == "report"
    with pytest.raises(argparse.ArgumentTypeError, match="must be one of restart, report, got 'Report'"):
        ON_STALL.from_text("Report")
    assert ON_SLOW.default == "report" and SupervisorSettings(on_slow="restart").on_slow == "restart"
    with pytest.raises(ValueError, match="--on-slow must be one of report, restart, got 'kill'"):
        SupervisorSettings(on_slow="kill")


NUMBERS = [s for s in supervisor_settings() if not s.choices and s.parse is None]
TEXTS = (NOTIFY, NOTIFY_ON, METRICS_TEXTFILE, PROGRESS_PATTERN, DEADLINE, RESUME_ARGS, CHECKPOINT)
#: Texts about this run, not the machine it runs on: given on the command line only.
RUN_TEXTS = (PROGRESS_PATTERN, DEADLINE, RESUME_ARGS, CHECKPOINT)


def test_every_setting_is_a_number_a_choice_or_text() -> None:
    assert set(SETTINGS) == set(NUMBERS) | set(LAUNCH_SETTINGS) | {ON_STALL, ON_SLOW, LADDER_POLICY} | set(TEXTS)
    assert all(s.parse is not None and s.metavar for s in TEXTS)
    assert all(s.env for s in TEXTS if s not in RUN_TEXTS), "compose and health get a single text from the environment"


def test_the_ladder_policy_and_the_deadline_are_checked() -> None:
    assert (LADDER_POLICY.default, LADDER_POLICY.choices) == ("cost", ("cost", "down"))
    with pytest.raises(ValueError, match="--ladder-policy must be one of cost, down, got 'up'"):
        SupervisorSettings(ladder_policy="up")
    with pytest.raises(ValueError, match="--deadline 'soon': use HH:MM or YYYY-MM-DDTHH:MM"):
        SupervisorSettings(deadline="soon")
    now = datetime.datetime(2026, 11, 21, 23, 0)
    assert SupervisorSettings().deadline_ts(now) is None
    assert SupervisorSettings(deadline="07:00").deadline_ts(now) == datetime.datetime(2026, 11, 22, 7, 0).timestamp()


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.flag)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1])
def test_spec_refuses_what_the_cli_refuses(setting: Setting, value: float) -> None:
    with pytest.raises(ValueError, match=setting.flag):
        SupervisorSettings(**{setting.field: value})
    with pytest.raises(argparse.ArgumentTypeError):
        setting.from_text(str(value))


def test_text_settings_are_checked_by_their_own_rule() -> None:
    settings = SupervisorSettings(notify="examples/notify/ntfy.sh 'my topic'", notify_on="stall, exit")
    assert settings.notify_command == ["examples/notify/ntfy.sh", "my topic"]
    assert settings.notify_events == {"stall", "exit"}
    assert SupervisorSettings().notify_command == [] and SupervisorSettings().notify_events == {
        "give_up",
        "exit",
        "supervisor_hung",
    }
    for field, bad, said in (
        ("notify", "ntfy.sh 'unclosed", '--notify "ntfy.sh \'unclosed": No closing quotation (quote it as for a shell)'),
        ("notify", "   ", "--notify needs a command"),
        ("notify_on", "give_up,exti", "--notify-on 'give_up,exti': unknown event 'exti'; choose from stall,"),
        ("notify_on", "", "--notify-on '': no event named"),
        ("metrics_textfile", "run.txt", "--metrics-textfile 'run.txt': node_exporter's textfile collector reads only *.prom"),
        ("notify", 3, "--notify must be text, got 3"),
    ):
        with pytest.raises(ValueError) as error:
            SupervisorSettings(**{field: bad})
        assert said in str(error.value), str(error.value)


def test_text_settings_come_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINBOX_NOTIFY", "notifier --loud")
    monkeypatch.setenv("TRAINBOX_NOTIFY_ON", "")  # compose passes an unset variable as empty: the default
    monkeypatch.setenv("TRAINBOX_METRICS_TEXTFILE", "/metrics/run.prom")
    parser = argparse.ArgumentParser()
    for setting in TEXTS:
        setting.add_to(parser)
    given = SupervisorSettings.from_arguments(argparse.Namespace(**vars(parser.parse_args([])), **numbers_unset()))
    assert given.notify_command == ["notifier", "--loud"]
    assert given.notify_on == NOTIFY_ON.default and given.metrics_textfile == "/metrics/run.prom"
    flagged = parser.parse_args(["--notify", "other", "--notify-on", "exit"])
    assert (flagged.notify, flagged.notify_on) == ("other", "exit")


def numbers_unset() -> Dict[str, object]:
    return {s.dest: s.default for s in supervisor_settings() if s not in TEXTS}


def test_launch_budgets_follow_the_same_rules() -> None:
    for bad in (0.0, -5.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="--startup-timeout"):
            Launch(argv=["true"], startup_timeout=bad, stall_timeout=300.0)
        with pytest.raises(ValueError, match="--stall-timeout"):
            Launch(argv=["true"], startup_timeout=600.0, stall_timeout=bad)
    assert STARTUP_TIMEOUT.check(0.5) == 0.5


def test_counts_are_whole_numbers() -> None:
    with pytest.raises(ValueError, match="--max-restarts must be a whole number"):
        SupervisorSettings(max_restarts=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--learned-min-samples must be a whole number >= 1, got 0"):
        SupervisorSettings(learned_min_samples=0)


def cli(args: List[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainbox", *args],
        env=cli_env({"TRAIN_RUN_DIR": str(tmp_path / "run")}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--grace", "-1"], "argument --grace: must be a finite number >= 0, got -1"),
        (["--stall-timeout", "nan"], "argument --stall-timeout: must be a finite number > 0, got nan"),
        (["--startup-timeout", "inf"], "argument --startup-timeout: must be a finite number > 0, got inf"),
        (["--stall-timeout", "0"], "argument --stall-timeout: must be a finite number > 0, got 0"),
        (["--learned-min-samples", "0"], "argument --learned-min-samples: must be a whole number >= 1, got 0"),
        (["--max-restarts", "-1"], "argument --max-restarts: must be a whole number >= 0, got -1"),
        (["--max-restarts", "two"], "argument --max-restarts: expected a whole number, got 'two'"),
        (["--learned-factor=-inf"], "argument --learned-factor: must be a finite number >= 0, got -inf"),
        (["--learned-floor", "0"], "argument --learned-floor: must be a finite number > 0, got 0"),
        (["--backoff", "120"], "--backoff-max (60) must be >= --backoff (120): raise --backoff-max or lower --backoff"),
        (["--idle-timeout", "-1"], "argument --idle-timeout: must be a finite number >= 0, got -1"),
        (["--compile-cap", "inf"], "argument --compile-cap: must be a finite number >= 0, got inf"),
        (["--on-stall", "ignore"], "argument --on-stall: must be one of restart, report, got 'ignore'"),
        (["--notify-on", "give_up,exti"], "argument --notify-on: 'give_up,exti': unknown event 'exti'; choose from stall,"),
        (["--notify", "notify.sh 'topic"], 'argument --notify: "notify.sh \'topic": No closing quotation'),
        (["--metrics-textfile", "m.txt"], "argument --metrics-textfile: 'm.txt': node_exporter's textfile collector reads only"),
        (["--progress-pattern", "step (\\d+"], "argument --progress-pattern: 'step (\\\\d+': not a regular expression"),
        (["--progress-pattern", "img (?P<n>\\d+)"], "--progress-pattern: 'img (?P<n>\\\\d+)': unknown group 'n'"),
        (["--progress-pattern", "(?P<step>\\d*)"], "it matches an empty line"),
    ],
)
def test_bad_values_are_one_line_and_exit_2_through_the_cli(args: List[str], says: str, tmp_path: Path) -> None:
    done = cli(["supervise", *args, "--", "true"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], "one line, no traceback"
    assert done.stderr.startswith("trainbox: error: ") and says in done.stderr, done.stderr
    assert not (tmp_path / "run").exists(), "nothing may start on a bad value"


def test_a_bad_value_from_the_environment_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", "supervise", "--", "true"],
        env=cli_env({"TRAIN_RUN_DIR": str(tmp_path / "run"), "TRAINBOX_NOTIFY_ON": "giveup"}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "argument --notify-on: 'giveup': unknown event 'giveup'" in done.stderr
    assert not (tmp_path / "run").exists()


def test_progress_patterns_are_repeated_and_kept_in_order() -> None:
    args = build_parser().parse_args(
        ["supervise", "--progress-pattern", r"a (?P<step>\d+)", "--progress-pattern", r"b (?P<epoch>\d+)"]
    )
    assert SupervisorSettings.from_arguments(args).progress_patterns == (r"a (?P<step>\d+)", r"b (?P<epoch>\d+)")
    assert SupervisorSettings.from_arguments(build_parser().parse_args(["supervise"])).progress_patterns == ()
    with pytest.raises(ValueError, match="--progress-pattern 'x': no counter in it"):
        SupervisorSettings(progress_patterns=("x",))


def test_run_refuses_bad_values_before_loading_anything(tmp_path: Path) -> None:
    done = cli(["run", "--profile", "safe", "--grace", "nan", "epochs=1"], tmp_path)
    assert done.returncode == 2 and "argument --grace: must be a finite number >= 0, got nan" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()
