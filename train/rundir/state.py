"""``RUN_DIR/state.json``: where the supervisor is, the transitions it may take, and the one reader of the file.

The supervisor rewrites state.json at least once a second while it lives (``health`` holds it to that promise,
:mod:`trainbox.supervise.watchdog`). Its ``state`` is a :class:`State`; :data:`TRANSITIONS` is the state machine
the supervisor's record enforces, so a new ending or a new wait cannot quietly publish a state that ``health`` or
``status`` would misread. ``health``, ``status`` and the live view all read the file through :func:`read`, which
never raises: a missing, torn, refused (a FIFO, a link, a folder: :mod:`trainbox.rundir.safe`) or hand-edited
file is ``None`` and one line saying why; a usable one comes typed (:data:`STATE`, :mod:`trainbox.rundir.records`),
its fields of the wrong kind left out.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from trainbox.rundir.records import (
    BEAT,
    Schema,
    exit_code,
    files_of,
    flag,
    pid,
    read_record,
    seconds,
    table,
    text,
    texts,
    timestamp,
    whole,
)


class State(str, Enum):
    """Where the supervisor is. The transitions (:data:`TRANSITIONS`)::

    STARTING --first beat--> RUNNING --exit 0--> SUCCEEDED
    STARTING | RUNNING --exit != 0 (or the command cannot start)--> CRASHED
    STARTING | RUNNING --budget spent or idle---> STALLED  (incident written, tree killed; trainbox.supervise.stalls.silence)
    STARTING | RUNNING --the same, with --on-stall report--> unchanged (incident written once per silence)
    STALLED --the child exited 0 while its incident was written--> SUCCEEDED
    RUNNING --slow for --slow-restart-after s, suspect inside the run, --on-slow restart--> SLOW (tree ended)
    CRASHED | STALLED | SLOW --restarts left-----------> BACKOFF --delay--> STARTING (next attempt)
    RUNNING --a checkpoint, and the ladder probes another rung--> BACKOFF (tree ended; trainbox.supervise.ladder.run)
    CRASHED | STALLED | SLOW --restart budget spent, or the same stall again with nothing left to try--> GAVE_UP
    CRASHED | STALLED --2nd attempt in a row without a beat--> MISCONFIGURED
    STARTING --the supervisors before this one hung too often--> GAVE_UP

    The arrows out of CRASHED, STALLED and SLOW are :func:`trainbox.supervise.policy.decide`'s.
    STARTING | RUNNING --SIGTERM/SIGINT/SIGHUP to the supervisor--> STOPPING --tree gone--> STOPPED
    CRASHED | STALLED | SLOW | BACKOFF --the same signal--> STOPPED
    any --the run's history cannot be written-----> DISK_FULL
    any --events.jsonl is refused (a link, a FIFO: trainbox.rundir.safe)--> REFUSED
    any --a process survives SIGKILL--------------> STUCK
    """

    STARTING = "starting"
    RUNNING = "running"
    CRASHED = "crashed"
    STALLED = "stalled"
    SLOW = "slow"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    GAVE_UP = "gave_up"
    MISCONFIGURED = "misconfigured"
    STOPPING = "stopping"
    STOPPED = "stopped"
    DISK_FULL = "disk_full"
    REFUSED = "refused"
    STUCK = "stuck"


#: States in which ``python -m trainbox health`` reports healthy (while beats keep coming).
LIVE_STATES = (State.STARTING, State.RUNNING, State.BACKOFF)
#: States after which the supervisor only exits: ``health --act`` never ends it there.
FINAL_STATES = (
    State.SUCCEEDED,
    State.GAVE_UP,
    State.MISCONFIGURED,
    State.STOPPED,
    State.DISK_FULL,
    State.REFUSED,
    State.STUCK,
)
#: Reachable from any state: the history cannot be written (a full disk, a refused file), or a process outlived SIGKILL.
ANYWHERE: FrozenSet[State] = frozenset({State.DISK_FULL, State.REFUSED, State.STUCK})
#: Every other move the supervisor may make (the class docstring draws them). Staying in a state is always allowed.
TRANSITIONS: Mapping[State, FrozenSet[State]] = {
    State.STARTING: frozenset({State.RUNNING, State.CRASHED, State.STALLED, State.STOPPING, State.SUCCEEDED, State.GAVE_UP}),
    State.RUNNING: frozenset({State.CRASHED, State.STALLED, State.SLOW, State.STOPPING, State.SUCCEEDED, State.BACKOFF}),
    State.CRASHED: frozenset({State.BACKOFF, State.GAVE_UP, State.MISCONFIGURED, State.STOPPED}),
    State.STALLED: frozenset({State.BACKOFF, State.GAVE_UP, State.MISCONFIGURED, State.STOPPED, State.SUCCEEDED}),
    State.SLOW: frozenset({State.BACKOFF, State.GAVE_UP, State.STOPPED, State.SUCCEEDED}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED}),
    State.STOPPING: frozenset({State.STOPPED}),
    **{final: frozenset() for final in FINAL_STATES},
}


class InvalidTransition(RuntimeError):
    """A move the state machine does not have: a bug in the supervisor, never a user's doing."""


def check_transition(now: State, then: State) -> None:
    """Raise InvalidTransition unless the supervisor may go from ``now`` to ``then``."""
    if then is now or then in ANYWHERE or then in TRANSITIONS[now]:
        return
    raise InvalidTransition(f"the supervisor cannot go from {now.value} to {then.value}")


#: state.json is one small object (the last beat inside it included).
MAX_STATE_BYTES = 1 << 20

#: Every field the supervisor writes into state.json, with its kind (``health``, ``status`` and the live view read them).
STATE = Schema(
    {
        "state": text,
        "supervisor_pid": pid,
        "supervisor_started_ts": timestamp,
        "supervisor_start_ticks": whole,
        "boot_id": text,
        "session": whole,
        "command": text,
        "hung_after_s": seconds,
        "updated_ts": timestamp,
        "quiet_until_ts": timestamp,
        "attempt": whole,
        "profile": text,
        "child_pid": pid,
        "launched_ts": timestamp,
        "budget": Schema({"name": text, "seconds": seconds}),
        "silent_s": seconds,
        "last_progress_ts": timestamp,
        "heartbeat": BEAT,
        "progress_source": text,
        "learned": table(seconds),
        "next_attempt_ts": timestamp,
        "restarts": whole,
        "stalls": whole,
        "crashes": whole,
        "last_stall": Schema({"attempt": whole, "cause": text, "evidence": text}),
        # A busy silence allowed past its learned or declared budget (trainbox.supervise.stalls.silence): status shows it.
        "busy": Schema({"busy": flag, "guess": text, "signs": texts, "budget": text, "judged_at_s": seconds, "bound": text}),
        # The newest checkpoint the command wrote and what a restart resumed from (trainbox.supervise.resume.notes):
        # their paths are printed by status, so they are text (one line, no terminal controls) like every other.
        "checkpoint": Schema({"path": text, "mtime": timestamp, "step": whole}),
        "resumed": Schema(
            {
                "attempt": whole,
                "from": text,
                "step": whole,
                "why": text,
                "redone_steps": whole,
                "redone_unit": text,
                "written": Schema({"path": text, "mtime": timestamp}),
                "options": text,
            }
        ),
        "redone_steps": whole,
        "exit_code": exit_code,
    }
)


def read(path: Path) -> Tuple[Optional[Dict[str, Any]], str]:
    """state.json, typed, or None and one line saying why (not there yet, refused, unreadable, not an object)."""
    files, name = files_of(path)
    state, why = read_record(files, name, MAX_STATE_BYTES, STATE)
    if state is not None:
        return state, ""
    if why == "missing":
        return None, f"no supervisor state at {path} (not started yet?)"
    return None, f"unreadable supervisor state at {path} ({why})"


def state_of(record: Mapping[str, Any]) -> Optional[State]:
    """The ``state`` field of a state.json record as a State; None when it holds no known state."""
    try:
        return State(record.get("state"))
    except ValueError:
        return None
