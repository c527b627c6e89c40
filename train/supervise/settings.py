"""The supervisor's settings, each defined once: flag, default, help and the values it accepts.

``SETTINGS`` is the one table. ``python -m trainbox supervise`` and ``run``
derive their options from it (``add_arguments``), ``SupervisorSettings``
takes its defaults from it and validates every value against it on creation,
and ``Launch`` checks its two budgets with the same rules. A bad value is an
error that names the flag, never quietly adjusted: nan and inf are refused
everywhere (no budget, delay or count is infinite), and each setting says its
own lower bound. A setting may be a choice of words instead of a number
(``--on-stall restart|report``): then ``choices`` lists them. Or it is text that
``parse`` checks (``--notify CMD``, ``--notify-on LIST``, ``--metrics-textfile
PATH``); such a setting may also come from an environment variable (``env``),
used when the flag is not given: that is how compose and the containers'
health check get it (compose.yaml passes ``TRAINBOX_NOTIFY`` and the others on).
A text setting may be ``repeatable`` (``--progress-pattern REGEX``, given any
number of times): then it holds every value given, in order, each one checked.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
from dataclasses import dataclass
from typing import Callable, FrozenSet, Iterator, List, Optional, Tuple, Union

from trainbox.supervise.notify import events as notify
from trainbox.supervise.output.pattern import PATTERN_FLAG, pattern_problem
from trainbox.supervise.stalls.budgets import EARLY_SAMPLES

Number = Union[int, float]
#: What a setting holds: a number, one of its ``choices``, a text, or every text given for a repeatable one.
Value = Union[int, float, str, Tuple[str, ...]]


#: The ``argparse.Namespace`` attribute that holds the options the user gave (their ``dest``s): see :func:`given`.
GIVEN = "given_on_command_line"


class _Given(argparse.Action):
    """Stores an option's value and notes that the user gave it (a default is not a choice: a ``--stall-timeout``
    the user gives bounds every silence, the default does not)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: object = None
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, frozenset(getattr(namespace, GIVEN, frozenset())) | {self.dest})


def given(args: argparse.Namespace) -> FrozenSet[str]:
    """The ``dest`` of every option the user gave on the command line."""
    return frozenset(getattr(args, GIVEN, frozenset()))


@dataclass(frozen=True)
class Setting:
    """One option: ``field`` (in ``SupervisorSettings`` or ``Launch``) and ``flag`` name the same value."""

    field: str
    flag: str
    default: Value
    help: str
    #: The smallest value accepted; ``above`` makes it exclusive (a budget of 0 s means nothing).
    minimum: Number = 0
    above: bool = False
    #: A count (int) rather than seconds or a factor (float).
    whole: bool = False
    #: ``python -m trainbox run`` leaves it unset by default: the profile supplies it.
    profile_supplies: bool = False
    #: The words accepted, for a choice rather than a number (the first is not implied: ``default`` is).
    choices: Tuple[str, ...] = ()
    #: For text: raises ValueError (one phrase, without the flag) for text it refuses.
    parse: Optional[Callable[[str], object]] = None
    #: For text: the environment variable that supplies it when the flag is not given (empty: unset).
    env: str = ""
    #: How ``--help`` names the value (argparse's default, the flag in capitals, when None).
    metavar: Optional[str] = None
    #: For text: given any number of times; the setting holds every value, in order (a tuple).
    repeatable: bool = False

    @property
    def dest(self) -> str:
        """argparse's attribute for ``flag``."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def rule(self) -> str:
        if self.parse is not None:
            return "text, any number of times" if self.repeatable else "text"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return f"{'>' if self.above else '>='} {self.minimum:g}"

    @property
    def number(self) -> Number:
        """The default of a number setting, typed as one (a choice has none)."""
        if isinstance(self.default, (str, tuple)):
            raise TypeError(f"{self.flag} is a choice or a text, not a number")
        return self.default

    @property
    def default_text(self) -> str:
        """The default as ``--help`` shows it."""
        if self.env:
            return f"${self.env}, else {self.default or 'none'}"
        if isinstance(self.default, tuple):
            return ", ".join(self.default) or "none"
        return self.default if isinstance(self.default, str) else f"{self.default:g}"

    @property
    def initial(self) -> Value:
        """The value before the command line: the environment's (``env``, when set and not empty), else the default."""
        return (os.environ.get(self.env) or self.default) if self.env else self.default

    def problem(self, value: object) -> Optional[str]:
        """Why ``value`` is refused (one phrase), or None when it is acceptable."""
        if self.parse is not None and self.repeatable:
            if not isinstance(value, tuple) or not all(isinstance(text, str) for text in value):
                return f"must be texts, got {value!r}"
            return next(filter(None, map(self._text_problem, value)), None)
        if self.parse is not None:
            return self._text_problem(value) if isinstance(value, str) else f"must be text, got {value!r}"
        if self.choices:
            return None if value in self.choices else f"must be {self.rule}, got {value!r}"
        kinds = (int,) if self.whole else (int, float)
        wanted = f"{'a whole number' if self.whole else 'a finite number'} {self.rule}"
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"must be {wanted}, got {value!r}"
        if not math.isfinite(value) or value < self.minimum or (self.above and value == self.minimum):
            return f"must be {wanted}, got {value:g}"
        return None

    def check(self, value: Value) -> Value:
        """``value`` when acceptable, else ValueError with one line naming the flag."""
        problem = self.problem(value)
        if problem:
            raise ValueError(f"{self.flag} {problem}")
        return value

    def _text_problem(self, text: str) -> Optional[str]:
        """Why ``parse`` refuses ``text`` (one phrase), or None."""
        try:
            self.parse(text)  # type: ignore[misc]
        except ValueError as exc:
            return str(exc)
        return None

    def from_text(self, text: str) -> Value:
        """argparse's ``type``: the parsed, checked value (argparse names the flag in its error)."""
        if self.parse is not None or self.choices:
            problem = self._text_problem(text) if self.parse is not None else self.problem(text)
            if problem:
                raise argparse.ArgumentTypeError(problem)
            return text
        try:
            value: Value = int(text) if self.whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if self.whole else 'a number'}, got {text!r}") from None
        problem = self.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    def add_to(self, parser: argparse.ArgumentParser, profile_defaults: bool = False) -> None:
        """Add the option; with ``profile_defaults``, one the profile supplies is unset by default."""
        unset = profile_defaults and self.profile_supplies
        default_text = "the profile's" if unset else self.default_text
        if self.repeatable:  # argparse collects a list; the settings hold a tuple (from_parsed)
            parser.add_argument(
                self.flag,
                type=self.from_text,
                action="append",
                metavar=self.metavar,
                help=f"{self.help} (default: {default_text})",
            )
            return
        parser.add_argument(
            self.flag,
            type=self.from_text,
            action=_Given,
            default=None if unset else self.initial,  # argparse checks a text default with ``type`` too (the environment's)
            metavar=self.metavar,
            help=f"{self.help} (default: {default_text})",
        )

    def from_parsed(self, value: object) -> object:
        """The value ``add_to``'s option parsed into, as the settings hold it (a repeatable one as a tuple)."""
        return tuple(value or ()) if self.repeatable else value  # type: ignore[call-overload]


STARTUP_TIMEOUT = Setting(
    "startup_timeout", "--startup-timeout", 600.0, "seconds until the first beat", 0, above=True, profile_supplies=True
)
STALL_TIMEOUT = Setting(
    "stall_timeout", "--stall-timeout", 300.0, "seconds allowed between beats", 0, above=True, profile_supplies=True
)
GRACE = Setting("grace_s", "--grace", 30.0, "seconds between SIGTERM and SIGKILL", 0)
MAX_RESTARTS = Setting("max_restarts", "--max-restarts", 5, "restarts before giving up", 0, whole=True)
BACKOFF = Setting("backoff_s", "--backoff", 2.0, "first restart delay in seconds, doubled per quick failure", 0)
BACKOFF_MAX = Setting("backoff_max_s", "--backoff-max", 60.0, "the longest restart delay in seconds, >= --backoff", 0)
LEARNED_FACTOR = Setting(
    "learned_factor", "--learned-factor", 3.0, "learned budget = factor x slowest silent interval in a phase; 0 disables", 0
)
LEARNED_FLOOR = Setting("learned_floor_s", "--learned-floor", 60.0, "learned budgets never go below this", 0, above=True)
#: The supervisor rewrites state.json every second; a few seconds of silence can be a loaded machine's
#: scheduling, hence the floor of 5 s. ``health --act`` ends a supervisor silent for longer (trainbox.supervise.watchdog).
HUNG_AFTER = Setting(
    "hung_after_s", "--hung-after", 60.0, "seconds without a state.json update before `health --act` ends the supervisor", 5
)
LEARNED_MIN_SAMPLES = Setting(
    "learned_min_samples",
    "--learned-min-samples",
    20,
    f"intervals to see in a phase before learning its budget (a steady counter: from {EARLY_SAMPLES}, with a wider margin)",
    1,
    whole=True,
)
#: 120 s: long enough that no working phase keeps the whole tree that quiet (a cold MIOpen compile burns a core,
#: a slow disk shows I/O, a GPU kernel keeps the GPU busy), short enough that a deadlock costs minutes, not the
#: 20 of a 1200 s startup or validation budget. See trainbox.supervise.stalls.silence.
IDLE_TIMEOUT = Setting(
    "idle_timeout",
    "--idle-timeout",
    120.0,
    "seconds the whole silent tree may stay idle (no CPU, I/O, cache growth) before it is stalled; 0 disables",
    0,
    profile_supplies=True,
)
#: Two hours: a cold MIOpen cache for a new model and image size has been seen to take over an hour on gfx1010.
COMPILE_CAP = Setting(
    "compile_cap",
    "--compile-cap",
    7200.0,
    "seconds of silence a kernel compile that shows progress may extend its budget to; 0: never extend",
    0,
    profile_supplies=True,
)
ON_STALL = Setting(
    "on_stall",
    "--on-stall",
    "restart",
    "restart: kill the stalled tree and restart; report: write the incident and a stall event, kill nothing",
    choices=("restart", "report"),
)
#: The default of ``--slow-ratio``: steps 30 % longer than this run's pace (NVIDIA's straggler detection flags a
#: 30 % drop by default; +-30 % is also the per-step spread of a loaded 2-core machine, which must stay unflagged).
DEFAULT_SLOW_RATIO = 1.3
#: A run slower than its own pace: see trainbox.supervise.pace.detector (the detector) and trainbox.supervise.pace.watch.
SLOW_RATIO = Setting(
    "slow_ratio",
    "--slow-ratio",
    DEFAULT_SLOW_RATIO,
    "call the run slow when its steps take this many times as long as at its own steady pace "
    "(1.3: 30 percent longer, a step rate at or below 1/1.3 = 0.77x of it)",
    1,
    above=True,
    profile_supplies=True,
)
ON_SLOW = Setting(
    "on_slow",
    "--on-slow",
    "report",
    "report: record a slowdown (slow and recovered events) and act on nothing; restart: also restart an attempt "
    "whose slowdown lies inside the run (memory it grew, its data loader) once it lasted --slow-restart-after",
    choices=("report", "restart"),
)
#: Ten minutes: a fail-slow that lasts that long is no passing hiccup (Falcon's lasted tens of seconds to hours), and
#: a mid-epoch checkpoint every 300 s (the profiles' default) loses at most half of that to the restart.
SLOW_RESTART_AFTER = Setting(
    "slow_restart_after_s",
    "--slow-restart-after",
    600.0,
    "seconds an attempt must have been slow, for a suspect inside the run, before --on-slow restart restarts it",
    0,
)


def _pattern(text: str) -> None:
    problem = pattern_problem(text)
    if problem:
        raise ValueError(problem)


PROGRESS_PATTERN = Setting(
    "progress_patterns",
    PATTERN_FLAG,
    (),
    "a progress line of your own, read before the built-in ones while the child does not beat; named "
    "groups step, batch or epoch (the counter), total and phase optional; repeat for more",
    parse=_pattern,
    metavar="REGEX",
    repeatable=True,
)


def _command(text: str) -> None:
    if text:  # empty: no notifier
        notify.parse_command(text)


#: The suffix node_exporter's textfile collector reads (it passes over every other file in its directory).
TEXTFILE_SUFFIX = ".prom"


def _textfile(text: str) -> None:
    if text and not text.endswith(TEXTFILE_SUFFIX):
        raise ValueError(f"{text!r}: node_exporter's textfile collector reads only *{TEXTFILE_SUFFIX} files; name it so")


NOTIFY = Setting(
    "notify",
    "--notify",
    "",
    "run this command line (no shell) on the events --notify-on names: the event as JSON on its stdin, "
    f"its name in ${notify.EVENT_ENV}; detached, {notify.LIMIT_S:g} s at most (examples/notify/)",
    parse=_command,
    env="TRAINBOX_NOTIFY",
    metavar="CMD",
)
NOTIFY_ON = Setting(
    "notify_on",
    "--notify-on",
    ",".join(name for name in notify.NOTIFY_EVENTS if name in notify.DEFAULT_EVENTS),
    f"the events --notify is run on, comma-separated, of {','.join(notify.NOTIFY_EVENTS)}",
    parse=notify.parse_events,
    env="TRAINBOX_NOTIFY_ON",
    metavar="EVENTS",
)
METRICS_TEXTFILE = Setting(
    "metrics_textfile",
    "--metrics-textfile",
    "",
    "keep the run's Prometheus metrics in this node_exporter textfile (*.prom), rewritten every few seconds",
    parse=_textfile,
    env="TRAINBOX_METRICS_TEXTFILE",
    metavar="PATH",
)

LADDER_POLICY = Setting(
    "ladder_policy",
    "--ladder-policy",
    "cost",
    "cost: after a stall or at a checkpoint, the rung expected to finish first (stays on an intermittent hang, "
    "probes back up); down: a stall moves one rung down for good (docs/profiles-and-ladders.md: 'The rung that finishes first')",
    choices=("cost", "down"),
)

#: What ``--deadline`` takes (``trainbox run``/``supervise``, and ``status``/``report``), for its help and its error.
DEADLINE_FORMATS = "HH:MM or YYYY-MM-DDTHH:MM[+01:00]"
#: The years a deadline may fall in: a unix time, with a day of room either side for the arithmetic on it (an
#: ETA, a margin, a next ``HH:MM``); 0001-01-01 with an offset, or 9999-12-31, cannot even be a local time.
DEADLINE_YEARS = (1970, 9998)


def parse_deadline(text: str, now: datetime.datetime) -> datetime.datetime:
    """ISO date-time (``2026-11-21T07:00``, with or without a UTC offset) or ``HH:MM`` (the next such time), on this
    machine's clock; ValueError (one phrase) for anything else."""
    try:
        if len(text) <= 5 and ":" in text:
            clock = datetime.datetime.strptime(text, "%H:%M").time()
            moment = datetime.datetime.combine(now.date(), clock)
            return moment if moment > now else moment + datetime.timedelta(days=1)
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r}: use {DEADLINE_FORMATS}") from None
    first, last = DEADLINE_YEARS
    if not first <= moment.year <= last:
        raise ValueError(f"{text!r}: give a date from {first} to {last}")
    # With a UTC offset (2026-11-22T07:00+01:00): the same moment on this machine's clock, which ETAs use.
    return moment.astimezone().replace(tzinfo=None) if moment.tzinfo else moment


def _deadline(text: str) -> None:
    if text:  # empty: none
        parse_deadline(text, datetime.datetime.now())


DEADLINE = Setting(
    "deadline",
    "--deadline",
    "",
    "when the run should be done: the ladder then prefers the rung most likely to finish by then",
    parse=_deadline,
    metavar="WHEN",
)

#: ``--resume-args none``: a restart adds nothing, even for a program trainbox knows.
NO_RESUME = "none"
#: What ``--resume-args`` puts in place of this in each word: the path of the checkpoint resumed from.
CHECKPOINT_FIELD = "{checkpoint}"


def resume_words(text: str) -> Tuple[str, ...]:
    """``--resume-args``' words (shell quoting), ValueError (one phrase) for text that cannot be split."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc} (quote it as a shell would)") from None
    return words


RESUME_ARGS = Setting(
    "resume_args",
    "--resume-args",
    "",
    f"what a restart adds to the command so it resumes, e.g. '--resume {CHECKPOINT_FIELD}' ({CHECKPOINT_FIELD}: the newest "
    "complete checkpoint of this run, found by --checkpoint); empty: the built-in way for a program trainbox knows "
    f"(yolo train, a Hugging Face Trainer script, nanoGPT, Lightning), else nothing; '{NO_RESUME}': never add anything",
    parse=resume_words,
    metavar="ARGS",
)
CHECKPOINT = Setting(
    "checkpoint",
    "--checkpoint",
    "",
    "where the command writes its checkpoints: a glob (files or folders, ** for any depth), relative to the working "
    "directory or the run directory; the newest complete one is resumed from, whatever its age",
    parse=str,
    metavar="GLOB",
)

#: Every supervisor setting, in the order ``--help`` lists them.
SETTINGS = (
    STARTUP_TIMEOUT,
    STALL_TIMEOUT,
    GRACE,
    MAX_RESTARTS,
    BACKOFF,
    BACKOFF_MAX,
    LEARNED_FACTOR,
    LEARNED_FLOOR,
    LEARNED_MIN_SAMPLES,
    HUNG_AFTER,
    IDLE_TIMEOUT,
    COMPILE_CAP,
    ON_STALL,
    SLOW_RATIO,
    ON_SLOW,
    SLOW_RESTART_AFTER,
    NOTIFY,
    NOTIFY_ON,
    METRICS_TEXTFILE,
    PROGRESS_PATTERN,
    LADDER_POLICY,
    DEADLINE,
    RESUME_ARGS,
    CHECKPOINT,
)
#: The budgets and the slow ratio belong to each attempt's ``Launch`` (a profile may change them); the rest to the
#: supervisor.
LAUNCH_SETTINGS = (STARTUP_TIMEOUT, STALL_TIMEOUT, IDLE_TIMEOUT, COMPILE_CAP, SLOW_RATIO)


def supervisor_settings() -> Iterator[Setting]:
    return (s for s in SETTINGS if s not in LAUNCH_SETTINGS)


def add_arguments(parser: argparse.ArgumentParser, profile_defaults: bool = False) -> None:
    for setting in SETTINGS:
        setting.add_to(parser, profile_defaults)


@dataclass(frozen=True)
class SupervisorSettings:
    """The supervisor's own settings; defaults and rules from ``SETTINGS``."""

    grace_s: float = GRACE.number
    max_restarts: int = int(MAX_RESTARTS.number)
    backoff_s: float = BACKOFF.number
    backoff_max_s: float = BACKOFF_MAX.number
    learned_factor: float = LEARNED_FACTOR.number
    learned_floor_s: float = LEARNED_FLOOR.number
    learned_min_samples: int = int(LEARNED_MIN_SAMPLES.number)
    on_stall: str = str(ON_STALL.default)
    hung_after_s: float = HUNG_AFTER.number
    on_slow: str = str(ON_SLOW.default)
    slow_restart_after_s: float = SLOW_RESTART_AFTER.number
    notify: str = str(NOTIFY.default)
    notify_on: str = str(NOTIFY_ON.default)
    metrics_textfile: str = str(METRICS_TEXTFILE.default)
    progress_patterns: Tuple[str, ...] = ()
    ladder_policy: str = str(LADDER_POLICY.default)
    deadline: str = str(DEADLINE.default)
    resume_args: str = str(RESUME_ARGS.default)
    checkpoint: str = str(CHECKPOINT.default)

    def __post_init__(self) -> None:
        for setting in supervisor_settings():
            setting.check(getattr(self, setting.field))
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"{BACKOFF_MAX.flag} ({self.backoff_max_s:g}) must be >= {BACKOFF.flag} ({self.backoff_s:g}): "
                f"raise {BACKOFF_MAX.flag} or lower {BACKOFF.flag}"
            )

    @property
    def notify_command(self) -> List[str]:
        """``--notify``'s words (none: no notifier)."""
        return notify.parse_command(self.notify) if self.notify else []

    def deadline_ts(self, now: datetime.datetime) -> Optional[float]:
        """``--deadline`` as a unix time (an ``HH:MM`` is the next such time after ``now``), None without one."""
        return parse_deadline(self.deadline, now).timestamp() if self.deadline else None

    @property
    def notify_events(self) -> FrozenSet[str]:
        return notify.parse_events(self.notify_on)

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> SupervisorSettings:
        """From parsed options (``add_arguments``); ValueError for a combination that does not hold."""
        return cls(**{s.field: s.from_parsed(getattr(args, s.dest)) for s in supervisor_settings()})
