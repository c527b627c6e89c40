"""``trainbox supervise --ladder FILE -- CMD ...``: the safer-settings ladder for any command.

The seeds' users stepped their own scripts down by hand, one night at a time: ``--num_workers 4 -> 2 -> 0``,
``--no_compile``, spawn instead of fork. A ladder file writes those steps down once, as rungs from fast to
careful::

    rungs:
      - name: fast
        args: ["--num_workers", "4"]
      - name: careful
        args: ["--num_workers", "0", "--no_compile"]
        env: {OMP_NUM_THREADS: "2"}

Each attempt runs CMD with its rung's ``args`` appended (argparse and click take the last value of a repeated
option, so a rung overrides what CMD says) and its ``env`` added to the child's environment. A rung may say how
fast it is against the others (``expected_speed``, default 1): the ladder policy's prior until this run has
measured it. The first attempt takes the first rung. After a stall the retry is chosen by the stall's cause, as
for ``trainbox run``'s profiles (:meth:`trainbox.supervise.planner.Planner.after`,
:data:`trainbox.supervise.policy.RETRIES`): for ``ladder`` the ladder policy (:mod:`trainbox.supervise.ladder.run`,
``--ladder-policy``) chooses the rung, the same or a safer one, and at each checkpoint it may probe a faster one
again; ``native`` steps down to the next rung (a command has no convolution backend of its own to switch, so the
next rung is the careful one), ``same`` and ``gpu_release`` run the same rung again; on the last rung every retry
runs it again, and the same stall at the same place there ends the run (the repeat rule). A crash keeps the rung.
Events name the rung where they name a profile (``start``'s and ``restart``'s ``profile``), so ``status`` and
the report show it; the same place on another rung is another try.

:func:`load` validates the file: a mistake is one line naming the file and the field (exit 2), before anything
starts. The rung list and the move are all here (:class:`CommandLadder`), so a policy that weighs what a rung
costs can stand in front of it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainbox.errors import UserError
from trainbox.rundir.events import Retry
from trainbox.supervise.ladder import policy as ladder_policy
from trainbox.supervise.ladder.run import RungLadder, RungLedger
from trainbox.supervise.planner import Launch, Next, moved_reason
from trainbox.supervise.policy import CauseStreak, Outcome
from trainbox.supervise.settings import SupervisorSettings


class LadderError(UserError):
    """A ladder file that cannot be used; its message is one line naming the file and the field."""


def _text(value: Any) -> Any:
    """A YAML number written without quotes (``4``, ``0.5``) as the text it stands for; anything else unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


class Rung(BaseModel):
    """One rung: its name (the events' ``profile``), the arguments appended to CMD, the environment added."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^\S+$", description="the rung's name, one word")
    expected_speed: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="its speed relative to the other rungs, until this run measures it"
    )
    args: List[str] = Field(default_factory=list, description="appended to the command")
    env: Dict[str, str] = Field(default_factory=dict, description="added to the child's environment")

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_text(cls, value: Any) -> Any:
        return [_text(item) for item in value] if isinstance(value, list) else value

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, value: Any) -> Any:
        return {key: _text(item) for key, item in value.items()} if isinstance(value, dict) else value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: Dict[str, str]) -> Dict[str, str]:
        for key in value:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"{key!r} is not an environment variable name")
        return value


class LadderFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rungs: List[Rung] = Field(min_length=1, description="from fast to careful")

    @field_validator("rungs")
    @classmethod
    def _names_differ(cls, rungs: List[Rung]) -> List[Rung]:
        names = [rung.name for rung in rungs]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"rung name {twice[0]!r} is used twice")
        return rungs


def _one_line(path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(file)"
    return f"ladder {path}: field '{field}': {first['msg'].replace('Value error, ', '')}"


def load(path: Path) -> List[Rung]:
    """The rungs of ladder file ``path``, validated; LadderError (one line, exit 2) when it cannot be used."""
    try:
        data = yaml.safe_load(Path(path).read_text())  # not the run directory: the person's ladder file
    except OSError as exc:
        raise LadderError(f"ladder {path}: cannot read it ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LadderError(f"ladder {path}: not valid YAML" + (f" (line {mark.line + 1})" if mark else "")) from None
    if not isinstance(data, dict):
        raise LadderError(f"ladder {path}: expected a mapping with 'rungs', got {type(data).__name__}")
    try:
        return list(LadderFile(**data).rungs)
    except ValidationError as exc:
        raise LadderError(_one_line(path, exc)) from None
    except TypeError:  # keys that are not strings (``1: x``)
        raise LadderError(f"ladder {path}: its keys must be words ('rungs')") from None


class CommandLadder(RungLadder):
    """Moves a command between its rungs after stalls and at checkpoints (see the module docstring)."""

    def __init__(self, launch: Launch, rungs: Sequence[Rung], settings: Optional[SupervisorSettings] = None) -> None:
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        super().__init__(launch)
        self.rungs = list(rungs)
        self.index = 0
        policy_rungs = [ladder_policy.Rung(rung.name, rung.expected_speed) for rung in self.rungs]
        self.ledger = RungLedger.from_settings(policy_rungs, settings or SupervisorSettings())

    def current(self) -> Launch:
        rung = self.rungs[self.index]
        return replace(self.launch, argv=[*self.launch.argv, *rung.args], env={**self.launch.env, **rung.env}, profile=rung.name)

    def first(self) -> Launch:
        return self.current()

    def describe(self) -> str:
        return self.rungs[self.index].name

    def go_to(self, rung: str) -> None:
        index = [r.name for r in self.rungs].index(rung)
        if index != self.index:
            self.index, self.streak = index, CauseStreak()

    def move(self, retry: Retry, cause: str, outcome: Outcome) -> Next:
        before = self.describe()
        decision = self.ladder_rung(outcome) if retry is Retry.LADDER else None
        if decision is not None:
            self.go_to(decision.rung)
            return Next(self.current(), retry, self.ladder_reason(cause, decision, before))
        if retry in (Retry.LADDER, Retry.NATIVE) and self.index + 1 < len(self.rungs):
            self.go_to(self.rungs[self.index + 1].name)
        return Next(self.current(), retry, moved_reason(cause, retry, before, self.describe()))
