"""Slurm's warning before the time limit: stop at the next checkpoint, say where the run is, exit for a requeue.

``sbatch --signal=USR2@120`` has Slurm send SIGUSR2 to every process of the job's steps 120 s before the time limit
(:data:`trainbox.interrupt.WARNING_SIGNAL`; SIGUSR1 is taken: on it a supervisor dumps its own stacks for ``health``,
and a program's ``beat()`` its stacks). The supervisor's child starts with that signal ignored
(:mod:`trainbox.supervise.attempt`), so a rank that has no handler of its own is not killed by it; one that has
(Lightning's Slurm requeue) still gets it.

On the warning, :class:`Warning` asks the program for a checkpoint (``checkpoint.request``, which a program that
checkpoints on request answers at its next step: :func:`trainbox.heartbeat.checkpoint_requested`) and watches, on a
thread of its own, for a checkpoint written since the warning by any node of the job (the job has one checkpoint,
and a rank off node 0 never writes it): a beat's ``checkpoint_ts``, or the newest checkpoint the supervisor found,
in any node's ``state.json``. Then, or after :data:`WAIT_S` without one, it stops its own supervisor as SIGTERM
does: the tree is ended with its grace, the stop line says where the run is and how it goes on. The status is then
:attr:`~trainbox.errors.ExitCode.INTERRUPTED` instead of 143, which the sbatch script turns into ``scontrol requeue``;
the requeued job finds the same run directory (:mod:`trainbox.slurm.env`) and the program its own newest checkpoint.
The supervisor itself knows none of this: the CLI installs the handler and maps the status.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from typing import Any, Iterable, Mapping, Optional

from trainbox.errors import ExitCode, say
from trainbox.interrupt import WARNING_SIGNAL
from trainbox.rundir import state as run_state
from trainbox.rundir.layout import JobDir, RunDir

#: How long after the warning the supervisor waits for a checkpoint before it stops anyway: with the documented
#: ``--signal=USR2@120`` and the default 30 s grace, the tree is gone well before the time limit.
WAIT_S = 60.0
#: How often the watcher reads the nodes' state.json (one small file per node).
POLL_S = 1.0


def _time(value: Any) -> Optional[float]:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return float(number) if number is not None and math.isfinite(number) else None


def saved_since(state: Any, warned_at: float) -> bool:
    """Whether a node's state.json (as read, untrusted) tells of a checkpoint written after ``warned_at`` (unix time):
    its heartbeat's ``checkpoint_ts``, or the newest checkpoint file's ``mtime``."""
    if not isinstance(state, Mapping):
        return False
    beat, newest = state.get("heartbeat"), state.get("checkpoint")
    stamps = (
        _time(beat.get("checkpoint_ts")) if isinstance(beat, Mapping) else None,
        _time(newest.get("mtime")) if isinstance(newest, Mapping) else None,
    )
    return any(stamp is not None and stamp > warned_at for stamp in stamps)


class Warning:
    """The warning's handler for one node's supervisor; :meth:`install` it, then :meth:`status` maps the exit code."""

    def __init__(self, run: RunDir, job: JobDir, wait_s: float = WAIT_S) -> None:
        self.run, self.job, self.wait_s = run, job, wait_s
        #: When the warning came (unix time); None before.
        self.warned_at: Optional[float] = None

    def install(self) -> None:
        signal.signal(WARNING_SIGNAL, self._on_warning)

    def _on_warning(self, _signum: int, _frame: Any) -> None:
        if self.warned_at is not None:
            return
        self.warned_at = time.time()
        threading.Thread(target=self._stop_at_checkpoint, name="slurm-warning", daemon=True).start()

    def _states(self) -> Iterable[Any]:
        for node in self.job.nodes():
            yield run_state.read(RunDir(self.job.node(node)).state)[0]

    def _stop_at_checkpoint(self) -> None:
        assert self.warned_at is not None
        say(f"Slurm's warning ({WARNING_SIGNAL.name}): asking for a checkpoint, stopping at the next (within {self.wait_s:g} s)")
        try:
            request = json.dumps({"ts": self.warned_at, "why": "slurm warning"}).encode()
            self.run.files.replace(self.run.checkpoint_request, request)
        except OSError:
            pass  # a full disk: the program's own next checkpoint is waited for all the same
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline and not any(saved_since(s, self.warned_at) for s in self._states()):
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's own stop: grace, the stop line, the exit event

    def status(self, code: int) -> int:
        """The exit status: :attr:`ExitCode.INTERRUPTED` for the stop the warning made, else ``code`` unchanged."""
        stopped = code == ExitCode.for_signal(signal.SIGTERM)
        if self.warned_at is not None and stopped:
            say(
                f"stopped on Slurm's warning: exit {int(ExitCode.INTERRUPTED)}, the job goes on from its checkpoint when requeued"
            )
            return int(ExitCode.INTERRUPTED)
        return code
