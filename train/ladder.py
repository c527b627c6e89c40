"""The profile ladder behind ``python -m train run``: each stall steps down to a safer profile.

Attempt 0 uses the chosen profile with the user's KEY=VALUE overrides. After a
stall the next attempt uses the profile's ``fallback`` (fast -> balanced ->
safe); after a crash it keeps the current one. The fallback's loader and
safety settings win over the overrides (that is the point of falling back);
every other override (data, epochs, imgsz, ...) is kept.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Sequence

from train.profiles import Profile
from train.supervisor import Launch, Planner

#: Overrides a fallback profile replaces with its own setting.
LOADER_KEYS = frozenset({"workers", "amp", "val"})


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
        self.rung = 0

    @property
    def profile(self) -> Profile:
        return self.chain[self.rung]

    def _overrides(self) -> List[str]:
        if self.rung == 0:
            return self.overrides
        return [pair for pair in self.overrides if pair.split("=", 1)[0] not in LOADER_KEYS]

    def _launch(self) -> Launch:
        profile = self.profile
        return Launch(
            argv=[sys.executable, "-m", "train.yolo", "--profile", profile.name, *self._overrides()],
            startup_timeout=self.startup_timeout or profile.startup_timeout,
            stall_timeout=self.stall_timeout or profile.stall_timeout,
            profile=profile.name,
            env={"TRAIN_PROFILES_DIR": str(self.profiles_dir)},
        )

    def first(self) -> Launch:
        return self._launch()

    def after(self, stalled: bool) -> Launch:
        if stalled and self.rung < len(self.chain) - 1:
            self.rung += 1
        return self._launch()
