"""What a restart cannot do: checkpoints the command wrote that no restart will hand back.

Why it exists. A restart resumes only a program trainbox knows (:mod:`trainbox.supervise.resume.recipes`) or one it
was told about (``--resume-args``). Anyone else's script that saves ``checkpoints/step_000275.pt`` every 25 steps
and takes ``--resume PATH`` is restarted from step 0, and a line that said only "the same command again" hid that a
night's checkpoints were there. So, for a command that is neither, trainbox watches for checkpoint-like things the
child writes during the run, and the restart says what it cannot do and how to make it:

* **what is watched**: under the working directory (the run directory left out), files named like a checkpoint
  (:data:`SUFFIXES`: ``.pt``, ``.pth``, ``.ckpt``, ``.safetensors``) and folders named like one (``checkpoint-500``,
  ``checkpoint_3``, ``step-12``), written since the run began. A look is a bounded walk that only ``stat``\\ s
  (:data:`MAX_ENTRIES` entries, :data:`MAX_DEPTH` folders deep, hidden folders passed over): nothing is opened or
  parsed, and it runs on the checkpoint look's thread, never in the monitor loop;
* **the options that would hand it back**: the script's own resume option, read from its ``add_argument`` calls
  with :mod:`ast` (the script is never run; an option named ``--resume...`` first, then one that loads a
  checkpoint), and a ``--checkpoint`` glob made from the newest one's path (its numbers become ``*``):
  ``--resume-args '--resume {checkpoint}' --checkpoint 'checkpoints/step_*.pt'``;
* **where it is said**: the ``restart`` event's ``resumed`` (``from`` null, ``why``, ``written``, ``options``), the
  restart line, and ``status`` and the report (``checkpoints written, not used on restart``).

Limits: a checkpoint outside the working directory, deeper than :data:`MAX_DEPTH`, or past the first
:data:`MAX_ENTRIES` entries of a huge folder is not seen; a script whose options come from elsewhere (a config file,
click, hydra) gets the glob and a placeholder for its option.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from trainbox.rundir.layout import program_start
from trainbox.supervise.resume.recipes import script_text
from trainbox.supervise.settings import CHECKPOINT_FIELD

#: Files named like a checkpoint: torch.save's archives, Lightning's, safetensors.
SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors")
#: Folders named like a checkpoint (a Trainer's checkpoint-500, accelerate's checkpoint_3, DCP's step-12).
FOLDERS = re.compile(r"(?:checkpoint|ckpt|step)[-_]\d+", re.IGNORECASE)
#: Entries stat'ed per look, and folders deep: a look over a dataset of millions stays a few milliseconds.
MAX_ENTRIES = 5000
MAX_DEPTH = 4
#: Option names, in order, that take back a checkpoint (``--resume``, ``--resume_from_checkpoint``, ``--ckpt_path``).
RESUME_NAMES = (re.compile(r"resume"), re.compile(r"ckpt[-_]?path|load[-_]?(?:from|checkpoint|ckpt)|init[-_]from"))
#: argparse actions that take no value: such a resume option is a switch, the program finds its checkpoint itself.
SWITCHES = ("store_true", "store_false", "store_const", "count")


@dataclass(frozen=True)
class Written:
    """A checkpoint-like file or folder the command wrote: where, and when."""

    path: Path
    mtime: float


def scan(root: Path, since: float, skip: Sequence[Path] = ()) -> Optional[Written]:
    """The newest checkpoint-like entry under ``root`` written at ``since`` or later (see the module docstring)."""
    newest: Optional[Written] = None
    folders: List[Tuple[Path, int]] = [(root, 0)]
    seen = 0
    while folders and seen < MAX_ENTRIES:
        folder, depth = folders.pop(0)
        try:
            with os.scandir(folder) as entries:  # not the run directory: the user's working directory, stat'ed only
                listed = [entry for _, entry in zip(range(MAX_ENTRIES - seen), entries)]
        except OSError:
            continue
        seen += len(listed)
        for entry in listed:
            found, deeper = _entry(Path(entry.path), entry, since, skip)
            if found is not None and (newest is None or found.mtime > newest.mtime):
                newest = found
            if deeper and depth + 1 < MAX_DEPTH:
                folders.append((Path(entry.path), depth + 1))
    return newest


def _entry(path: Path, entry: Any, since: float, skip: Sequence[Path]) -> Tuple[Optional[Written], bool]:
    """A checkpoint-like entry (with its time) when it is one, and whether to look inside it."""
    if entry.name.startswith(".") or entry.name == "__pycache__" or path in skip:
        return None, False
    try:
        info = entry.stat(follow_symlinks=False)  # not the run directory: the working folder, the run directory skipped
    except OSError:
        return None, False
    if stat.S_ISDIR(info.st_mode):
        if FOLDERS.fullmatch(entry.name):
            return (Written(path, info.st_mtime) if info.st_mtime >= since else None), False
        return None, True
    named = stat.S_ISREG(info.st_mode) and entry.name.lower().endswith(SUFFIXES) and info.st_size > 0
    return (Written(path, info.st_mtime) if named and info.st_mtime >= since else None), False


def glob_of(path: Path, root: Path) -> str:
    """A ``--checkpoint`` glob that finds ``path`` and its siblings: relative to ``root``, the numbers of its name
    as ``*`` (``checkpoints/step_000275.pt``: ``checkpoints/step_*.pt``)."""
    try:
        relative = path.relative_to(root)
    except ValueError:
        relative = path
    name = re.sub(r"\d+", "*", re.sub(r"([*?\[])", r"[\1]", relative.name))
    return str(relative.parent / name) if str(relative.parent) != "." else name


def resume_option(source: str) -> Optional[Tuple[str, bool]]:
    """The script's own option that takes back a checkpoint, from its ``add_argument`` calls (read, never run), and
    whether it is a switch; None when it declares none (or is not Python)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    declared: List[Tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            switch = isinstance(action, ast.Constant) and action.value in SWITCHES
            declared.extend((name, switch) for name in names if name.startswith("--"))
    for wanted in RESUME_NAMES:
        found = next((option for option in declared if wanted.search(option[0].lower())), None)
        if found is not None:
            return found
    return None


def _script(argv: Sequence[str]) -> Optional[str]:
    """The Python script ``argv`` runs (past ``env``, a python and its options), None for anything else."""
    words = list(argv[program_start(argv) :])
    if words and words[0].endswith(".py"):
        return words[0]
    if words and re.fullmatch(r"python[0-9.]*", os.path.basename(words[0])):
        return next((w for w in words[1:] if w.endswith(".py") and not w.startswith("-")), None)
    return None


def options(argv: Sequence[str], written: Written, root: Path) -> str:
    """The ``supervise`` options that would hand ``written`` back to ``argv``'s restarts."""
    found = resume_option(script_text(_script(argv)))
    glob = shlex.quote(glob_of(written.path, root))
    if found is not None and found[1]:
        return f"--resume-args {shlex.quote(found[0])}"
    option = found[0] if found is not None else "<its resume option>"
    return f"--resume-args {shlex.quote(f'{option} {CHECKPOINT_FIELD}')} --checkpoint {glob}"


class Unused:
    """Watches an unrecognised command's checkpoints and says why a restart does not use them (module docstring)."""

    def __init__(self, root: Path, since: float, skip: Sequence[Path] = ()) -> None:
        self.root = root
        self.since = since
        self.skip = tuple(skip)
        #: The newest one seen by the last look (a look runs on the checkpoint look's thread: one assignment).
        self.written: Optional[Written] = None

    def look(self) -> None:
        """A look for the newest checkpoint-like thing written since the run began."""
        self.written = scan(self.root, self.since, self.skip) or self.written

    def why(self, argv: Sequence[str]) -> Dict[str, Any]:
        """``resumed`` of a restart of ``argv``, which trainbox cannot resume: ``from`` null, and why."""
        program = list(argv[program_start(argv) :]) or ["the command"]
        name = Path(_script(argv) or program[0]).name
        written = self.written
        if written is None:
            why = f"trainbox does not know how {name} resumes (--resume-args says how), and saw no checkpoint of it"
            return {"from": None, "why": why}
        said = options(argv, written, self.root)
        why = (
            f"checkpoints written, not used on restart: trainbox does not know how {name} resumes; "
            f"the newest, {written.path}, is handed back with {said}"
        )
        return {
            "from": None,
            "why": why,
            "written": {"path": str(written.path), "mtime": round(written.mtime, 3)},
            "options": said,
        }
