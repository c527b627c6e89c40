"""Which checkpoint a restart resumes from: the newest complete one the run wrote.

Why it exists. A partial checkpoint is the field's most reported resume failure (a save killed half-way, a power
loss before DeepSpeed's ``latest``): resuming from it crashes, or worse, loads garbage. So a checkpoint counts only
when it is complete, by the tool's own marker where it has one, and by what can be checked from outside otherwise:

* a folder ``step-N`` (torchtitan, Distributed Checkpoint) once its ``.metadata`` is written;
* a folder ``checkpoint-N`` (Hugging Face ``Trainer``) once its ``trainer_state.json`` is written and parses;
* any other folder when it holds a file and nothing in it is still growing;
* a file that is not empty and not growing; a ``torch.save`` file (``.pt``, ``.pth``, ``.ckpt``, ``.tar``, or any
  file that starts as a zip does) must also be a whole zip archive: its central directory, written last, is there
  and every member lies inside the file. The file is never unpickled (the host never imports torch).

"Still growing" is measured, not guessed: a candidate's size and time (:func:`signature`) are taken when it is
found (:func:`find`) and again when it is chosen (:func:`choose`); whatever changed in between is being written and
is passed over. The caller puts the time between the two looks.

Newest is by the checkpoint's own time (a folder's: its newest file's), and :func:`choose` falls back to the
next one when the newest is broken. ``since`` leaves out checkpoints older than the run: another run's files in the
same folder are not this run's work (the user's own ``--checkpoint`` is taken at any age).

Everything here only reads: a checkpoint the child wrote is never moved, changed or deleted. Whatever a folder
holds is untrusted (a link, a FIFO, a name that is no number): it is passed over with a reason, never an error.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

#: Files in a checkpoint folder looked at for its time and growth; a sharded checkpoint of thousands is judged by
#: its marker, and a folder this full without one is judged by its first ones.
MAX_FOLDER_FILES = 4096
#: Matches of one glob taken at most: a pattern that matches a whole dataset is a mistake, not a checkpoint list.
MAX_MATCHES = 10000
#: torch.save's suffixes: such a file must be a zip archive (torch's format since 1.6) or an older pickle.
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")
#: A zip file starts with a local header; torch's legacy format starts with pickle's protocol byte.
ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"
#: The step a name tells: ``checkpoint-500``, ``step-12``, ``step=340``, ``iter_900``.
_STEP = re.compile(r"(?:checkpoint|step|iter)[-_=]?(\d+)", re.IGNORECASE)
#: The completeness markers of the tools that write one: folder name pattern -> the file it must hold.
MARKERS = ((re.compile(r"^step-\d+$"), ".metadata"), (re.compile(r"^checkpoint-\d+$"), "trainer_state.json"))

#: A candidate's size and modification time, as taken by :func:`signature`.
Signature = Tuple[int, float]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found: where, when (its own time, unix seconds), and the step it holds when that is known."""

    path: Path
    mtime: float
    step: Optional[int] = None
    #: Its size when found (a folder's: its files' sum): :func:`choose` passes over one that changed since.
    size: int = 0

    def as_dict(self, now: Optional[float] = None) -> Dict[str, object]:
        """For events and state.json: path, time, step (and age, given ``now``)."""
        found: Dict[str, object] = {"path": str(self.path), "mtime": round(self.mtime, 3), "step": self.step}
        if now is not None:
            found["age_s"] = round(max(0.0, now - self.mtime), 1)
        return found


def _lstat(path: Path) -> Optional[os.stat_result]:
    try:
        return path.lstat()
    except (OSError, ValueError):  # gone, unreadable, or a name the OS refuses
        return None


def _files(folder: Path) -> List[Tuple[Path, os.stat_result]]:
    """The plain files in ``folder`` and below (links not followed), MAX_FOLDER_FILES at most."""
    found: List[Tuple[Path, os.stat_result]] = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            info = _lstat(path)
            if info is not None and stat.S_ISREG(info.st_mode):
                found.append((path, info))
            if len(found) >= MAX_FOLDER_FILES:
                return found
    return found


def signature(path: Path) -> Optional[Signature]:
    """Size and time of a file, or of a folder's files (their sum and the newest); None when it is neither."""
    info = _lstat(path)
    if info is None:
        return None
    if stat.S_ISREG(info.st_mode):
        return info.st_size, info.st_mtime
    if not stat.S_ISDIR(info.st_mode):
        return None
    files = _files(path)
    return sum(i.st_size for _, i in files), max((i.st_mtime for _, i in files), default=info.st_mtime)


def step_of(path: Path) -> Optional[int]:
    """The step a checkpoint holds: a Trainer's ``global_step``, else the number its name tells; None unknown."""
    state = _read_json(path / "trainer_state.json") if path.name.startswith("checkpoint-") else None
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    found = _STEP.findall(path.name)
    return int(found[-1]) if found and len(found[-1]) < 19 else None  # more digits than an int64 are no step


def _read_json(path: Path) -> object:
    info = _lstat(path)
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_size > 64 * 1024 * 1024:
        return None
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def _zip_problem(path: Path, size: int) -> Optional[str]:
    """Why a zip archive is not whole (None when it is): its central directory, and every member inside the file."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError):
        return "not a whole zip archive (cut off while it was written?)"
    if not members:
        return "an empty zip archive"
    if any(member.header_offset + member.compress_size > size for member in members):
        return "a zip archive whose members run past its end"
    return None


def file_problem(path: Path, info: os.stat_result) -> Optional[str]:
    """Why the file at ``path`` is no complete checkpoint, None when it is one."""
    if info.st_size == 0:
        return "empty"
    try:
        with open(path, "rb") as handle:  # a checkpoint the child wrote: read, never changed
            head = handle.read(4)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if head == ZIP_MAGIC:
        return _zip_problem(path, info.st_size)
    if path.suffix.lower() in TORCH_SUFFIXES and not head.startswith(PICKLE_MAGIC):
        return "not a torch.save file (neither a zip archive nor a pickle)"
    return None


def folder_problem(path: Path) -> Optional[str]:
    """Why the folder at ``path`` is no complete checkpoint, None when it is one (see the module docstring)."""
    for pattern, marker in MARKERS:
        if pattern.match(path.name):
            info = _lstat(path / marker)
            if info is None or not stat.S_ISREG(info.st_mode) or info.st_size == 0:
                return f"no {marker} (the save did not finish)"
            if marker.endswith(".json") and _read_json(path / marker) is None:
                return f"{marker} is cut off"
            return None
    return None if _files(path) else "an empty folder"


def problem(path: Path) -> Optional[str]:
    """Why ``path`` is no complete checkpoint (one phrase), None when it is one."""
    info = _lstat(path)
    if info is None:
        return "gone"
    if stat.S_ISDIR(info.st_mode):
        return folder_problem(path)
    if not stat.S_ISREG(info.st_mode):
        return "not a plain file or folder"
    return file_problem(path, info)


def find(patterns: Sequence[str], roots: Sequence[Path], since: Optional[float] = None) -> List[Checkpoint]:
    """Every file or folder the globs match under ``roots`` (an absolute glob once), newest first; those older than
    ``since`` (unix time) left out. Nothing is checked for completeness here (:func:`choose` does)."""
    seen: Dict[Path, Checkpoint] = {}
    for pattern in patterns:
        bases = [Path("/")] if os.path.isabs(pattern) else list(roots)
        for base in bases:
            for count, match in enumerate(glob.iglob(str(base / pattern), recursive=True)):
                if count >= MAX_MATCHES:
                    break
                path = Path(match)
                found = signature(path)
                if found is None or path in seen or (since is not None and found[1] < since):
                    continue
                seen[path] = Checkpoint(path, found[1], step_of(path), found[0])
    return sorted(seen.values(), key=lambda c: (c.mtime, c.step or 0), reverse=True)


def choose(candidates: Sequence[Checkpoint]) -> Tuple[Optional[Checkpoint], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ``candidates`` (newest first, as :func:`find` gives them) that has not
    changed since it was found, and every newer one passed over with why."""
    passed: List[Tuple[str, str]] = []
    for candidate in candidates:
        now = signature(candidate.path)
        if now is None:
            why: Optional[str] = "gone"
        elif now != (candidate.size, candidate.mtime):
            why = "still being written"
        else:
            why = problem(candidate.path)
        if why is None:
            return candidate, passed
        passed.append((str(candidate.path), why))
    return None, passed
