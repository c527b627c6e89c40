"""The supervisor's side of being watched: what it promises ``health``, how it dumps its stacks, when it gives up.

The supervisor watches the training child; ``python -m trainbox health --act``
watches the supervisor (:mod:`trainbox.supervise.health` judges and acts). The contract
between the two lives in ``state.json``:

* the supervisor rewrites it every second, and promises an update at least
  every ``--hung-after`` seconds (``hung_after_s``, default 60); before work
  that may block longer (ending a tree: the grace, the SIGKILLs, the reap;
  writing an incident report: py-spy, the GPU tools) it declares when that
  work ends at the latest (``quiet_until_ts``), and the promise runs from then;
* it names itself: ``supervisor_pid``, ``supervisor_start_ticks`` (its start
  in clock ticks after boot, field 22 of ``/proc/<pid>/stat``) and ``boot_id``
  (``/proc/sys/kernel/random/boot_id``), so that the health check never acts on
  a pid that now belongs to another process (after a container restart the new
  supervisor gets the same pid, and the old state.json is still there). The
  ticks do not move when the wall clock is stepped; a start time on the wall
  clock (psutil's ``create_time``) does, and after a 1 s NTP step a hung
  supervisor was no longer recognised and never ended (issue 33 item 12);
* it registers ``faulthandler`` on SIGUSR1 (:func:`install_stack_dump`), the
  signal every trainbox process answers with its Python stacks, so the
  process that ends a hung supervisor first gets its stacks.

Bounded: a supervisor that starts after :data:`MAX_HANGS` hangs in a row
(``supervisor_hung`` events since the run's last ``exit``) gives up at once with
``ExitCode.GAVE_UP``, a final status that Docker's restart policy does not
start again (:mod:`trainbox.rundir.exit_record`). With ``restart: on-failure:3`` the
third start gives up: two restarts after hangs, one left for a crash.
"""

from __future__ import annotations

import faulthandler
import os
import re
import stat
from typing import IO, Any, Dict, Iterable, Optional

from trainbox.errors import say
from trainbox.heartbeat import STACK_DUMP_SIGNAL, open_stack_file
from trainbox.rundir.layout import RunDir
from trainbox.system import proctree

#: A stack dump's name in ``stacks/`` (``<pid>.txt``): only such a file, and only when empty, is removed at the end.
_STACK_FILE = re.compile(r"[0-9]+\.txt")
_STACK_FOLDER = re.compile(r"stacks")
#: The most names of ``stacks/`` looked at when the run ends (one per process that ever beat: a few hundred).
MAX_STACK_FILES = 4096

#: Hangs in a row after which the next supervisor of the run gives up instead of training (see above).
MAX_HANGS = 2


def identity(session: int, hung_after_s: float) -> Dict[str, Any]:
    """What state.json says about the supervisor itself, for ``health`` (see the module's docstring)."""
    return {
        "session": session,
        "supervisor_start_ticks": proctree.start_ticks(os.getpid()),
        "boot_id": proctree.boot_id(),
        "hung_after_s": hung_after_s,
    }


def install_stack_dump(run: RunDir, pid: int) -> Optional[IO[str]]:
    """Dump all threads' Python stacks to ``stacks/<pid>.txt`` on SIGUSR1; close the returned file to stop.

    faulthandler's handler is C code that runs even while Python is blocked in a
    ``wait()``; the file is opened now because the handler cannot open one. A
    file that is refused (:func:`trainbox.heartbeat.open_stack_file`) registers nothing and is said in one line.
    """
    dump = open_stack_file(run, pid)
    if dump is None:
        say(f"{run.stack_dump(pid)} is refused (a link, a FIFO, a folder?): `health --act` will get no stacks of this supervisor")
        return None
    faulthandler.register(STACK_DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    return dump


def remove_stack_dump(run: RunDir, dump: Optional[IO[str]]) -> None:
    """Stop dumping, and leave no empty file behind: the stack dumps nobody asked for (this supervisor's, and those
    its children opened as they beat) are removed as the run ends, and ``stacks/`` with them when nothing is left."""
    if dump is not None:
        faulthandler.unregister(STACK_DUMP_SIGNAL)
        dump.close()
    folder = run.stack_dump.directory
    for name in run.files.list_dir(folder, MAX_STACK_FILES).value or []:
        found = run.files.stat(folder / name).value
        if _STACK_FILE.fullmatch(name) and found is not None and stat.S_ISREG(found.st_mode) and found.st_size == 0:
            run.files.remove(folder / name, _STACK_FILE)
    run.files.remove_folder(folder, _STACK_FOLDER)  # refused (and kept) while something is in it


def hangs_in_a_row(events: Iterable[Dict[str, Any]]) -> int:
    """``supervisor_hung`` events since the last ``exit`` (a supervisor that ended by itself starts the count over)."""
    count = 0
    for record in events:
        if record.get("event") == "exit":
            count = 0
        elif record.get("event") == "supervisor_hung":
            count += 1
    return count


def same_process(state: Dict[str, Any], pid: int) -> bool:
    """Whether process ``pid`` is the supervisor that wrote ``state``: the same start ticks in the same boot.

    A state.json without them (hand-edited, or from a trainbox that wrote a wall-clock start) names no process:
    never acted on.
    """
    ticks, boot = state.get("supervisor_start_ticks"), state.get("boot_id")
    return ticks is not None and boot is not None and proctree.start_ticks(pid) == ticks and proctree.boot_id() == boot
