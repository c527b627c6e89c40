"""Which checkpoint a restart resumes from: the newest complete one the run wrote.

Why it exists. A partial checkpoint is the field's most reported resume failure (a save killed half-way, a power
loss before DeepSpeed's ``latest``): resuming from it crashes, or worse, loads garbage. So a checkpoint counts only
when it is complete, by the tool's own marker where it has one, and by what can be checked from outside otherwise:

* a folder ``step-N`` (torchtitan, Distributed Checkpoint) once its ``.metadata`` is written;
* a folder ``checkpoint-N`` (Hugging Face ``Trainer``) once its ``trainer_state.json`` is written and parses;
* any other folder (accelerate's ``checkpoint_N``, a DCP folder of another name) when every file in it that can be
  checked is whole: each torch file (a ``.pt``, ``.pth``, ``.ckpt``, ``.tar`` or ``.bin``, or any file that starts as
  a zip) and each ``.safetensors`` file. A save killed half-way leaves one of them cut off (accelerate's
  ``optimizer.bin``), and nothing in the folder grows any more, so growth alone cannot tell;
* a file that is not empty and not growing; a torch file must also be a whole zip archive (its central directory,
  written last, is there and every member lies inside the file) or an older pickle, and a ``.safetensors`` file
  exactly as long as its header says. The file is never unpickled (the host never imports torch).

A folder with nothing that can be checked (and no marker) is *unknown*: it is taken only when no whole checkpoint
is found, the newest unknown one then. "Still growing" is measured, not guessed: a candidate's size and time
(:func:`signature`) are taken when it is found (:func:`find`) and again when it is chosen (:func:`choose`); whatever
changed in between is being written and is passed over. The caller puts the time between the two looks.

What a look costs does not grow with the run: :func:`find` lists the globs and takes one ``lstat`` of each match
(the step from its name, never a file read), and only the :data:`NEWEST_SIGNED` newest are walked for their
signature; :func:`choose` reads the newest ones until one is whole, and a Trainer's ``trainer_state.json`` for its
step only of the one chosen. A run that has written 150 ``checkpoint-N`` folders is looked at as one of 5 is.

Newest is by the checkpoint's own time (a folder's: its newest file's, for the ones walked), and :func:`choose` falls
back to the next one when the newest is broken. ``since`` leaves out checkpoints older than the run: another run's
files in the same folder are not this run's work.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple

#: Files in a checkpoint folder looked at for its time and growth; a sharded checkpoint of thousands is judged by
#: its marker, and a folder this full without one is judged by its first ones.
MAX_FOLDER_FILES = 4096
#: Matches of one glob taken at most: a pattern that matches a whole dataset is a mistake, not a checkpoint list.
MAX_MATCHES = 10000
#: torch.save's suffixes: such a file must be a zip archive (torch's format since 1.6) or an older pickle.
TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")
#: Inside a folder without a marker, ``.bin`` is torch.save's too (accelerate's ``optimizer.bin``, ``pytorch_model.bin``).
FOLDER_TORCH_SUFFIXES = (*TORCH_SUFFIXES, ".bin")
SAFETENSORS = ".safetensors"
#: A safetensors header past this is no header (the format's own limit is 100 MB; real ones are kilobytes).
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
#: The newest candidates :func:`find` walks for their signature (the rest are only ``lstat``-ed): enough for a save
#: under way, the one before it and a few broken ones; an older candidate is walked only if all of these are broken.
NEWEST_SIGNED = 4
#: Why a folder without a marker is not known whole (:func:`choose` takes one only when no whole one is there).
UNKNOWN = "nothing in it can be checked (no torch or safetensors file)"
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
    #: Size and time are its :func:`signature` (False: only its own ``lstat``, for an old candidate not walked).
    signed: bool = True

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


def named_step(path: Path) -> Optional[int]:
    """The number a checkpoint's name tells (``checkpoint-500``, ``step=340``), None without one: no file is read."""
    found = _STEP.findall(path.name)
    return int(found[-1]) if found and len(found[-1]) < 19 else None  # more digits than an int64 are no step


def step_of(path: Path) -> Optional[int]:
    """The step a checkpoint holds: a Trainer's ``global_step``, else the number its name tells; None unknown."""
    state = _read_json(path / "trainer_state.json") if path.name.startswith("checkpoint-") else None
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        return step
    return named_step(path)


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


def _safetensors_problem(handle: BinaryIO, size: int) -> Optional[str]:
    """Why a safetensors file is not whole: its length must be the 8-byte header length, the header, and the
    tensors' data up to the furthest ``data_offsets`` end the header names (only the header is read)."""
    head = handle.read(8)
    length = int.from_bytes(head, "little") if len(head) == 8 else -1
    if length < 0 or 8 + length > size:
        return "a safetensors file cut off in its header"
    if length > MAX_SAFETENSORS_HEADER:
        return "no safetensors header"
    try:
        header = json.loads(handle.read(length))
    except (ValueError, RecursionError):
        return "a safetensors header that does not parse"
    ends = [t.get("data_offsets") for t in header.values() if isinstance(t, dict)] if isinstance(header, dict) else []
    end = max((o[1] for o in ends if isinstance(o, list) and len(o) == 2 and isinstance(o[1], int)), default=0)
    return None if size == 8 + length + end else f"a safetensors file of {size} bytes where its header says {8 + length + end}"


def file_problem(path: Path, info: os.stat_result, in_folder: bool = False) -> Optional[str]:
    """Why the file at ``path`` is no complete checkpoint, None when it is one (``in_folder``: one file of a folder
    without a marker, where ``.bin`` is a torch file too)."""
    if info.st_size == 0:
        return "empty"
    try:
        with open(path, "rb") as handle:  # a checkpoint the child wrote: read, never changed
            if path.suffix.lower() == SAFETENSORS:
                return _safetensors_problem(handle, info.st_size)
            head = handle.read(4)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if head == ZIP_MAGIC:
        return _zip_problem(path, info.st_size)
    torch = FOLDER_TORCH_SUFFIXES if in_folder else TORCH_SUFFIXES
    if path.suffix.lower() in torch and not head.startswith(PICKLE_MAGIC):
        return "not a torch.save file (neither a zip archive nor a pickle)"
    return None


def checkable(path: Path) -> bool:
    """Whether a file in a folder without a marker can be checked whole: a torch or safetensors file by its name."""
    return path.suffix.lower() in (*FOLDER_TORCH_SUFFIXES, SAFETENSORS)


def _unmarked_problem(path: Path) -> Optional[str]:
    """A folder without a marker: every torch or safetensors file whole (or any file that reads as a zip)."""
    files = _files(path)
    if not files:
        return "an empty folder"
    looked = 0
    for file, info in files:
        if not checkable(file) and not _starts_as_zip(file, info):
            continue
        looked += 1
        why = file_problem(file, info, in_folder=True)
        if why is not None:
            return f"{file.relative_to(path)}: {why}"
    return None if looked else UNKNOWN


def _starts_as_zip(path: Path, info: os.stat_result) -> bool:
    if info.st_size < len(ZIP_MAGIC):
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    except OSError:
        return False


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
    return _unmarked_problem(path)


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


def _listed(patterns: Sequence[str], roots: Sequence[Path], since: Optional[float]) -> List[Checkpoint]:
    """Every match of the globs, by one ``lstat`` each (a folder's own time; unsigned), newest first."""
    seen: Dict[Path, Checkpoint] = {}
    for pattern in patterns:
        bases = [Path("/")] if os.path.isabs(pattern) else list(roots)
        for base in bases:
            for count, match in enumerate(glob.iglob(str(base / pattern), recursive=True)):
                if count >= MAX_MATCHES:
                    break
                path = Path(match)
                info = _lstat(path)
                if info is None or path in seen or (since is not None and info.st_mtime < since):
                    continue
                if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
                    seen[path] = Checkpoint(path, info.st_mtime, named_step(path), info.st_size, signed=False)
    return sorted(seen.values(), key=lambda c: (c.mtime, c.step or 0), reverse=True)


def _signed(candidate: Checkpoint) -> Optional[Checkpoint]:
    """``candidate`` with its :func:`signature` (a folder walked), None when it is gone."""
    found = signature(candidate.path)
    return None if found is None else replace(candidate, size=found[0], mtime=found[1], signed=True)


def find(patterns: Sequence[str], roots: Sequence[Path], since: Optional[float] = None) -> List[Checkpoint]:
    """Every file or folder the globs match under ``roots`` (an absolute glob once), newest first; those older than
    ``since`` (unix time) left out. The :data:`NEWEST_SIGNED` newest carry their signature; nothing is read and
    nothing is checked for completeness here (:func:`choose` does)."""
    listed = _listed(patterns, roots, since)
    head = [signed for signed in map(_signed, listed[:NEWEST_SIGNED]) if signed is not None]
    head.sort(key=lambda c: (c.mtime, c.step or 0), reverse=True)
    return head + listed[NEWEST_SIGNED:]


def _why_not(candidate: Checkpoint) -> Optional[str]:
    """Why ``candidate`` cannot be resumed from now: gone, changed since it was found, or not complete."""
    now = signature(candidate.path)
    if now is None:
        return "gone"
    if candidate.signed and now != (candidate.size, candidate.mtime):
        return "still being written"
    return problem(candidate.path)


def choose(candidates: Sequence[Checkpoint]) -> Tuple[Optional[Checkpoint], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ``candidates`` (newest first, as :func:`find` gives them) that has not
    changed since it was found, else the newest folder that cannot be checked (:data:`UNKNOWN`); and every newer one
    passed over with why. The chosen one's step is read then (a Trainer's ``global_step``)."""
    passed: List[Tuple[str, str]] = []
    unknown: Optional[Checkpoint] = None
    for candidate in candidates:
        why = _why_not(candidate)
        if why is None:
            return replace(candidate, step=step_of(candidate.path)), passed
        if why == UNKNOWN and unknown is None:
            unknown = candidate
        passed.append((str(candidate.path), why))
    if unknown is None:
        return None, passed
    return replace(unknown, step=step_of(unknown.path)), passed[: [p for p, _ in passed].index(str(unknown.path))]
