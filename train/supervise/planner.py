"""What each attempt runs: its launch, and the one after a failed attempt.

A :class:`Launch` is one attempt's command with its budgets, checked on creation against the settings table.
:meth:`Planner.after` maps a stall's cause to a :class:`~trainbox.rundir.events.Retry` in one place
(:func:`trainbox.supervise.policy.retry_for`, with the streak of stalls of that cause on this rung) and asks
:meth:`Planner.move` what the retry means for the next launch. The base class repeats the same command (what
``trainbox supervise`` does); :class:`trainbox.yolo.ladder.ProfileLadder` overrides only the move, stepping down
its profiles, and :class:`trainbox.supervise.ladder.command.CommandLadder` (``supervise --ladder FILE``) its
rungs; both ask :mod:`trainbox.supervise.ladder.run` (the ladder policy) which rung a ``ladder`` retry and each
checkpoint (:meth:`Planner.at_checkpoint`: a probe back up) lead to. A crash keeps the current launch: a crash
is the program's own verdict, not the settings'. So does a restart for slowness (``--on-slow restart``): what it
cures, a leak or a loader gone wrong, the restart itself cures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.rundir.events import Retry
from trainbox.supervise.policy import CauseStreak, Outcome, OutcomeKind, hint, retry_for
from trainbox.supervise.settings import COMPILE_CAP, IDLE_TIMEOUT, LAUNCH_SETTINGS, SLOW_RATIO


@dataclass(frozen=True)
class Launch:
    """One attempt's command, the profile it stands for, and its budgets."""

    argv: Sequence[str]
    startup_timeout: float
    stall_timeout: float
    profile: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    idle_timeout: float = IDLE_TIMEOUT.number
    compile_cap: float = COMPILE_CAP.number
    slow_ratio: float = SLOW_RATIO.number
    #: The user gave ``stall_timeout`` (not a default, not a profile's): it bounds every budget a bar declares.
    stall_given: bool = False
    #: What a restart adds so that it resumes (a ladder rung's ``resume``, with ``{checkpoint}``); None: the run's
    #: ``--resume-args``, else the built-in way for a program trainbox knows (:mod:`trainbox.supervise.resume`).
    resume: Optional[Tuple[str, ...]] = None
    #: What this launch resumes from, as the ``start`` and ``restart`` events say it (set once it is chosen).
    resumed: Optional[Mapping[str, Any]] = None

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("no command to supervise: give it after '--'")
        for setting in LAUNCH_SETTINGS:
            setting.check(getattr(self, setting.field))


@dataclass(frozen=True)
class Next:
    """The attempt after a failed one: its launch, the retry a stall's cause chose, and why (``restart``'s ``reason``)."""

    launch: Launch
    retry: Optional[Retry] = None
    reason: str = ""
    #: The ladder policy's decision with its figures (the ``restart``/``probe`` events' ``ladder``), when it decided.
    ladder: Optional[Dict[str, Any]] = None


class Planner:
    """Chooses each attempt's launch. This one repeats the same command; a ladder overrides :meth:`move`."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.streak = CauseStreak()

    def first(self) -> Launch:
        return self.launch

    def current(self) -> Launch:
        """The launch the planner stands on now (after a crash, the next attempt runs it again)."""
        return self.launch

    def launches(self) -> List[Launch]:
        """Every launch this planner may start with or move to, as far as it knows before the start (for checks)."""
        return [self.launch]

    def retry_overrides(self) -> Optional[Mapping[str, Sequence[Retry]]]:
        """The current rung's own cause -> retry rows (a profile's ``stall_retry``); None: the table's."""
        return None

    def after(self, outcome: Outcome) -> Next:
        """The attempt after one that ended as ``outcome`` (a stall or a crash)."""
        if outcome.kind is OutcomeKind.SLOW:
            suspect = outcome.detail.get("suspect") or "unknown"
            saved = (
                "the checkpoint it wrote on request" if outcome.detail.get("checkpoint_s") is not None else "its last checkpoint"
            )
            return Next(self.current(), reason=f"slow ({suspect}): {self.describe()} again, from {saved}")
        if outcome.kind is not OutcomeKind.STALLED:
            return Next(self.current(), reason=f"crash: {self.describe()} again")
        cause = outcome.detail.get("cause") or "unknown"
        retry = retry_for(cause, self.streak.count(cause), self.retry_overrides())
        return self.move(retry, cause, outcome)

    def at_checkpoint(self, outcome: Outcome) -> Optional[Next]:
        """A checkpoint was just written by the running attempt ``outcome``: the launch to move to at once (a probe
        of another rung; the supervisor ends the tree), or None to carry on. This one never moves."""
        return None

    def describe(self) -> str:
        """What the current launch is called in a reason: the profile, or "the same command"."""
        return "the same command"

    def move(self, retry: Retry, cause: str, outcome: Outcome) -> Next:
        """The launch ``retry`` calls for after a stall of ``cause``: here always the same command."""
        if retry is Retry.GPU_RELEASE:
            return Next(self.launch, Retry.GPU_RELEASE, f"{cause}: the same command, after the GPU memory is released")
        return Next(self.launch, Retry.SAME, f"{cause}: the same command again{hint(cause)}")


def moved_reason(cause: str, retry: Retry, before: str, now: str, native: str = "") -> str:
    """A ladder's ``restart`` reason: the cause and what the next attempt runs, having moved from rung ``before``
    to ``now`` (the same rung when there was nothing to move to); ``native`` says what a ``native`` rung changes."""
    if now == before:
        how = {
            Retry.SAME: f"{now} once more",
            Retry.GPU_RELEASE: f"{now} once more, after the GPU memory is released",
        }.get(retry, f"{now} again: no rung left below it")
    elif retry is Retry.NATIVE and native:
        how = f"{now}: {native}"
    else:
        how = f"down the ladder to {now}"
    return f"{cause}: {how}{hint(cause)}"
