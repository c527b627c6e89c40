"""Each attempt's command, told to resume from the run's newest complete checkpoint: what a restart adds.

The supervisor asks :meth:`Resumer.launch` for every attempt before it starts (the first one too: a run named
again after a Ctrl-C resumes its own work). The way to resume is, first found:

1. the rung's ``resume:`` words (``supervise --ladder``), else the run's ``--resume-args``; ``{checkpoint}`` in a
   word becomes the checkpoint's path, and the words are appended to the command;
2. else the built-in recipe of a program trainbox knows (:mod:`trainbox.supervise.resume.recipes`), which also
   replaces the same option in the command;
3. else nothing: the command runs as it is, and a restart says why in its ``resumed`` (``from`` null, ``why``): the
   checkpoints the command wrote that no restart uses, and the options that would hand them back
   (:mod:`trainbox.supervise.resume.unused`).

Where the checkpoints are: ``--checkpoint GLOB`` (relative to the working directory, then the run directory), else
the recipe's globs; either way only those written since the run first started count (its earlier attempts and
earlier supervisors of the same run directory included: :mod:`trainbox.rundir.first_start`), since another run's
in the same folder are not this one's work; for a program that names its own folder as it starts (``yolo train``'s
``save_dir``), only that folder's (:mod:`trainbox.supervise.resume.printed`). The newest complete one is chosen
(:mod:`trainbox.supervise.resume.checkpoints`), after :data:`SETTLE_S` for anything still being written to show it.
A new run's first attempt runs exactly as given, whatever lies in its folders; a run that is gone on with
(``--resume``, the Ctrl-C line, ``--run-dir`` of an existing run) resumes its own newest checkpoint from its first
attempt on. Without a checkpoint of this run the command runs as it is: an attempt never gets ``resume=True``
(which Ultralytics answers by searching the whole working directory) or a ``--resume_from_checkpoint`` (which the
Trainer refuses on a first run) with nothing to resume. Words without ``{checkpoint}`` and nothing to find
checkpoints by are added at every restart, and never to a first attempt.

A program that refuses the words it was given (its usage error before any progress,
:mod:`trainbox.supervise.resume.refusal`) has them withdrawn: from the next attempt on the command runs as given, and
the restart line says why.

What was chosen, or why nothing was, goes on the launch (``Launch.resumed``): the ``start`` and ``restart`` events
carry it (``reached``: where the attempt before it got to); the monitor measures the work done again
(:mod:`trainbox.supervise.resume.redone`).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.supervise.planner import Launch
from trainbox.supervise.policy import Outcome
from trainbox.supervise.resume import checkpoints, recipes, refusal
from trainbox.supervise.resume.printed import PrintedFolders
from trainbox.supervise.resume.unused import Unused
from trainbox.supervise.settings import CHECKPOINT_FIELD, NO_RESUME, SupervisorSettings, resume_words

#: Seconds between finding the checkpoints and choosing one: a save under way writes far more often than this, so
#: a file or folder that has not changed across it is not being written (the child tree is already gone by then).
SETTLE_S = 0.5
#: Checkpoints passed over that an event lists (the newest ones): enough to see why the newest was not taken.
PASSED_LISTED = 5


class Resumer:
    """Applies the run's resume rule to each launch (see the module docstring)."""

    def __init__(
        self,
        settings: SupervisorSettings,
        run_root: Path,
        since: float,
        cwd: Optional[Path] = None,
        sleep: Callable[[float], Any] = time.sleep,
        new: bool = False,
    ) -> None:
        self.off = settings.resume_args.strip() == NO_RESUME
        self.words = resume_words(settings.resume_args) if settings.resume_args and not self.off else None
        self.named = (settings.checkpoint,) if settings.checkpoint else ()
        self.roots = (cwd or Path.cwd(), Path(run_root).absolute())
        self.since = since
        self.sleep = sleep
        self.printed = PrintedFolders(Path(run_root))
        #: The run starts now (nothing of it before): its first attempt runs exactly as given.
        self.new = new
        #: The resume words the last launch was given (:mod:`trainbox.supervise.resume.refusal` judges its end by them).
        self.given: List[str] = []
        #: Why resume words are no longer added (the program refused them), once they are not.
        self.withdrawn: Optional[str] = None
        #: An unrecognised command's checkpoints, which no restart uses: said at each restart (resume/unused.py).
        self.unused = Unused(self.roots[0], since, skip=(self.roots[1],))

    def problem(self, launch: Launch) -> Optional[str]:
        """Why ``launch`` cannot resume as it asks (one line), None when it can: ``{checkpoint}`` with nowhere to look."""
        words = launch.resume if launch.resume is not None else self.words
        if words and any(CHECKPOINT_FIELD in word for word in words) and not self._globs(launch)[0]:
            return (
                f"the resume arguments name {CHECKPOINT_FIELD}, but trainbox does not know where "
                f"{Path(launch.argv[0]).name} writes its checkpoints: say it with --checkpoint GLOB"
            )
        return None

    def _globs(self, launch: Launch) -> Tuple[Tuple[str, ...], Optional[recipes.Program]]:
        """Where to look (the user's ``--checkpoint``, else the recipe's globs), and the program recognised."""
        program = recipes.recognise(launch.argv)
        return (self.named or (program.globs if program else ())), program

    def launch(self, launch: Launch, restart: bool, after: Optional[Outcome] = None) -> Launch:
        """``launch`` as it runs: told to resume from the newest complete checkpoint of this run when there is one
        (see the module docstring); ``restart``: an attempt after another, which ended as ``after``."""
        if self.off and launch.resume is None:
            return launch
        globs, program = self._globs(launch)
        words = launch.resume if launch.resume is not None else self.words
        if words is None and program is None:
            return replace(launch, resumed=self.unused.why(launch.argv)) if restart else launch
        how = "the rung's resume" if launch.resume is not None else "--resume-args" if words is not None else None
        reached = after.last_beat if after is not None else None
        about: Dict[str, Any] = {"how": how or f"the built-in way for {program.name if program else '?'}"}
        about["reached"] = dict(reached) if reached else None
        refused = refusal.refused(after, self.given) if after is not None else None
        if refused:
            self.withdrawn = f"the program refused {refused} (its usage error): the command runs as given from now on"
        self.given = []
        if self.withdrawn or (self.new and not restart):
            why = self.withdrawn or "a new run's first attempt runs as given"
            return replace(launch, resumed={**about, "from": None, "why": why, **({"refused": refused} if refused else {})})
        resumed = self._resumed(launch, restart, globs, program, words, about)
        self.given = [word for word in resumed.argv if word not in launch.argv]
        return resumed

    def _resumed(
        self,
        launch: Launch,
        restart: bool,
        globs: Sequence[str],
        program: Optional[recipes.Program],
        words: Optional[Sequence[str]],
        about: Dict[str, Any],
    ) -> Launch:
        if not globs:  # words without {checkpoint} and nowhere to look: every restart adds them (problem() refused the rest)
            if not restart or not words:
                return launch
            return replace(launch, argv=[*launch.argv, *words], resumed={**about, "from": None, "why": "added at every restart"})
        chosen, passed = self._choose(globs, program)
        about.update(looked_for=list(globs), passed_over=[{"path": p, "why": w} for p, w in passed[:PASSED_LISTED]])
        if chosen is None:
            return replace(launch, resumed={**about, "from": None, "why": "no complete checkpoint of this run yet"})
        path = str(chosen.path)
        argv = [*launch.argv, *(w.replace(CHECKPOINT_FIELD, path) for w in words)] if words is not None else None
        argv = argv if argv is not None else program.resumed(launch.argv, path) if program else list(launch.argv)
        return replace(launch, argv=argv, resumed={**about, "from": path, "step": chosen.step, "mtime": round(chosen.mtime, 3)})

    def _find(self, globs: Sequence[str], program: Optional[recipes.Program]) -> List[checkpoints.Checkpoint]:
        """This run's checkpoints, newest first: written since it first started, where its program writes them."""
        found = checkpoints.find(globs, self.roots, self.since)
        if self.named or program is None:
            return found
        said = self.printed.found(program.says) if program.says is not None else []
        if said:  # the folders the run named as its own, resolved as the program printed them
            return [c for c in found if any(Path(os.path.realpath(c.path)).is_relative_to(f) for f in said)]
        return [c for c in found if program.own(c.path)]

    def _choose(
        self, globs: Sequence[str], program: Optional[recipes.Program]
    ) -> Tuple[Optional[checkpoints.Checkpoint], List[Tuple[str, str]]]:
        found = self._find(globs, program)
        if found:
            self.sleep(SETTLE_S)
        return checkpoints.choose(found)

    def newest(self, launch: Launch) -> Optional[checkpoints.Checkpoint]:
        """The newest complete checkpoint ``launch``'s command has written so far (for ``status``), without waiting."""
        globs, program = self._globs(launch)
        if program is None and launch.resume is None and self.words is None and not self.off:
            self.unused.look()  # on the look's thread, as this is
        return checkpoints.choose(self._find(globs, program))[0] if globs else None


def resumed_words(resumed: Optional[Mapping[str, Any]]) -> str:
    """``, resuming from PATH (step N)`` or ``, from the start: WHY`` for the restart line; '' when it cannot resume."""
    if not resumed:
        return ""
    if resumed.get("from"):
        step = resumed.get("step")
        return f", resuming from {resumed['from']}" + (f" (step {step})" if step is not None else "")
    return f", from the start: {resumed.get('why', 'no checkpoint')}" if resumed.get("why") != "added at every restart" else ""
