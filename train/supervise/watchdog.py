"""The supervisor's side of being watched: what it promises ``health``, how it dumps its stacks, when it gives up.

The supervisor watches the training child; ``python -m trainbox health --act``
watches the supervisor (:mod:`trainbox.supervise.health` judges and acts). The contract
between the two lives in ``state.json``:

* the supervisor rewrites it every second, and promises an update at least
  every ``--hung-after`` seconds (``hung_after_s``, default 60); before work
  that may block longer (ending a tree: the grace, the SIGKILLs, the reap;
  writing an incident report: py-spy, the GPU tools) it declares when that
  work ends at the latest (``quiet_until_ts``), and the promise runs from then;
* it names itself: ``supervisor_pid`` and ``supervisor_started_ts`` (the
  process's start time), so that the health check never acts on a pid that
  now belongs to another process (after a container restart the new
  supervisor gets the same pid, and the old state.json is still there);
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
from typing import IO, Any, Dict, Iterable, Optional

import psutil

from trainbox.heartbeat import STACK_DUMP_SIGNAL
from trainbox.rundir.layout import RunDir

#: Hangs in a row after which the next supervisor of the run gives up instead of training (see above).
MAX_HANGS = 2


def identity(session: int, hung_after_s: float) -> Dict[str, Any]:
    """What state.json says about the supervisor itself, for ``health`` (see the module's docstring)."""
    return {
        "session": session,
        "supervisor_started_ts": psutil.Process().create_time(),
        "hung_after_s": hung_after_s,
    }


def install_stack_dump(run: RunDir, pid: int) -> IO[str]:
    """Dump all threads' Python stacks to ``stacks/<pid>.txt`` on SIGUSR1; close the returned file to stop.

    faulthandler's handler is C code that runs even while Python is blocked in a
    ``wait()``; the file is opened now because the handler cannot open one.
    """
    run.stack_dump.directory.mkdir(parents=True, exist_ok=True)
    dump = open(run.stack_dump(pid), "w")  # noqa: SIM115 - the handler writes to it for the supervisor's life
    faulthandler.register(STACK_DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    return dump


def remove_stack_dump(dump: IO[str]) -> None:
    faulthandler.unregister(STACK_DUMP_SIGNAL)
    dump.close()


def hangs_in_a_row(events: Iterable[Dict[str, Any]]) -> int:
    """``supervisor_hung`` events since the last ``exit`` (a supervisor that ended by itself starts the count over)."""
    count = 0
    for record in events:
        if record.get("event") == "exit":
            count = 0
        elif record.get("event") == "supervisor_hung":
            count += 1
    return count


def started(pid: int) -> Optional[float]:
    """When process ``pid`` started (the clock of ``supervisor_started_ts``), or None when there is none."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None
