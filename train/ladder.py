"""The profile ladder behind ``python -m trainbox run``: each stall steps down to a safer profile.

Attempt 0 uses the chosen profile with the user's KEY=VALUE overrides. After a
stall the next attempt uses the profile's ``fallback`` (fast -> balanced ->
safe); when there is none and the stall came before the first training step,
its ``startup_fallback`` (safe -> safe-native: no vendor convolution kernels to
compile). After a crash it keeps the current one. The fallback's loader and
safety settings win over the overrides (that is the point of falling back);
every other override (data, epochs, imgsz, ...) is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from trainbox import module_command, warmup
from trainbox.profiles import Profile
from trainbox.restart import Outcome, OutcomeKind
from trainbox.supervisor import Launch, Planner
from trainbox.yolo.args import PROFILE_KEYS


class ProfileLadder(Planner):
    def __init__(
        self,
        chain: Sequence[Profile],
        overrides: Sequence[str],
        profiles_dir: Path,
        startup_timeout: Optional[float] = None,
        stall_timeout: Optional[float] = None,
    ) -> None:
        if not chain:
            raise ValueError("a profile ladder needs at least one profile")
        self.chain = list(chain)
        self.overrides = list(overrides)
        self.profiles_dir = profiles_dir
        self.startup_timeout = startup_timeout
        self.stall_timeout = stall_timeout
        self.by_name = {p.name: p for p in self.chain}
        self.profile = self.chain[0]

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
        )

    def _startup_timeout(self, profile: Profile) -> float:
        """``--startup-timeout``, else the profile's, capped once ``warmup`` has compiled this run's kernels."""
        if self.startup_timeout:
            return self.startup_timeout
        key = warmup.key_for_pairs(self._overrides(), profile.conv_backend)
        return warmup.startup_budget(profile.startup_timeout, warmup.kernel_cache_state(key))

    def first(self) -> Launch:
        return self._launch()

    def after(self, outcome: Outcome) -> Launch:
        if outcome.kind is OutcomeKind.STALLED:
            before_first_step = outcome.first_step_ts is None
            step_down = self.profile.fallback or (self.profile.startup_fallback if before_first_step else None)
            if step_down:
                self.profile = self.by_name[step_down]
        return self._launch()
