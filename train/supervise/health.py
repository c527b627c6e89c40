"""``python -m trainbox health [--act]``: is the supervised run alive and making progress? And who watches the supervisor.

Reads ``RUN_DIR/state.json``, which the supervisor rewrites every second while
it watches a child. Healthy means: the supervisor is alive, keeps its promise
to update the file (:mod:`trainbox.supervise.watchdog`), and the child has been silent
for less than its current budget. Without ``--act`` it only reads.

The supervisor is **hung** when it has broken that promise: state.json not
updated for ``hung_after_s`` (``--hung-after``, default 60 s) after its last
update or after the end of the work it declared (``quiet_until_ts``), while
the process that wrote it is still there and the run is not over (:func:`hung`,
a pure function of the file, the clock and whether the process under the pid is
still the supervisor: its start ticks and boot, :func:`trainbox.supervise.watchdog.same_process`).

``--act`` (the containers' HEALTHCHECK runs it every 30 s) ends a hung
supervisor, the systemd ``WatchdogSec=`` pattern carried out by the health
check (:func:`end`): it notes what the kernel says the supervisor is doing
(state letter, ``wchan``); sends SIGUSR1, on which the supervisor registered
faulthandler, and SIGCONT (a stopped process runs a handler only once
continued), and waits for the dump; writes ``incidents/<session>-supervisor.txt``
and a ``supervisor_hung`` event; then SIGKILL. The trainer dies with it
(``PR_SET_PDEATHSIG``). In a container the supervisor is tini's only child, so
the container exits 137 and Docker's ``restart: on-failure:3`` starts it
again; the new supervisor resumes from ``last.pt``. A hang is thus ended
within ``hung_after_s`` plus one health interval.

A hung supervisor cannot tell anyone, so ``health --act`` sends the ``supervisor_hung`` notification itself,
with its own ``--notify``/``--notify-on`` (or ``$TRAINBOX_NOTIFY``/``$TRAINBOX_NOTIFY_ON``, which compose
gives the container's health check): never a command read from the run directory, which anything in the run
may have written. It waits for the notifier (:data:`trainbox.supervise.notify.notifier.CLOSE_S` at most) *before* the
SIGKILL, because in a container that kill ends the health check too; that keeps the whole act within the
health check's 20 s timeout (a test adds the bounds up).

state.json comes typed (:func:`trainbox.rundir.state.read`), and everything this
module reads or writes in the run directory goes through :mod:`trainbox.rundir.safe`:
a stack dump that is a FIFO or a link is no dump, a report that cannot be written
is none (the kill matters more).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

import psutil

from trainbox.diagnose.incident import FAULTHANDLER_WAIT_S, read_new_dump
from trainbox.heartbeat import STACK_DUMP_SIGNAL
from trainbox.rundir import state as state_file
from trainbox.rundir.layout import RunDir
from trainbox.rundir.state import FINAL_STATES, LIVE_STATES, State, state_of
from trainbox.supervise import watchdog
from trainbox.supervise.notify import notifier
from trainbox.supervise.record import Record
from trainbox.supervise.settings import HUNG_AFTER
from trainbox.supervise.stalls.budgets import rounded_up
from trainbox.system import proctree


@dataclass(frozen=True)
class Hang:
    """A supervisor that broke its promise to update state.json: the evidence ``end`` acts on."""

    pid: int
    session: int
    attempt: int
    state: str
    #: Seconds since state.json was last written, and the bound it broke.
    age_s: float
    hung_after_s: float
    quiet_until_ts: Optional[float]


def hung(state: Mapping[str, Any], now: float, same_process: bool) -> Optional[Hang]:
    """The hang to act on, or None. ``same_process``: the process under the state's pid is the supervisor that
    wrote it (:func:`trainbox.supervise.watchdog.same_process`; False when there is none).

    Pure: tests call it with a dictionary and a clock. ``state`` is typed (:data:`trainbox.rundir.state.STATE`).
    """
    phase = state_of(state)
    if phase is None or phase in FINAL_STATES:
        return None  # the run is over (a supervisor slow to exit watches nothing), or the state is not one we know
    if not same_process or state.get("supervisor_pid") is None:
        return None  # gone, or the pid belongs to another process now (a new supervisor after a restart)
    if not _promise_broken(state, now):
        return None
    updated = state.get("updated_ts") or 0.0
    return Hang(
        pid=state["supervisor_pid"],
        session=state.get("session") or int(time.strftime("%Y%m%d%H%M%S", time.gmtime(updated))),
        attempt=state.get("attempt") or 0,
        state=phase.value,
        # Rounded up: a hang found 10.04 s after the update under a 10 s bound is 10.1 s old, never "10.0 > 10".
        age_s=rounded_up(now - updated, 1),
        hung_after_s=_bound(state),
        quiet_until_ts=state.get("quiet_until_ts"),
    )


def _bound(state: Mapping[str, Any]) -> float:
    """The supervisor's promise: state.json rewritten at least this often (a state without one: the default)."""
    return state.get("hung_after_s") or float(HUNG_AFTER.default)


def _promise_broken(state: Mapping[str, Any], now: float) -> bool:
    """Past ``hung_after_s`` since the last update, or since the end of the work declared (``quiet_until_ts``)."""
    return now > max(state.get("updated_ts") or 0.0, state.get("quiet_until_ts") or 0.0) + _bound(state)


@dataclass(frozen=True)
class Notify:
    """Whom ``health --act`` tells of a hang: ``--notify``'s words (none: nobody) and ``--notify-on``'s events."""

    command: Sequence[str] = ()
    events: FrozenSet[str] = notifier.DEFAULT_EVENTS


def check(run_dir: Path, now: float = 0.0, act: bool = False, tell: Notify = Notify()) -> Tuple[bool, str]:
    """(healthy, one line saying why). A state.json that is not the supervisor's (hand-edited) is unhealthy.

    With ``act``, a hung supervisor is ended (:func:`end`, telling ``tell``) and the line says so.
    """
    now = now or time.time()
    run = RunDir(Path(run_dir))
    state, why = state_file.read(run.state)
    if state is None:
        return False, why
    if act:
        pid = state.get("supervisor_pid")
        hang = hung(state, now, pid is not None and watchdog.same_process(state, pid))
        if hang is not None:
            return False, end(run, hang, tell)
    return _judge(state, now)


def _judge(state: Dict[str, Any], now: float) -> Tuple[bool, str]:
    phase = state_of(state)
    if phase is None:
        return False, f"supervisor state {state.get('state')!r} is not one trainbox writes"
    if phase is State.SUCCEEDED:
        return True, "training completed"
    if phase not in LIVE_STATES:
        return False, f"supervisor is {phase.value}"
    pid = state.get("supervisor_pid")
    if pid is None or not psutil.pid_exists(pid):
        return False, "supervisor process is gone"
    age = now - (state.get("updated_ts") or 0.0)
    if _promise_broken(state, now):
        return False, f"supervisor state not updated for {age:.0f} s (promised every {_bound(state):.0f} s): hung"
    if phase is State.BACKOFF:
        wait = max(0.0, (state.get("next_attempt_ts") or now) - now)
        return True, f"backoff, attempt {state.get('attempt') or 0} starts in {wait:.0f} s"
    budget = state.get("budget") or {}
    silent = (state.get("silent_s") or 0.0) + age
    limit = budget.get("seconds") or 0.0
    if limit and silent > limit:
        return False, f"silent {silent:.0f} s > {budget.get('name')} budget {limit:.0f} s"
    beat = state.get("heartbeat") or {}
    where = ", ".join(f"{k} {beat[k]}" for k in ("phase", "epoch", "batch") if beat.get(k) is not None)
    return True, f"{phase.value}, attempt {state.get('attempt') or 0}" + (f", {where}" if where else "") + (
        f", silent {silent:.0f}/{limit:.0f} s" if limit else ""
    )


def _stack_dump(run: RunDir, pid: int) -> Tuple[str, str]:
    """(the supervisor's Python stacks, how they were obtained): SIGUSR1 and SIGCONT, then its faulthandler file."""
    if not proctree.caught_signals(pid) & (1 << (STACK_DUMP_SIGNAL - 1)):
        return "", "no stack-dump handler registered (SIGUSR1 would kill it)"
    path = run.stack_dump(pid)
    before = run.files.stat(path).value
    offset = before.st_size if before is not None else 0
    try:
        os.kill(pid, STACK_DUMP_SIGNAL)
        os.kill(pid, signal.SIGCONT)  # a stopped (SIGSTOP, Ctrl-Z) process runs its handler only when continued
    except OSError as exc:
        return "", f"could not signal: {exc.strerror}"
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    while time.monotonic() < deadline:
        dump = read_new_dump(run.files, path, offset)
        if dump is not None:
            return dump, "faulthandler"
        time.sleep(0.05)
    return "", f"no faulthandler dump within {FAULTHANDLER_WAIT_S:.0f} s"


def end(run: RunDir, hang: Hang, tell: Notify = Notify()) -> str:
    """End a hung supervisor (see the module's docstring); return the one line that says what was done.

    Everything is written, and told, before the SIGKILL: in a container that kill ends this process too.
    """
    kernel = proctree.kernel_state(hang.pid)
    stacks, how = _stack_dump(run, hang.pid)
    report = run.supervisor_hang(hang.session)
    evidence = {
        "pid": hang.pid,
        "supervisor_state": hang.state,
        "age_s": hang.age_s,
        "hung_after_s": hang.hung_after_s,
        "quiet_until_ts": hang.quiet_until_ts,
        "proc_state": kernel["state"],
        "wchan": kernel["wchan"],
        "name": kernel["name"],
        "stacks": how,
    }
    header = "".join(f"{key}: {value}\n" for key, value in evidence.items())
    incident: Optional[str] = str(report)
    try:
        if run.files.replace(report, f"{header}\n{stacks or 'no stacks: ' + how}\n".encode(errors="replace")) is not None:
            incident = None  # refused (a link, a folder there): the kill matters more than the report
    except OSError:
        incident = None  # a full disk: the kill matters more than the report
    record = Record(run)
    told = notifier.attach(record, tell.command, tell.events, lambda: hang.attempt) if tell.command else None
    record.emit_best_effort("supervisor_hung", hang.attempt, incident=incident, **evidence)
    if told is not None:
        told.close(notifier.CLOSE_S)
    try:
        os.kill(hang.pid, signal.SIGKILL)
    except OSError as exc:
        return f"supervisor pid {hang.pid} hung (state not updated for {hang.age_s:.0f} s) but cannot be killed: {exc.strerror}"
    return (
        f"supervisor pid {hang.pid} hung (state {kernel['state']}, wchan {kernel['wchan']}; state.json not updated for "
        f"{hang.age_s:.1f} s > {hang.hung_after_s:g} s): killed; its stacks are in {incident or 'no report (disk full?)'}"
    )
