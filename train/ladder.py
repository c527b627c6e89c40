"""The profile ladder behind ``python -m trainbox run``: a stall moves to the rung its cause calls for.

Attempt 0 uses the chosen profile with the user's KEY=VALUE overrides. After a
stall the retry is chosen by the stall's cause (:func:`trainbox.restart.retry_for`,
overridable per profile with ``stall_retry``):

* ``ladder`` (a deadlocked loader, an idle tree, unknown): the profile's
  ``fallback`` (fast -> balanced -> safe); when there is none and the stall came
  before the first training step, its ``startup_fallback`` (safe -> safe-native:
  no vendor convolution kernels to compile);
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
from typing import List, Optional, Sequence

from trainbox import module_command, warmup
from trainbox.profiles import Profile
from trainbox.restart import CauseStreak, Outcome, OutcomeKind, Retry, hint, retry_for
from trainbox.supervisor import Launch, Next, Planner
from trainbox.yolo.args import PROFILE_KEYS


class ProfileLadder(Planner):
    def __init__(
        self,
        chain: Sequence[Profile],
        overrides: Sequence[str],
        profiles_dir: Path,
        startup_timeout: Optional[float] = None,
        stall_timeout: Optional[float] = None,
        idle_timeout: Optional[float] = None,
        compile_cap: Optional[float] = None,
    ) -> None:
        if not chain:
            raise ValueError("a profile ladder needs at least one profile")
        self.chain = list(chain)
        self.overrides = list(overrides)
        self.profiles_dir = profiles_dir
        self.startup_timeout = startup_timeout
        self.stall_timeout = stall_timeout
        self.idle_timeout = idle_timeout
        self.compile_cap = compile_cap
        self.by_name = {p.name: p for p in self.chain}
        self.profile = self.chain[0]
        self.streak = CauseStreak()

    def _overrides(self) -> List[str]:
        if self.profile is self.chain[0]:
            return self.overrides
        return [pair for pair in self.overrides if pair.split("=", 1)[0] not in PROFILE_KEYS]

    def _launch(self) -> Launch:
        profile = self.profile
        return Launch(
            argv=module_command("trainbox.yolo", "--profile", profile.name, *self._overrides()),
            startup_timeout=self._startup_timeout(profile),
            stall_timeout=self.stall_timeout or profile.stall_timeout,
            profile=profile.name,
            env={"TRAIN_PROFILES_DIR": str(self.profiles_dir)},
            # 0 is a value here (idle detection off, no compile extension), so only None means "the profile's".
            idle_timeout=profile.idle_timeout if self.idle_timeout is None else self.idle_timeout,
            compile_cap=profile.compile_cap if self.compile_cap is None else self.compile_cap,
        )

    def _startup_timeout(self, profile: Profile) -> float:
        """``--startup-timeout``, else the profile's, capped once ``warmup`` has compiled this run's kernels."""
        if self.startup_timeout:
            return self.startup_timeout
        key = warmup.key_for_pairs(self._overrides(), profile.conv_backend)
        return warmup.startup_budget(profile.startup_timeout, warmup.kernel_cache_state(key))

    def first(self) -> Launch:
        return self._launch()

    def after(self, outcome: Outcome) -> Next:
        if outcome.kind is not OutcomeKind.STALLED:
            return Next(self._launch(), reason=f"crash: {self.profile.name} again")
        cause = outcome.detail.get("cause")
        retry = retry_for(cause, self.streak.count(cause), self.profile.stall_retry)
        before = self.profile
        rung = self._rung(retry, before_first_step=outcome.first_step_ts is None)
        if rung is not None:
            self.profile = self.by_name[rung]
            self.streak = CauseStreak()
        return Next(self._launch(), retry, self._reason(cause, retry, before))

    def _rung(self, retry: Retry, before_first_step: bool) -> Optional[str]:
        """The profile ``retry`` moves to, or None to stay on the current one."""
        if retry is Retry.LADDER:
            return self.profile.fallback or (self.profile.startup_fallback if before_first_step else None)
        if retry is Retry.NATIVE and self.profile.conv_backend != "native":
            below = self.chain[self.chain.index(self.profile) + 1 :]
            return next((p.name for p in below if p.conv_backend == "native"), None)
        return None

    def _reason(self, cause: Optional[str], retry: Retry, before: Profile) -> str:
        """The ``restart`` event's ``reason``: the cause, what the next attempt runs, and why."""
        now = self.profile.name
        if now == before.name:
            how = {
                Retry.SAME: f"{now} once more",
                Retry.GPU_RELEASE: f"{now} once more, after the GPU memory is released",
            }.get(retry, f"{now} again: no rung left below it")
        elif retry is Retry.NATIVE:
            how = f"{now}: PyTorch's own convolutions in FP32, nothing to compile"
        else:
            how = f"down the ladder to {now}"
        return f"{cause or 'unknown'}: {how}{hint(cause)}"
