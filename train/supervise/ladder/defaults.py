"""Built-in rungs for programs trainbox knows, used when ``supervise`` is given no ``--ladder``.

Why. A data loader that deadlocks is restarted on the same settings without a ladder, and hangs again with the same
workers, where a person would lower the worker count. For the programs :mod:`trainbox.supervise.resume.recipes`
recognises and whose worker count is an option, the ladder writes that person's steps down: the command as given,
then half its workers, then none (``workers=`` for ``yolo train``, ``--dataloader_num_workers`` for a Hugging Face
``Trainer`` script). They are ordinary rungs (:class:`trainbox.supervise.ladder.command.Rung`): the stall's cause
chooses whether to move at all (a loader deadlock does, a spin does not), the ladder policy weighs the move and may
climb back, and the events name the rung (``workers-4``). A command whose worker count is 0 already, or unknown,
gets no rungs: it runs as today.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence

from trainbox.rundir.events import Cause
from trainbox.supervise.resume import recipes

if TYPE_CHECKING:
    from trainbox.supervise.ladder.command import Rung

#: The stall causes that move the run between the built-in rungs: a hang in the data loader, which fewer workers cure.
CAUSES = frozenset({Cause.LOADER_DEADLOCK.value})
#: When the built-in rungs move, as the start line says it.
WHEN = "a data loader that hangs steps down, and may climb back; --ladder FILE for your own"
#: Ultralytics' own default for ``workers`` (ultralytics/cfg/default.yaml), when the command gives none.
YOLO_WORKERS = 8
#: Prior speeds until this run measures them: fewer workers feed the model more slowly (half of them: a guess of 20 %
#: slower; none, loading in the training process: half the speed). The policy replaces them with measured rates.
HALF_SPEED, NONE_SPEED = 0.8, 0.5


def _workers(argv: Sequence[str], program: recipes.Program) -> Optional[int]:
    """The worker count the command gives (the program's default when it gives none), None when it is no count."""
    if program.workers == "workers":
        text = recipes.pairs(argv).get("workers", str(YOLO_WORKERS))
    else:
        text = recipes.option(argv, program.workers or "") or "0"  # the Trainer's default is 0: nothing to lower
    try:
        return int(text)
    except ValueError:
        return None


def _set(program: recipes.Program, count: int) -> List[str]:
    name = program.workers or ""
    return [f"{name}={count}"] if not name.startswith("-") else [name, str(count)]


def rungs_for(argv: Sequence[str]) -> List[Rung]:
    """The built-in rungs for ``argv`` (see the module docstring); none for a command trainbox does not know."""
    program = recipes.recognise(argv)
    if program is None or program.workers is None:
        return []
    given = _workers(argv, program)
    if given is None or given <= 0:
        return []
    from trainbox.supervise.ladder.command import Rung  # pydantic: only for a command that gets rungs (cli's doc)

    rungs = [Rung(name=f"workers-{given}")]
    if given // 2 not in (0, given):
        rungs.append(Rung(name=f"workers-{given // 2}", args=_set(program, given // 2), expected_speed=HALF_SPEED))
    rungs.append(Rung(name="workers-0", args=_set(program, 0), expected_speed=NONE_SPEED))
    return rungs
