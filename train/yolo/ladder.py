"""The profile ladder behind ``python -m trainbox run``: a stall moves to the rung its cause calls for.

Attempt 0 uses the chosen profile with the user's KEY=VALUE overrides. After a
stall the retry is chosen by the stall's cause (:meth:`trainbox.supervise.planner.Planner.after`,
overridable per profile with ``stall_retry``):

* ``ladder`` (a deadlocked loader, an idle tree, unknown): the ladder policy
  (:mod:`trainbox.supervise.ladder.run`, ``--ladder-policy``) chooses among the
  ``fallback`` chain (fast -> balanced -> safe): with ``cost`` the rung expected
  to finish first, the current one or a safer one, and at each checkpoint it may
  probe a faster one again; with ``down`` the profile's ``fallback``. When it
  stays on the last rung and the stall came before the first training step, the
  ``startup_fallback`` (safe -> safe-native: no vendor convolution kernels to
  compile), which is not on the policy's ladder;
* ``native`` (a compile past the cap, a GPU that keeps hanging): the first rung
  below with PyTorch's own convolutions (safe-native);
* ``same``, ``gpu_release``: the same profile again (the supervisor waits for
  the GPU memory first).

After a crash it keeps the current one. The fallback's loader and safety
settings win over the overrides (that is the point of falling back); every
other override (data, epochs, imgsz, ...) is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from trainbox import module_command
from trainbox.rundir.events import Retry
from trainbox.supervise.ladder import policy as ladder_policy
from trainbox.supervise.ladder.run import RungLadder, RungLedger
from trainbox.supervise.planner import Launch, Next, moved_reason
from trainbox.supervise.policy import CauseStreak, Outcome
from trainbox.supervise.settings import LAUNCH_SETTINGS, STALL_TIMEOUT, STARTUP_TIMEOUT, SupervisorSettings
from trainbox.yolo import warmup
from trainbox.yolo.args import PROFILE_KEYS
from trainbox.yolo.profiles import Profile

#: What the ``native`` rung changes, for the ``restart`` event's reason.
NATIVE = "PyTorch's own convolutions in FP32, nothing to compile"


class ProfileLadder(RungLadder):
    """Moves along a chain of profiles (see the module docstring); only :meth:`move` differs from the planner's.

    ``launch``: the launch settings the user gave (``LAUNCH_SETTINGS``' fields, e.g. ``stall_timeout``); a
    setting that is absent or None is the current profile's own. ``settings``: ``--ladder-policy``, ``--deadline``.
    """

    def __init__(
        self,
        chain: Sequence[Profile],
        overrides: Sequence[str],
        profiles_dir: Path,
        launch: Optional[Mapping[str, Optional[float]]] = None,
        settings: Optional[SupervisorSettings] = None,
    ) -> None:
        if not chain:
            raise ValueError("a profile ladder needs at least one profile")
        self.chain = list(chain)
        self.overrides = list(overrides)
        self.profiles_dir = profiles_dir
        self.given = {key: value for key, value in (launch or {}).items() if value is not None}
        self.by_name = {p.name: p for p in self.chain}
        self.profile = self.chain[0]
        self.streak = CauseStreak()
        self.ledger = RungLedger.from_settings(policy_rungs(self.chain), settings or SupervisorSettings())

    def _overrides(self) -> Sequence[str]:
        if self.profile is self.chain[0]:
            return self.overrides
        return [pair for pair in self.overrides if pair.split("=", 1)[0] not in PROFILE_KEYS]

    def current(self) -> Launch:
        profile = self.profile
        budgets = {setting.field: self.given.get(setting.field, getattr(profile, setting.field)) for setting in LAUNCH_SETTINGS}
        if STARTUP_TIMEOUT.field not in self.given:
            budgets[STARTUP_TIMEOUT.field] = self._startup_timeout(profile)
        return Launch(
            argv=module_command("trainbox.yolo", "--profile", profile.name, *self._overrides()),
            profile=profile.name,
            env={"TRAIN_PROFILES_DIR": str(self.profiles_dir)},
            **budgets,
            stall_given=STALL_TIMEOUT.field in self.given,
        )

    def _startup_timeout(self, profile: Profile) -> float:
        """The profile's startup budget, capped once ``warmup`` has compiled this run's kernels."""
        key = warmup.key_for_pairs(self._overrides(), profile.conv_backend)
        return warmup.startup_budget(profile.startup_timeout, warmup.kernel_cache_state(key))

    def first(self) -> Launch:
        return self.current()

    def describe(self) -> str:
        return self.profile.name

    def retry_overrides(self) -> Optional[Mapping[str, Sequence[Retry]]]:
        return self.profile.stall_retry

    def go_to(self, rung: str) -> None:
        if rung != self.profile.name:
            self.profile, self.streak = self.by_name[rung], CauseStreak()

    def move(self, retry: Retry, cause: str, outcome: Outcome) -> Next:
        before = self.profile
        decision = self.ladder_rung(outcome) if retry is Retry.LADDER else None
        startup = self.profile.startup_fallback if outcome.first_step_ts is None and not self.profile.fallback else None
        if decision is not None and not (decision.rung == before.name and startup):
            self.go_to(decision.rung)
            return Next(self.current(), retry, self.ladder_reason(cause, decision, before.name))
        rung = self._rung(retry, before_first_step=outcome.first_step_ts is None)
        if rung is not None:
            self.go_to(rung)
        return Next(self.current(), retry, moved_reason(cause, retry, before.name, self.profile.name, NATIVE))

    def _rung(self, retry: Retry, before_first_step: bool) -> Optional[str]:
        """The profile ``retry`` moves to by the profiles' own keys, or None to stay on the current one."""
        if retry is Retry.LADDER:
            return self.profile.fallback or (self.profile.startup_fallback if before_first_step else None)
        if retry is Retry.NATIVE and self.profile.conv_backend != "native":
            below = self.chain[self.chain.index(self.profile) + 1 :]
            return next((p.name for p in below if p.conv_backend == "native"), None)
        return None


def policy_rungs(chain: Sequence[Profile]) -> List[ladder_policy.Rung]:
    """The ladder the policy weighs: the first profile and each ``fallback`` after it, with their expected speeds
    (a ``startup_fallback`` is for stalls before the first step only, which no speed or stall rate can weigh)."""
    rungs = [chain[0]]
    for profile in chain[1:]:
        if rungs[-1].fallback != profile.name:
            break
        rungs.append(profile)
    return [ladder_policy.Rung(p.name, p.expected_speed) for p in rungs]
