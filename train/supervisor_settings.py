"""The supervisor's settings, each defined once: flag, default, help and the values it accepts.

``SETTINGS`` is the one table. ``python -m trainbox supervise`` and ``run``
derive their options from it (``add_arguments``), ``SupervisorSettings``
takes its defaults from it and validates every value against it on creation,
and ``Launch`` checks its two budgets with the same rules. A bad value is an
error that names the flag, never quietly adjusted: nan and inf are refused
everywhere (no budget, delay or count is infinite), and each setting says its
own lower bound.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Union

Number = Union[int, float]


@dataclass(frozen=True)
class Setting:
    """One option: ``field`` (in ``SupervisorSettings`` or ``Launch``) and ``flag`` name the same value."""

    field: str
    flag: str
    default: Number
    help: str
    #: The smallest value accepted; ``above`` makes it exclusive (a budget of 0 s means nothing).
    minimum: Number
    above: bool = False
    #: A count (int) rather than seconds or a factor (float).
    whole: bool = False
    #: ``python -m trainbox run`` leaves it unset by default: the profile supplies it.
    profile_supplies: bool = False

    @property
    def dest(self) -> str:
        """argparse's attribute for ``flag``."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def rule(self) -> str:
        return f"{'>' if self.above else '>='} {self.minimum:g}"

    def problem(self, value: object) -> Optional[str]:
        """Why ``value`` is refused (one phrase), or None when it is acceptable."""
        kinds = (int,) if self.whole else (int, float)
        wanted = f"{'a whole number' if self.whole else 'a finite number'} {self.rule}"
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"must be {wanted}, got {value!r}"
        if not math.isfinite(value) or value < self.minimum or (self.above and value == self.minimum):
            return f"must be {wanted}, got {value:g}"
        return None

    def check(self, value: Number) -> Number:
        """``value`` when acceptable, else ValueError with one line naming the flag."""
        problem = self.problem(value)
        if problem:
            raise ValueError(f"{self.flag} {problem}")
        return value

    def from_text(self, text: str) -> Number:
        """argparse's ``type``: the parsed, checked value (argparse names the flag in its error)."""
        try:
            value: Number = int(text) if self.whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if self.whole else 'a number'}, got {text!r}") from None
        problem = self.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    def add_to(self, parser: argparse.ArgumentParser, profile_defaults: bool = False) -> None:
        """Add the option; with ``profile_defaults``, one the profile supplies is unset by default."""
        unset = profile_defaults and self.profile_supplies
        default_text = "the profile's" if unset else f"{self.default:g}"
        parser.add_argument(
            self.flag,
            type=self.from_text,
            default=None if unset else self.default,
            help=f"{self.help} (default: {default_text})",
        )


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
#: scheduling, hence the floor of 5 s. ``health --act`` ends a supervisor silent for longer (trainbox.watchdog).
HUNG_AFTER = Setting(
    "hung_after_s", "--hung-after", 60.0, "seconds without a state.json update before `health --act` ends the supervisor", 5
)
LEARNED_MIN_SAMPLES = Setting(
    "learned_min_samples", "--learned-min-samples", 20, "intervals to see in a phase before learning its budget", 1, whole=True
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
)
#: The two budgets belong to each attempt's ``Launch`` (a profile may change them); the rest to the supervisor.
LAUNCH_SETTINGS = (STARTUP_TIMEOUT, STALL_TIMEOUT)


def supervisor_settings() -> Iterator[Setting]:
    return (s for s in SETTINGS if s not in LAUNCH_SETTINGS)


def add_arguments(parser: argparse.ArgumentParser, profile_defaults: bool = False) -> None:
    for setting in SETTINGS:
        setting.add_to(parser, profile_defaults)


@dataclass(frozen=True)
class SupervisorSettings:
    """The supervisor's own settings; defaults and rules from ``SETTINGS``."""

    grace_s: float = GRACE.default
    max_restarts: int = int(MAX_RESTARTS.default)
    backoff_s: float = BACKOFF.default
    backoff_max_s: float = BACKOFF_MAX.default
    learned_factor: float = LEARNED_FACTOR.default
    learned_floor_s: float = LEARNED_FLOOR.default
    learned_min_samples: int = int(LEARNED_MIN_SAMPLES.default)
    hung_after_s: float = HUNG_AFTER.default

    def __post_init__(self) -> None:
        for setting in supervisor_settings():
            setting.check(getattr(self, setting.field))
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"{BACKOFF_MAX.flag} ({self.backoff_max_s:g}) must be >= {BACKOFF.flag} ({self.backoff_s:g}): "
                f"raise {BACKOFF_MAX.flag} or lower {BACKOFF.flag}"
            )

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> SupervisorSettings:
        """From parsed options (``add_arguments``); ValueError for a combination that does not hold."""
        return cls(**{s.field: getattr(args, s.dest) for s in supervisor_settings()})
