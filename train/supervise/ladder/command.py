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
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

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
    """A ladder file that cannot be used; its message is one line naming the file, the rung and the field."""


class _Words(yaml.SafeLoader):
    """YAML with every scalar as the text written (``0x10``, ``010``, ``1:30``, ``1.10``, ``true`` stay those words:
    YAML 1.1 would make them 16, 8, 90, 1.1 and True), except an empty value or ``null``, which is nothing."""


_Words.yaml_implicit_resolvers = {
    first: [(tag, rule) for tag, rule in rules if tag == "tag:yaml.org,2002:null"]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _runnable(words: List[str]) -> List[str]:
    """``words`` when each can be passed to a command; a NUL byte cannot (the OS ends the word there)."""
    if any("\0" in word for word in words):
        raise ValueError("a NUL byte cannot be passed to a command")
    return words


class Rung(BaseModel):
    """One rung: its name (the events' ``profile``), the arguments appended to CMD, the environment added, and what
    a restart on it adds to resume (``{checkpoint}``: the newest complete checkpoint; trainbox.supervise.resume)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^\S+$", description="the rung's name, one word")
    expected_speed: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="its speed relative to the other rungs, until this run measures it"
    )
    args: List[str] = Field(default_factory=list, description="appended to the command")
    env: Dict[str, str] = Field(default_factory=dict, description="added to the child's environment")
    resume: Optional[List[str]] = Field(default=None, description="what a restart on this rung adds to resume")

    @field_validator("args", "resume")
    @classmethod
    def _args_runnable(cls, value: Optional[List[str]]) -> Optional[List[str]]:
        return None if value is None else _runnable(value)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: Dict[str, str]) -> Dict[str, str]:
        for key, text in value.items():
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"{key!r} is not an environment variable name")
            if "\0" in text:
                raise ValueError(f"{key}: a NUL byte cannot be in an environment value")
        return value


class LadderFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rungs: List[Rung] = Field(min_length=1, description="from fast to careful")

    @field_validator("rungs")
    @classmethod
    def _names_differ(cls, rungs: List[Rung]) -> List[Rung]:
        seen: Dict[str, int] = {}  # one pass: 50,000 rungs are checked at once, not in 50,000 passes
        for number, rung in enumerate(rungs, 1):
            if rung.name in seen:
                raise ValueError(f"rung name {rung.name!r} is used twice (rungs {seen[rung.name]} and {number})")
            seen[rung.name] = number
        return rungs


def _node_at(node: Optional[yaml.Node], loc: Sequence[Any]) -> Optional[yaml.Node]:
    """The deepest node of the composed file along a validation error's ``loc`` (for its line)."""
    for at, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            pair = next(((key, value) for key, value in node.value if key.value == part), None)
            if pair is None:
                return node
            node = pair[0] if at == len(loc) - 1 else pair[1]  # the last part: the line of its key
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def _where(data: Any, loc: Sequence[Any]) -> Tuple[str, Tuple[Any, ...]]:
    """``rung 'careful': `` (else ``rung 2: ``, counting from 1) and the field's path inside it, for ``rungs.<i>...``."""
    if len(loc) < 2 or loc[0] != "rungs" or not isinstance(loc[1], int):
        return "", tuple(loc)
    rungs = data.get("rungs") if isinstance(data, dict) else None
    rung = rungs[loc[1]] if isinstance(rungs, list) and loc[1] < len(rungs) else None
    name = rung.get("name") if isinstance(rung, dict) else None
    return (f"rung {name!r}: " if isinstance(name, str) and name else f"rung {loc[1] + 1}: "), tuple(loc[2:])


def _one_line(path: Path, error: ValidationError, data: Any, root: Optional[yaml.Node]) -> str:
    first = error.errors()[0]
    node = _node_at(root, first["loc"])
    line = f" line {node.start_mark.line + 1}" if node is not None else ""
    rung, rest = _where(data, first["loc"])
    field = f"field '{'.'.join(str(part) for part in rest)}': " if rest else ("" if rung else "the file: ")
    return f"ladder {path}{line}: {rung}{field}{first['msg'].replace('Value error, ', '')}"


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """Where the YAML went wrong: the line of what was left open (a bracket, a quote), and where that was found."""
    context, problem = getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)
    said = ", ".join(str(text) for text in (getattr(exc, "context", None), getattr(exc, "problem", None)) if text)
    if context is not None and problem is not None and context.line != problem.line:
        return f"ladder {path}: not valid YAML at line {context.line + 1} ({said}, at line {problem.line + 1})"
    mark = problem or context
    return f"ladder {path}: not valid YAML" + (f" at line {mark.line + 1}" if mark else "") + (f" ({said})" if said else "")


def _parse(path: Path, text: str) -> Tuple[Any, Optional[yaml.Node]]:
    """The file's data, every scalar as text (:class:`_Words`), and its node tree (for lines)."""
    loader = _Words(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    except yaml.YAMLError as exc:
        raise LadderError(_yaml_problem(path, exc)) from None
    finally:
        loader.dispose()


def load(path: Path) -> List[Rung]:
    """The rungs of ladder file ``path``, validated; LadderError (one line, exit 2) when it cannot be used."""
    try:
        text = Path(path).read_text()  # not the run directory: the person's ladder file
    except OSError as exc:
        raise LadderError(f"ladder {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise LadderError(f"ladder {path}: not valid YAML (not UTF-8 text)") from None
    data, root = _parse(path, text)
    if not isinstance(data, dict):
        raise LadderError(f"ladder {path}: expected a mapping with 'rungs', got {type(data).__name__}")
    try:
        return list(LadderFile(**data).rungs)
    except ValidationError as exc:
        raise LadderError(_one_line(path, exc, data, root)) from None
    except TypeError:  # keys that are not words (``[a]: x``)
        raise LadderError(f"ladder {path}: its keys must be words ('rungs')") from None


class CommandLadder(RungLadder):
    """Moves a command between its rungs after stalls and at checkpoints (see the module docstring)."""

    def __init__(
        self,
        launch: Launch,
        rungs: Sequence[Rung],
        settings: Optional[SupervisorSettings] = None,
        causes: Optional[FrozenSet[str]] = None,
        unapplied: Callable[[Outcome], Optional[str]] = lambda outcome: None,
    ) -> None:
        """``causes``: the stall causes that may move the run between rungs (None: every cause the table sends to
        the ladder); a stall of another cause runs the same rung again. ``unapplied``: why the rungs' change would
        change nothing for the attempt that ended (the program ignores it), None when it would: the rung is kept."""
        if not rungs:
            raise ValueError("a ladder needs at least one rung")
        super().__init__(launch)
        self.rungs = list(rungs)
        self.positions = {rung.name: at for at, rung in enumerate(self.rungs)}
        self.causes = causes
        self.unapplied = unapplied
        self.index = 0
        policy_rungs = [ladder_policy.Rung(rung.name, rung.expected_speed) for rung in self.rungs]
        self.ledger = RungLedger.from_settings(policy_rungs, settings or SupervisorSettings())

    def current(self) -> Launch:
        rung = self.rungs[self.index]
        resume = tuple(rung.resume) if rung.resume is not None else self.launch.resume
        argv, env = [*self.launch.argv, *rung.args], {**self.launch.env, **rung.env}
        return replace(self.launch, argv=argv, env=env, profile=rung.name, resume=resume)

    def first(self) -> Launch:
        return self.current()

    def describe(self) -> str:
        return self.rungs[self.index].name

    def go_to(self, rung: str) -> None:
        index = self.positions[rung]
        if index != self.index:
            self.index, self.streak = index, CauseStreak()

    def launches(self) -> List[Launch]:
        """Every rung's launch (for checks before the start)."""
        return [replace(self.launch, resume=tuple(r.resume)) if r.resume is not None else self.launch for r in self.rungs]

    def move(self, retry: Retry, cause: str, outcome: Outcome) -> Next:
        before = self.describe()
        if self.causes is not None and cause not in self.causes and retry in (Retry.LADDER, Retry.NATIVE):
            return Next(self.current(), Retry.SAME, moved_reason(cause, Retry.SAME, before, before))
        ignored = self.unapplied(outcome) if retry is Retry.LADDER and self.index + 1 < len(self.rungs) else None
        if ignored is not None:
            below = ", ".join(rung.name for rung in self.rungs[self.index + 1 :])
            return Next(self.current(), Retry.SAME, f"{cause}: {below} skipped, {ignored}; {before} once more")
        decision = self.ladder_rung(outcome) if retry is Retry.LADDER else None
        if decision is not None:
            self.go_to(decision.rung)
            return Next(self.current(), retry, self.ladder_reason(cause, decision, before))
        if retry in (Retry.LADDER, Retry.NATIVE) and self.index + 1 < len(self.rungs):
            self.go_to(self.rungs[self.index + 1].name)
        return Next(self.current(), retry, moved_reason(cause, retry, before, self.describe()))
