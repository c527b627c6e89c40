"""The folders a run said it writes to: what a program printed about itself, read back from its attempt logs.

Why it exists. A program that names its own output folder at start (``yolo train`` prints ``save_dir=...`` with its
arguments, then ``Logging results to ...``) says which of several look-alike folders is its own: ``train`` and
``train-2`` of two runs of one name, or ``exp`` and ``exp_lr2`` of a sweep, cannot be told apart by any name rule, and
a run gone on with ``--resume`` days later cannot tell them apart by time either. So the recipe's pattern
(:attr:`trainbox.supervise.resume.recipes.Program.says`) is looked for in the run's own attempt logs.

What is read: the first :data:`HEAD_BYTES` of each ``logs/attempt-<n>.log`` (a program names its folder as it
starts, and the log of an attempt number begins with the first attempt of that number the run ever had, its very
first attempt in ``attempt-0.log``), at most :data:`MAX_LOGS` logs. A log's head never changes once it is that long
or has named a folder, so it is read once: a look every few seconds costs a ``list_dir`` and nothing else. The logs
are input from the run directory, read through :mod:`trainbox.rundir.safe`; a folder the output names is only ever
compared with the globs' matches, never opened because it was named.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Pattern, Set

from trainbox.rundir.layout import RunDir

#: A program names its folder within its first output: arguments, a banner, a line about where results go.
HEAD_BYTES = 64 * 1024
#: Attempt logs read at most (a run's restart budget is a handful; a run directory with thousands is not ours to scan).
MAX_LOGS = 100
#: A terminal's colour codes inside a line (Ultralytics prints the folder in bold).
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class PrintedFolders:
    """The folders the run's attempts named, by a pattern whose group 1 is the folder (see the module docstring)."""

    def __init__(self, run_root: Path) -> None:
        self.run = RunDir(Path(run_root))
        #: Per log and pattern: the folders its head named, once that head is final.
        self._final: Dict[tuple, Set[str]] = {}

    def found(self, says: Pattern[str]) -> List[Path]:
        """Every folder an attempt log's head names (group 1 of ``says``), sorted; [] when none does."""
        folder = self.run.attempt_log.directory
        names = self.run.files.list_dir(folder, MAX_LOGS).value or []
        named: Set[str] = set()
        for name in names:
            if self.run.attempt_log.number_of(name) is None:
                continue
            key = (name, says.pattern)
            if key not in self._final:
                head = self.run.files.read_bytes(folder / name, HEAD_BYTES).value or b""
                text = _COLOUR.sub("", head.decode("utf-8", "replace"))
                folders = {match.strip() for match in says.findall(text) if match.strip()}
                if folders or len(head) >= HEAD_BYTES:
                    self._final[key] = folders
                named |= folders
                continue
            named |= self._final[key]
        return sorted(Path(folder) for folder in named)
