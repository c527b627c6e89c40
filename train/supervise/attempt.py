"""One attempt: a child tree started on entering, ended on leaving, whatever happened in between.

Shaped after torchelastic's ``PContext``: ``with Attempt(...) as attempt:`` starts the command in a session of its
own (so its whole tree can be found and ended), tied to the supervisor's life (it dies with the supervisor,
:func:`trainbox.system.proctree.die_with_parent`, and so does all of its session, :mod:`trainbox.system.guard`),
with its output drained into the attempt's log (:class:`~trainbox.supervise.output.reader.OutputTee`) and its progress followed
(:class:`~trainbox.supervise.output.source.ProgressSource`: its beats per rank, else the counters its output
shows). Leaving the block ends the whole tree and reaps its root, so an exception in the loop (a full disk, a bug)
never leaves a training process behind.

The child's stdout and stderr are a pseudo-terminal of the supervisor's own window size
(:mod:`trainbox.supervise.output.terminal`), so it prints what its user would see: Python's ``print()`` is line-buffered
and tqdm, rich and Ultralytics draw their bars, which the output reader then reads. Where no terminal can be made
it gets a pipe, with ``PYTHONUNBUFFERED=1`` (set either way) so Python children still print each line as it comes.
stdin stays ``/dev/null``: a child that prompts reads EOF and fails at once instead of waiting for a person.
It starts with a scheduler's warning signal ignored (:data:`trainbox.interrupt.WARNING_SIGNAL`): that is its
supervisor's to act on, and Slurm sends it to every process of the job.

A process that outlives SIGKILL (D state in a hung driver) cannot be waited for: :meth:`Attempt.end_tree` raises
:class:`~trainbox.errors.Stuck` instead of hanging the supervisor, and a tree found stuck is not tried again on
the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import IO, Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from trainbox import heartbeat, interrupt
from trainbox.errors import Stuck, say
from trainbox.rundir.layout import RunDir
from trainbox.supervise import gpu_release, ranks
from trainbox.supervise.output import terminal
from trainbox.supervise.output.progress import PATTERNS, LinePattern, OutputProgress
from trainbox.supervise.output.reader import OutputTee
from trainbox.supervise.output.source import ProgressSource
from trainbox.supervise.planner import Launch
from trainbox.supervise.record import Record
from trainbox.supervise.stalls.budgets import BudgetPolicy
from trainbox.supervise.stalls.silence import Limits, SilenceWatch
from trainbox.system import guard, proctree

#: How long the killed child may take to be reaped once its whole tree is gone (normally microseconds;
#: longer means the kernel holds it, and waiting on would hang the supervisor).
REAP_S = 10.0
#: Seconds the SIGKILL rounds of ``ProcessTree.terminate`` may take after the grace (50 rounds, 0.05 s each, and scans).
KILL_S = 5.0
#: What ``end_tree`` returns when there was nothing to end.
NOTHING_ENDED: Dict[str, List[int]] = {"terminated": [], "killed": [], "survivors": [], "continued": []}


class CannotStart(Exception):
    """The command could not be started at all (not found, not executable): ``errno`` and ``strerror`` say why."""


def child_env(run_dir: RunDir, attempt: int, launch: Launch, environ: Mapping[str, str]) -> Dict[str, str]:
    """The child's environment: ours, the launch's, and the supervisor contract (heartbeat file, attempt, run dir)."""
    env = dict(ranks.TORCHRUN_DEFAULTS, **environ)
    env.update(launch.env)
    env.update(
        {
            heartbeat.HEARTBEAT_ENV: str(run_dir.heartbeat),
            heartbeat.ATTEMPT_ENV: str(attempt),
            heartbeat.RUN_DIR_ENV: str(run_dir.root),
            ranks.ERROR_FILE_ENV: str(run_dir.rank_error(attempt)),
            "TRAIN_STARTUP_TIMEOUT": str(launch.startup_timeout),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _preexec(arm: Callable[[], None]) -> Callable[[], None]:
    """``arm`` (the death signal), and the scheduler's warning ignored: it is the supervisor's (trainbox.interrupt)."""

    def preexec() -> None:
        signal.signal(interrupt.WARNING_SIGNAL, signal.SIG_IGN)
        arm()

    return preexec


def start(argv: Sequence[str], env: Mapping[str, str]) -> Tuple[subprocess.Popen, IO[bytes]]:
    """Start ``argv`` on a pseudo-terminal (else a pipe) in a session of its own; the process and its output.

    Raises OSError when the command cannot be started.
    """
    pair = terminal.open_pty(*terminal.window_size(sys.stdout))
    try:
        # Popen from the main thread: the child's death signal is tied to the thread that forked it.
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if pair is None else pair[1],
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_preexec(proctree.die_with_parent()),
        )
    except BaseException:
        for fd in pair or ():
            os.close(fd)
        raise
    if pair is None:
        assert proc.stdout is not None
        return proc, proc.stdout
    os.close(pair[1])  # else the master never reads EIO when the child's tree is gone
    return proc, os.fdopen(pair[0], "rb", buffering=0)


class Attempt:
    """One attempt in flight: what it was launched with and the handles to watch and end it.

    ``patterns``: the progress lines its output is read for (the user's ``--progress-pattern`` first);
    ``foreign_groups``: process groups of the supervisor's that are not the child's (the notifiers in flight).
    """

    def __init__(
        self,
        number: int,
        launch: Launch,
        policy: BudgetPolicy,
        record: Record,
        grace_s: float,
        echo: bool,
        patterns: Sequence[LinePattern] = PATTERNS,
        foreign_groups: Callable[[], FrozenSet[int]] = frozenset,
    ) -> None:
        self.number = number
        self.foreign_groups = foreign_groups
        self.launch = launch
        self.policy = policy
        self.record = record
        self.grace_s = grace_s
        self.echo = echo
        self.patterns = patterns
        self.run_dir = record.run_dir
        self.env = child_env(self.run_dir, number, launch, os.environ)
        self.ended = False

    def __enter__(self) -> Attempt:
        """Start the child; CannotStart when the command cannot run at all."""
        left = ranks.clear(self.run_dir)
        if left is not None:
            say(left)
        #: The GPUs' used memory before the child starts: what a gpu_wait retry waits to get back to in a container.
        self.gpu_before_mib = gpu_release.baseline()
        self.started = time.monotonic()
        guard.GUARD.start()  # before the child: the guard is never taken for an orphan of its tree
        try:
            self.proc, output = start(self.launch.argv, self.env)
        except OSError as exc:
            raise CannotStart(exc.strerror or str(exc)) from exc
        guard.GUARD.hold(self.proc.pid)  # its session: what it starts ends with the supervisor, however it dies
        counters = OutputProgress(self.patterns, floor_s=self.launch.stall_timeout)
        try:
            self.tee = OutputTee(output, self.run_dir.files, self.run_dir.attempt_log(self.number), self.echo, counters)
        except BaseException:
            output.close()
            self.proc.kill()  # no handle to watch or end it by: it must not run on alone
            self.proc.wait()
            raise
        self.tree = proctree.ProcessTree(self.proc.pid, self.foreign_groups)
        self.progress = ProgressSource(ranks.JobBeats(self.run_dir, self.policy, self.started), counters)
        self.watch = SilenceWatch(self.tree, self.env, Limits(self.launch.idle_timeout, self.launch.compile_cap))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if not self.ended:
                self.end_tree()
        finally:
            self.tee.close()

    def end_tree(self) -> Dict[str, List[int]]:
        """End the whole tree and reap its root; what ``ProcessTree.terminate`` returns.

        Raises Stuck when a process outlives SIGKILL or the root cannot be reaped within ``REAP_S``.
        """
        if self.ended:
            return NOTHING_ENDED
        result = NOTHING_ENDED
        with self.record.quiet(self.grace_s + KILL_S + REAP_S):
            try:
                if self.tree.alive():
                    result = self.tree.terminate(self.grace_s)
                if result["survivors"]:
                    raise proctree.stuck(result["survivors"])
                try:
                    self.proc.wait(timeout=REAP_S)
                except subprocess.TimeoutExpired:
                    raise proctree.stuck([self.proc.pid]) from None
                guard.GUARD.release(self.proc.pid)
            finally:
                self.ended = True  # found stuck or gone: nothing more can be done to it
        return result

    def exit_code(self) -> Optional[int]:
        """The child's exit status, None while it runs."""
        return self.proc.poll()


def stuck_result(error: Stuck) -> Dict[str, List[int]]:
    """What ``end_tree`` would have returned for a tree found stuck: every survivor was killed, and survived."""
    pids = [process["pid"] for process in error.processes]
    return {"terminated": [], "killed": pids, "survivors": pids, "continued": []}
