"""The programs trainbox knows by their command: where each keeps its checkpoints, and how it is told to resume.

Why it exists. A restart that runs the same command again starts a run over from nothing unless the command
resumes by itself, and most do not: ``yolo train`` wants ``resume=True``, a Hugging Face ``Trainer`` script
``--resume_from_checkpoint``, nanoGPT ``init_from=resume``, a Lightning fit ``ckpt_path``. A person restarting
by hand adds that argument; :func:`recognise` lets trainbox do the same. It is the one place that tells programs
apart by their command, so the built-in ladder rungs (:mod:`trainbox.supervise.ladder.defaults`) read it too.

What is recognised, from the command alone (and, for a Python script, its own text, read up to
:data:`MAX_SCRIPT_BYTES`):

* **yolo**: ``yolo [TASK] train ...`` (or ``ultralytics``). Its ``last.pt`` is ``<project>/<name>/weights/last.pt``
  under Ultralytics' runs folder (``runs_dir`` of its settings file, else ``runs/`` at the top of the git checkout
  or here), any task, in the run's own folder: the ``save_dir`` its attempts printed (:data:`YOLO_SAYS`), and before
  one has, a folder named by Ultralytics' own rule: ``name``, else ``name-2``, ``name-3`` ... (:data:`YOLO_TAKEN`),
  so ``name=exp`` never matches ``exp_lr2`` of a sweep. The restart
  adds ``resume=True model=<last.pt>``: with a path, Ultralytics resumes that file, where a bare ``resume=True``
  would search the whole working directory.
* **hf**: a command with ``--output_dir DIR`` whose script builds a ``Trainer``'s arguments (``TrainingArguments``
  or ``HfArgumentParser`` in its text). Its checkpoints are ``DIR/checkpoint-N``,
  each complete once its ``trainer_state.json`` is there. The restart adds ``--resume_from_checkpoint <dir>``.
* **nanogpt**: a script that reads nanoGPT's ``configurator.py`` and has ``init_from`` (a command's ``--out_dir=``
  alone says nothing: many scripts take one). Its checkpoint is ``<out_dir>/ckpt.pt``
  (``--out_dir=``, else the ``out_dir = '...'`` of its config files or script, else ``out``). The restart adds
  ``--init_from=resume``: nanoGPT reads that one file.
* **lightning**: a command with ``--ckpt_path``, or a script that imports Lightning and declares a ``--ckpt_path``
  option. Its checkpoints are ``lightning_logs/*/checkpoints/*.ckpt`` and ``checkpoints/*.ckpt`` (under
  ``--default_root_dir`` when given). The restart adds ``--ckpt_path <file>``.

The words a recipe adds replace the same option already in the command (``init_from=scratch``, an old
``model=``), so the command says one thing. Globs are relative to the working directory unless absolute.

Limits. Recognition reads words, not meaning: a ``Trainer`` script with an argparse of its own may have no
``--resume_from_checkpoint``; it refuses the words with its usage error, and the run withdraws them
(:mod:`trainbox.supervise.resume.refusal`). Two ``yolo train`` runs of one ``name`` started together in one
folder get ``name`` and ``name-2``, both by the rule: until the run's output has named its folder, the time it first
started tells them apart only from older runs. A program configured from a file (a YAML of Trainer arguments)
shows none of its options here and is not recognised: give ``--resume-args`` and ``--checkpoint`` for it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, List, Optional, Pattern, Sequence, Tuple

from trainbox.rundir.layout import program_start

#: A training script is a few KiB to a few hundred; past this it is not read for clues (nor a config file).
MAX_SCRIPT_BYTES = 512 * 1024
#: Ultralytics' settings file, under its config folder (``YOLO_CONFIG_DIR``, else ``~/.config/Ultralytics``).
YOLO_SETTINGS = "settings.json"
#: Where a Lightning fit keeps its checkpoints by default (``ModelCheckpoint`` under the logger's version folder).
LIGHTNING_GLOBS = ("lightning_logs/*/checkpoints/*.ckpt", "checkpoints/*.ckpt")

#: Programs that run a Python script named later in the command: its text says what it can take.
SCRIPT_RUNNERS = re.compile(r"(python[0-9.]*|torchrun|accelerate|deepspeed)")
#: The words in a script that build a Hugging Face ``Trainer``'s arguments, and so take ``--resume_from_checkpoint``.
HF_ARGUMENTS = ("TrainingArguments", "HfArgumentParser")
#: Ultralytics' own folder naming (``increment_path``): ``name``, else ``name-2``, ``name-3`` ... (``name2`` before 8.4).
YOLO_TAKEN = r"(?:-?(?:[2-9]|[1-9][0-9]+))?"
#: Ultralytics' arguments line names the run's folder: ``save_dir=/w/runs/detect/exp-2, ...`` (also when it resumes).
YOLO_SAYS = re.compile(r"save_dir=([^,\n]+)")

#: A recipe's rewrite: the command and a checkpoint's path to the command that resumes from it.
Rewrite = Callable[[Sequence[str], str], List[str]]


@dataclass(frozen=True)
class Program:
    """A recognised program: its name, where its checkpoints are, and how a restart resumes it."""

    name: str
    #: Globs of its checkpoints (files or folders), relative to the working directory unless absolute.
    globs: Tuple[str, ...]
    rewrite: Rewrite
    #: The worker-count option its built-in rungs lower (``workers=`` or ``--dataloader_num_workers``), if any.
    workers: Optional[str] = None
    #: What a match of the globs must also end with to be this run's (a glob cannot say ``name`` or ``name<n>``).
    keep: Optional[Pattern[str]] = None
    #: What the program prints about its own folder (group 1), read back from the run's attempt logs
    #: (:mod:`trainbox.supervise.resume.printed`): once it has said it, only checkpoints in that folder are its own.
    says: Optional[Pattern[str]] = None

    def own(self, path: Path) -> bool:
        """Whether ``path``, a match of the globs, is where this program writes (:attr:`keep`)."""
        return self.keep is None or self.keep.search(path.as_posix()) is not None

    def resumed(self, argv: Sequence[str], checkpoint: str) -> List[str]:
        """``argv`` told to resume from ``checkpoint``."""
        return self.rewrite(argv, checkpoint)


# -- reading a command ---------------------------------------------------------------------------------------


def option(argv: Sequence[str], *names: str) -> Optional[str]:
    """The value of the last ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (any of ``names``), None without."""
    found = None
    for at, word in enumerate(argv):
        for name in names:
            if word == name and at + 1 < len(argv):
                found = argv[at + 1]
            elif word.startswith(name + "="):
                found = word[len(name) + 1 :]
    return found


def without(argv: Sequence[str], *names: str, takes_value: bool = True) -> List[str]:
    """``argv`` without ``--name VALUE`` / ``--name=VALUE`` (or ``key=VALUE`` for a name without dashes)."""
    kept: List[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in names:
            skip = takes_value
            continue
        if any(word.startswith(name + "=") for name in names):
            continue
        kept.append(word)
    return kept


def pairs(argv: Sequence[str]) -> dict:
    """Ultralytics' ``key=value`` words, the last one of each key winning (as Ultralytics reads them)."""
    return dict(word.split("=", 1) for word in argv if "=" in word and not word.startswith("-"))


def _script(argv: Sequence[str]) -> Optional[str]:
    """The Python script a command runs (``python train.py ...``, ``./train.py``, ``torchrun train.py``), None for
    anything else."""
    first = Path(argv[0]).name if argv else ""
    if first.endswith(".py"):
        return argv[0]
    if SCRIPT_RUNNERS.fullmatch(first):
        return next((word for word in argv[1:] if word.endswith(".py") and not word.startswith("-")), None)
    return None


def script_text(path: Optional[str]) -> str:
    """The first MAX_SCRIPT_BYTES of a script or config file the command names ('' when unreadable)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:  # not the run directory: the user's own script
            return handle.read(MAX_SCRIPT_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


# -- yolo ------------------------------------------------------------------------------------------------------


def _is_yolo_train(argv: Sequence[str]) -> bool:
    return bool(argv) and Path(argv[0]).name in ("yolo", "ultralytics") and "train" in argv[1:3]


def _git_root(start: Path) -> Optional[Path]:
    """The git checkout ``start`` is in (Ultralytics puts its runs folder at its top on a first run there)."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():  # not the run directory: the user's checkout
            return folder
    return None


def _yolo_runs_dirs() -> List[str]:
    """Ultralytics' runs folder from its settings file, then where a first run puts it: the top of the git checkout
    here, else ``runs`` here (the settings file is written by that first run, after trainbox has looked)."""
    config = os.environ.get("YOLO_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "Ultralytics")
    found: List[str] = []
    try:
        settings = json.loads(script_text(os.path.join(config, YOLO_SETTINGS)) or "{}")
    except ValueError:
        settings = {}
    runs = settings.get("runs_dir") if isinstance(settings, dict) else None
    if isinstance(runs, str) and runs:
        found.append(runs)
    root = _git_root(Path.cwd().absolute())
    return found + ([str(root / "runs")] if root is not None else []) + ["runs"]


def _yolo_name(argv: Sequence[str]) -> str:
    return pairs(argv).get("name") or "train"


def _yolo_keep(argv: Sequence[str]) -> Pattern[str]:
    """A ``last.pt`` of this run's folder by Ultralytics' naming: ``exp`` or ``exp2``, never ``exp_lr2``."""
    return re.compile(f"(?:^|/){re.escape(_yolo_name(argv))}{YOLO_TAKEN}/weights/last\\.pt$")


def _yolo_globs(argv: Sequence[str]) -> Tuple[str, ...]:
    given = pairs(argv)
    project, name = given.get("project", ""), _yolo_name(argv)
    tail = f"{glob_escape(name)}*/weights/last.pt"  # the folders of other names are left out by _yolo_keep
    if project and os.path.isabs(project):
        return (f"{glob_escape(project)}/{tail}",)
    inner = f"{glob_escape(project)}/" if project else ""
    found = [f"{glob_escape(base)}/*/{inner}{tail}" for base in _yolo_runs_dirs()]
    return tuple(found + ([f"{glob_escape(project)}/{tail}"] if project else []))


def _yolo_resumed(argv: Sequence[str], checkpoint: str) -> List[str]:
    kept = [word for word in argv if word != "resume" and not word.startswith(("resume=", "model="))]
    return [*kept, "resume=True", f"model={checkpoint}"]


# -- Hugging Face Trainer ------------------------------------------------------------------------------------------

HF_OUTPUT = ("--output_dir", "--output-dir")
HF_RESUME = ("--resume_from_checkpoint", "--resume-from-checkpoint")


def _hf_resumed(argv: Sequence[str], checkpoint: str) -> List[str]:
    return [*without(argv, *HF_RESUME), HF_RESUME[0], checkpoint]


# -- nanoGPT ---------------------------------------------------------------------------------------------------------

#: nanoGPT's ``out_dir = 'out-shakespeare-char'`` in a config file or the script.
_OUT_DIR = re.compile(r"""^\s*out_dir\s*=\s*['"]([^'"\n]+)['"]""", re.MULTILINE)


def _is_hf(argv: Sequence[str]) -> bool:
    if not option(argv, *HF_OUTPUT):
        return False
    text = script_text(_script(argv))
    return any(word in text for word in HF_ARGUMENTS)


def _is_nanogpt(argv: Sequence[str]) -> bool:
    text = script_text(_script(argv))
    return "init_from" in text and "configurator" in text


def _nanogpt_out_dir(argv: Sequence[str]) -> str:
    given = option(argv, "--out_dir")
    if given:
        return given
    script = _script(argv)
    configs = [word for word in argv if word.endswith(".py") and word != script and not word.startswith("-")]
    for path in reversed(configs):  # nanoGPT's configurator runs them in order: the last one's out_dir wins
        match = _OUT_DIR.findall(script_text(path))
        if match:
            return match[-1]
    match = _OUT_DIR.findall(script_text(script))
    return match[-1] if match else "out"


def _nanogpt_resumed(argv: Sequence[str], checkpoint: str) -> List[str]:
    return [*without(argv, "--init_from"), "--init_from=resume"]  # it reads <out_dir>/ckpt.pt itself


# -- Lightning --------------------------------------------------------------------------------------------------------


def _is_lightning(argv: Sequence[str]) -> bool:
    if any(word == "--ckpt_path" or word.startswith("--ckpt_path=") for word in argv):
        return True
    text = script_text(_script(argv))
    return "lightning" in text and "--ckpt_path" in text


def _lightning_globs(argv: Sequence[str]) -> Tuple[str, ...]:
    root = option(argv, "--default_root_dir", "--trainer.default_root_dir")
    if not root:
        return LIGHTNING_GLOBS
    return tuple(f"{glob_escape(root)}/{pattern}" for pattern in LIGHTNING_GLOBS)


def _lightning_resumed(argv: Sequence[str], checkpoint: str) -> List[str]:
    return [*without(argv, "--ckpt_path"), "--ckpt_path", checkpoint]


def _behind(prefix: Sequence[str], rewrite: Rewrite) -> Rewrite:
    """``rewrite`` of the program's own words, ``prefix`` (``env VAR=1``) kept before them."""
    return lambda argv, checkpoint: [*prefix, *rewrite(argv[len(prefix) :], checkpoint)]


# -- recognising -------------------------------------------------------------------------------------------------------


def glob_escape(text: str) -> str:
    """``text`` as a literal part of a glob (a folder named ``run[1]`` is that folder, not a pattern)."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def recognise(argv: Sequence[str]) -> Optional[Program]:
    """The program ``argv`` runs, when trainbox knows how it resumes (see the module docstring); else None.
    ``env VAR=value ...`` before it is passed over (:func:`trainbox.rundir.layout.program_start`) and kept."""
    start = program_start(argv)
    if start:
        found = recognise(argv[start:])
        return None if found is None else replace(found, rewrite=_behind(argv[:start], found.rewrite))
    if _is_yolo_train(argv):
        return Program("yolo", _yolo_globs(argv), _yolo_resumed, workers="workers", keep=_yolo_keep(argv), says=YOLO_SAYS)
    if _is_hf(argv):
        output = glob_escape(option(argv, *HF_OUTPUT) or "")
        return Program("hf", (f"{output}/checkpoint-*",), _hf_resumed, workers="--dataloader_num_workers")
    if _is_nanogpt(argv):
        return Program("nanogpt", (f"{glob_escape(_nanogpt_out_dir(argv))}/ckpt.pt",), _nanogpt_resumed)
    if _is_lightning(argv):
        return Program("lightning", _lightning_globs(argv), _lightning_resumed)
    return None
