"""Built-in rungs for programs trainbox knows, used when ``supervise`` is given no ``--ladder``.

Why. A data loader that deadlocks is restarted on the same settings without a ladder, and hangs again with the same
workers, where a person would lower the worker count. For the programs :mod:`trainbox.supervise.resume.recipes`
recognises and whose worker count is an option, the ladder writes that person's steps down: the command as given,
then half its workers, then none (``workers=`` for ``yolo train``, ``--dataloader_num_workers`` for a Hugging Face
``Trainer`` script). They are ordinary rungs (:class:`trainbox.supervise.ladder.command.Rung`): the stall's cause
chooses whether to move at all (a loader deadlock does, a spin does not), the ladder policy weighs the move and may
climb back, and the events name the rung (``workers-4``). A command whose worker count is 0 already, or unknown,
gets no rungs: it runs as today.

A rung must change something. Ultralytics loads in the training process on the CPU and on Apple's MPS whatever
``workers=`` says (``ultralytics/engine/trainer.py``: "faster CPU training"), so a ``yolo train`` whose device is
the CPU (``device=cpu``, or no ``device=`` on a machine without a GPU, :func:`trainbox.system.gpus.visible`) gets no
rungs. And where an attempt's output says the program used no workers though it was given some ("Using 0
dataloader workers", :func:`unapplied`), a move down would change nothing either: the stall runs the same rung
again, and the restart line says why the rungs below were skipped.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from trainbox.rundir.events import Cause
from trainbox.rundir.records import files_of
from trainbox.supervise.policy import Outcome
from trainbox.supervise.resume import recipes
from trainbox.system import gpus

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
#: Ultralytics' devices that never get loader workers (``device=cpu``, ``device=mps``).
NO_WORKER_DEVICES = frozenset({"cpu", "mps"})
#: What Ultralytics says of its training loader's workers as training starts, the count it really uses.
USED_WORKERS = re.compile(rb"Using (\d{1,6}) dataloader workers")
#: How much of an attempt's log is read for that line: it comes before the first epoch's bar, after the model's
#: summary and the dataset scan (tens of KiB); a bounded read whatever the child printed.
USED_READ_BYTES = 4 << 20


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


def on_the_cpu(argv: Sequence[str], gpu_visible: Callable[[], bool] = gpus.visible) -> bool:
    """Whether a ``yolo train`` command runs on a device Ultralytics gives no loader workers: the ``device=`` it names,
    else this machine's (the CPU when ``gpu_visible()`` says no GPU is there)."""
    device = recipes.pairs(argv).get("device")
    if device is None:
        return not gpu_visible()
    return device.strip().lower() in NO_WORKER_DEVICES


def rungs_for(argv: Sequence[str], gpu_visible: Callable[[], bool] = gpus.visible) -> List[Rung]:
    """The built-in rungs for ``argv`` (see the module docstring); none for a command trainbox does not know, and
    none for a ``yolo train`` on the CPU (``gpu_visible``: whether this machine shows a GPU)."""
    program = recipes.recognise(argv)
    if program is None or program.workers is None:
        return []
    given = _workers(argv, program)
    if given is None or given <= 0 or (program.workers == "workers" and on_the_cpu(argv, gpu_visible)):
        return []
    from trainbox.supervise.ladder.command import Rung  # pydantic: only for a command that gets rungs (cli's doc)

    rungs = [Rung(name=f"workers-{given}")]
    if given // 2 not in (0, given):
        rungs.append(Rung(name=f"workers-{given // 2}", args=_set(program, given // 2), expected_speed=HALF_SPEED))
    rungs.append(Rung(name="workers-0", args=_set(program, 0), expected_speed=NONE_SPEED))
    return rungs


def unapplied(outcome: Outcome) -> Optional[str]:
    """Why no worker rung changes anything for this run: its attempt's log (``Outcome.detail["log"]``) says it used no
    loader workers; None when it used some, or did not say."""
    log = outcome.detail.get("log")
    if not isinstance(log, str):
        return None
    files, name = files_of(log)
    said = USED_WORKERS.findall(files.read_bytes(name, USED_READ_BYTES).value or b"")
    if not said or any(int(count) for count in said):
        return None
    return 'the program used no loader workers whatever it was given ("Using 0 dataloader workers": Ultralytics on the CPU)'
