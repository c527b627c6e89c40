"""Judging a silence: keep watching, extend the budget for a compile, or call it a stall.

The clock alone forces a bad trade: a budget long enough for a cold MIOpen
compile (20 minutes) hides a deadlock for as long. So the supervisor also looks
at *what the silent tree does* (:mod:`trainbox.diagnose.evidence`, sampled from outside)
and :func:`judge` decides from that and the budget, in this order:

1. **Idle is enough.** A tree that has stayed idle (well under a core's worth of
   CPU, no I/O, no kernel-cache growth, no compiler) for ``--idle-timeout``
   seconds while silent is stalled, whatever the phase budget says: nothing a
   working phase does looks like that for two minutes (a compile burns a core,
   a slow disk shows I/O), so a startup or validation deadlock costs minutes,
   not the 20 of a 1200 s budget. 0 turns the rule off.
2. Within the budget in force: keep watching.
3. **A compile is not a stall.** Past the budget, while a kernel compile shows
   progress (a compiler process using CPU, a kernel cache growing), the budget
   is extended by one more phase budget, up to ``--compile-cap`` seconds of
   silence; a compile still going at the cap is a ``compile_cap`` stall.
4. **A busy tree is not judged by a suspicion.** Past a learned or output-declared budget (one with an allowance,
   :attr:`~trainbox.supervise.stalls.budgets.Budget.busy_s`), the tree is looked at once
   (:func:`trainbox.supervise.stalls.busy.look`): a busy one (CPU, I/O, a file growing, the GPU, and no frozen wait
   in its stack) is allowed to go on until the allowance, the plain stall budget or its phase's earlier long
   silences' bound (an ``allow``); still silent there, it is a ``stall_budget`` or ``earlier_silences`` stall. An
   idle, stopped, deadlocked or waiting tree is a ``budget`` stall at once.
5. Otherwise the budget ran out: a ``budget`` stall.

:func:`judge` is pure (``tests/supervise/stalls/test_silence.py`` scripts silences in
milliseconds); :class:`SilenceWatch` is its thin, stateful driver in the
supervisor loop: it samples while the child is silent, keeps the budget granted
so far, and forgets both at every beat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, Mapping, Optional, Tuple

from trainbox.diagnose import causes, evidence
from trainbox.diagnose.window import Window
from trainbox.supervise.stalls import busy
from trainbox.supervise.stalls.budgets import Budget, rounded_up
from trainbox.system import proctree


class Action(str, Enum):
    WATCH = "watch"
    EXTEND = "extend"
    #: A busy tree past a suspicion: watched on until its allowance.
    ALLOW = "allow"
    STALL = "stall"


class Rule(str, Enum):
    """Which rule called a stall (the ``stall`` event's ``rule``)."""

    BUDGET = "budget"
    IDLE = "idle"
    COMPILE_CAP = "compile_cap"
    #: A busy tree still silent at the plain stall budget, past its learned or declared one.
    STALL_BUDGET = "stall_budget"
    #: A busy tree still silent at a multiple of its phase's earlier long silences.
    EARLIER = "earlier_silences"


@dataclass(frozen=True)
class Limits:
    """The attempt's ``--idle-timeout`` and ``--compile-cap`` (0: the rule is off)."""

    idle_timeout_s: float
    compile_cap_s: float


@dataclass(frozen=True)
class Look:
    """What is known about the silence at one look."""

    silent_s: float
    budget: Budget
    #: How long the whole tree has been idle (``Window.idle_for_s``).
    idle_for_s: float = 0.0
    #: Evidence lines of a compile that made progress lately (``Window.compile_progress``); () when none.
    compiling: Tuple[str, ...] = ()
    #: What the tree did when its budget, a suspicion, ran out; None while not looked at.
    activity: Optional[busy.Activity] = None


@dataclass(frozen=True)
class Call:
    action: Action
    #: The budget in force after this call: the phase budget, or what an extension granted.
    budget_s: float
    rule: Optional[Rule] = None
    evidence: Tuple[str, ...] = ()


def judge(look: Look, granted_s: float, limits: Limits) -> Call:
    """What to do about ``look``, with ``granted_s`` the budget in force so far in this silence."""
    if limits.idle_timeout_s > 0 and look.idle_for_s >= limits.idle_timeout_s:
        line = f"whole tree idle for {look.idle_for_s:.0f} s (--idle-timeout {limits.idle_timeout_s:g})"
        return Call(Action.STALL, granted_s, Rule.IDLE, (line,))
    if look.silent_s <= granted_s:
        return Call(Action.WATCH, granted_s)
    if look.compiling:
        if look.silent_s < limits.compile_cap_s:
            extended = min(limits.compile_cap_s, look.silent_s + look.budget.seconds)
            return Call(Action.EXTEND, extended, evidence=look.compiling)
        line = f"still compiling after {look.silent_s:.0f} s of silence (--compile-cap {limits.compile_cap_s:g})"
        return Call(Action.STALL, granted_s, Rule.COMPILE_CAP, (line, *look.compiling))
    allowed, activity = look.budget.busy_s, look.activity
    if allowed is not None and activity is not None and activity.busy:
        if look.silent_s <= allowed:
            return Call(Action.ALLOW, allowed, evidence=activity.signs)
        return Call(Action.STALL, allowed, Rule.EARLIER if look.budget.by_earlier else Rule.STALL_BUDGET, activity.signs)
    return Call(Action.STALL, granted_s, Rule.BUDGET, activity.hang.evidence if activity and activity.hang else ())


def sampling_due(silent_s: float, budget_s: float) -> bool:
    """Whether the child is silent long enough to be sampled.

    Past one sampling interval (a child beating every batch is never sampled),
    or past half its budget when the budget is shorter than that, so a compile
    is seen before a short budget runs out.
    """
    return silent_s >= min(evidence.SAMPLE_EVERY_S, budget_s / 2)


def sampling_interval(budget_s: float) -> float:
    """Seconds between samples: ``SAMPLE_EVERY_S``, or a quarter of a budget shorter than four of them (a compile
    shows as progress only between two samples, and both must come before the budget runs out)."""
    return min(evidence.SAMPLE_EVERY_S, budget_s / 4)


class SilenceWatch:
    """One attempt's silence: samples its tree while silent, judges, and diagnoses a stall."""

    def __init__(self, tree: proctree.ProcessTree, env: Mapping[str, str], limits: Limits) -> None:
        self.tree = tree
        self.limits = limits
        self.sampler = evidence.Sampler(tree, env)
        self.window = Window()
        self._granted: Optional[float] = None
        self._next_sample = 0.0
        #: The last compile progress seen, and when (a compile goes on between two compiler processes).
        self._compiling: Tuple[Tuple[str, ...], float] = ((), 0.0)
        #: Set once this silence has been reported (observe mode): one incident per silence.
        self.reported = False
        #: This silence's diagnosis (``diagnose``), for the stall event.
        self.fields: Optional[Dict[str, Any]] = None
        #: Whose silence was judged last (a rank; None: the one process) and how long it was then.
        self._judged: Optional[Tuple[Optional[int], float]] = None
        #: What the tree did when its suspicion ran out (:mod:`trainbox.supervise.stalls.busy`), and the budget then.
        self.activity: Optional[Tuple[busy.Activity, Budget]] = None

    def beat(self) -> None:
        """Progress: this silence is over."""
        self.window.clear()
        self._granted = None
        self._next_sample = 0.0
        self._compiling = ((), 0.0)
        self.reported = False
        self.fields = None
        self.activity = None

    def judging(self, who: Optional[int], silent_s: float) -> None:
        """The silence judged next is ``who``'s (a rank; None: the one process), ``silent_s`` long. When that is not
        the silence judged last (another rank lags now, or the same one made progress), that silence is over
        (:meth:`beat`); a beat of any other rank changes nothing. Under torchrun the window was cleared whenever
        any rank progressed, so ``--idle-timeout`` and the compile extension acted only when every rank was silent
        (issue 33 item 13)."""
        if self._judged is not None and (who != self._judged[0] or silent_s < self._judged[1]):
            self.beat()
        self._judged = (who, silent_s)

    def budget_s(self, budget: Budget) -> float:
        """The budget in force in this silence: the phase's, or what a compile's extensions granted."""
        return budget.seconds if self._granted is None else self._granted

    def look(self, silent_s: float, budget: Budget) -> Call:
        now = time.monotonic()
        interval = sampling_interval(budget.seconds)
        if now >= self._next_sample and sampling_due(silent_s, budget.seconds):
            self.window.add(self.sampler.sample())
            self._next_sample = now + interval
            progress = self.window.compile_progress()
            if progress:
                self._compiling = (progress, now)
        # Progress within the last two samples still counts: a sample may fall between one compiler process and the
        # next (or catch one a moment old, with hardly any CPU yet), which is no sign the compile has ended. (+ 0.5 s:
        # the supervisor looks at most every half second, trainbox.supervise.monitor.POLL_S.)
        lines, seen = self._compiling
        compiling = lines if now - seen <= 2 * interval + 0.5 else ()
        if silent_s > self.budget_s(budget) and budget.busy_s is not None and self.activity is None and not compiling:
            self.activity = (busy.look(self.window), budget)  # once per silence: two stack dumps at most
        activity = self.activity[0] if self.activity is not None else None
        look = Look(silent_s, budget, self.window.idle_for_s(), compiling, activity)
        call = judge(look, self.budget_s(budget), self.limits)
        if call.action in (Action.EXTEND, Action.ALLOW):
            self._granted = call.budget_s
        return call

    def busy_fields(self) -> Optional[Dict[str, Any]]:
        """What the tree did when its suspicion ran out, for ``state.json`` and the ``stall`` event's ``busy``: the
        signs, the guess, the suspicion (``budget``), when a busy tree is judged (``judged_at_s``) and by which bound
        (``bound``), and the wait the stack showed (``hang``); None when the tree was not looked at."""
        if self.activity is None:
            return None
        activity, budget = self.activity
        bound = Rule.EARLIER if budget.by_earlier else Rule.STALL_BUDGET
        return {**activity.to_dict(), "budget": budget.name, "judged_at_s": budget.busy_s, "bound": bound.value}

    def allowed(self) -> Optional[Dict[str, Any]]:
        """:meth:`busy_fields` while a busy tree is allowed past its suspicion (``state.json``'s ``busy``), else None."""
        fields = self.busy_fields()
        return fields if fields is not None and fields["busy"] else None

    def diagnose(self, call: Call, stacks: Mapping[int, str], kernel_text: str = "") -> Dict[str, Any]:
        """Classify the stall ``call`` called (from the incident's stacks); the fields for events and summary."""
        found = causes.classify(self.window, stacks, self.tree.root_pid, kernel_text)
        if call.rule is Rule.COMPILE_CAP:  # the judge saw the compile itself: that is the cause, whatever else shows
            found = causes.Diagnosis(causes.Cause.KERNEL_COMPILE, call.evidence + found.evidence)
        self.fields = {"rule": call.rule.value if call.rule else None, **found.to_dict()}
        return self.fields

    def diagnosis_fields(self, call: Call) -> Dict[str, Any]:
        """This silence's diagnosis; from the samples alone when the incident (and its stacks) could not be written."""
        return self.fields if self.fields is not None else self.diagnose(call, {})


def extension(budget: Budget, call: Call, silent_s: float) -> Dict[str, Any]:
    """The ``extend`` event's fields for an EXTEND ``call``."""
    return {
        "cause": causes.Cause.KERNEL_COMPILE.value,
        "budget": budget.name,
        "budget_s": round(call.budget_s, 3),
        "silent_s": rounded_up(silent_s, 3),  # extended because it passed the budget granted so far: recorded so
        "evidence": list(call.evidence),
    }


def allow_line(attempt: int, budget: Budget, call: Call, silent_s: float, guess: str) -> str:
    """The console line that says a busy silence goes on past its suspicion."""
    bound = "its earlier silences there" if budget.by_earlier else "the stall budget"
    return (
        f"attempt {attempt}: silent {silent_s:.0f} s, past its {budget.name} budget {budget.seconds:.0f} s but busy "
        f"({guess}: {call.evidence[0]}): judged at {call.budget_s:.0f} s ({bound})"
    )


def stall_line(attempt: int, silent_s: float, budget: Budget, call: Call, limits: Limits, phase: Optional[str]) -> str:
    """The console line that announces a stall (before the cause is known)."""
    why = {
        Rule.IDLE: f"with the whole tree idle for --idle-timeout {limits.idle_timeout_s:g} s (within its {budget.name} budget)",
        Rule.COMPILE_CAP: f"and still compiling at --compile-cap {limits.compile_cap_s:g} s",
        Rule.BUDGET: f"> {budget.name} budget {call.budget_s:.1f} s",
        Rule.STALL_BUDGET: f"busy past its {budget.name} budget {budget.seconds:.1f} s, > stall budget {call.budget_s:.1f} s",
        Rule.EARLIER: f"busy past its {budget.name} budget {budget.seconds:.1f} s, > {call.budget_s:.1f} s, "
        "its earlier silences there times the learned factor",
    }[call.rule or Rule.BUDGET]
    return f"attempt {attempt} stalled: silent {silent_s:.1f} s {why}" + (f" in phase {phase!r}" if phase else "")
