"""A crash, named: the last exception line the child printed, and where the run was when it crashed.

A crash that repeats word for word (PyPI's torchvision beside a CPU torch: ``operator torchvision::nms does
not exist`` at the first validation) will repeat at every restart, and each restart only delays the message a
person needs: six tries and 87 s of back-off, and a give-up line that never quoted the error. So each crash is
named by two things, and :func:`trainbox.supervise.policy.decide` ends the run when two crashes in a row
have the same name:

* its **exception line**, :func:`exception_line`: the last line of the output that reads like the end of a
  traceback (``RuntimeError: ...``, ``torch.OutOfMemoryError: ...``, ``KeyError: 'x'``);
* its **place**, :func:`place`: where the last progress was (the heartbeat's or the counter's position, on
  that profile), or "before any progress" for an attempt that crashed before its first step.

A crash at another place (a resumed run that got further) or with another line (a flaky fault) is not a
repeat, and is retried as any crash. A crash without an exception line (a segfault, ``exit(1)``) has no
name and is never a repeat: only the restart budget ends it.

Under torchrun the last exception line is torchrun's own (``...errors.ChildFailedError:``), the same for every
crash of every rank: it is never a name (:data:`WRAPPERS`). The name is the failed rank's own exception, from
torchrun's error file (``@record``) or the rank's traceback in the output (:func:`trainbox.supervise.ranks.failure`),
else the last exception line above the wrapper's.

A crash whose line says it is **transient** (:func:`transient`: a connection reset or refused, a timeout, an HTTP
5xx: an upload or a download that failed for a few seconds) is named but never a repeat: the same upload failing at
the same step twice in a row is what a few seconds of network trouble look like, and the next try may well pass.
It is retried with a growing back-off, within ``--max-restarts`` (:func:`trainbox.supervise.policy.decide`).

Pure functions of the outcome, tested in milliseconds (``tests/supervise/test_crashes.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from trainbox.supervise import ranks
from trainbox.supervise.policy import Outcome, position

#: The last line of a Python traceback: an exception's (dotted) class name, a name that says it is one, and its
#: message (``RuntimeError: ...``, ``subprocess.CalledProcessError: ...``, ``KeyboardInterrupt``).
EXCEPTION = re.compile(
    r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure)(?::\s.*|:?)",
)
#: Exception classes that wrap the real error and so never name a crash: torchrun's, around the failed rank's.
WRAPPERS = re.compile(r"(?:[\w.]*\.)?ChildFailedError\b")
#: An error that says it may pass on its own: a connection that failed or timed out, errno's names for it, an HTTP
#: 5xx (``HTTPError: 503 Server Error``, ``HTTP Error 502``, ``status code 500``). Each alternative is bounded, so a
#: search costs linear time in the line.
TRANSIENT = re.compile(
    r"Connection\w{0,20}Error|TimeoutError|ECONNRESET|ECONNREFUSED|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH"
    r"|\b5\d\d Server Error\b|\bHTTP\w{0,20}\W{1,3}(?:Error\W{1,3}|status\W{1,3}|code\W{1,3}){0,2}5\d\d\b"
    r"|\bstatus(?:[ _]code)?\W{1,3}5\d\d\b",
    re.IGNORECASE,
)
#: An exception line is quoted at most this long (a message may hold a whole tensor).
MAX_LINE = 300
#: The place of a crash that came before the attempt's first step.
BEFORE_PROGRESS = "before any progress"


def exception_line(lines: Sequence[str]) -> Optional[str]:
    """The last line of ``lines`` (the output's last display lines) that ends a traceback, stripped; None."""
    for line in reversed(lines):
        found = line.strip()
        if EXCEPTION.fullmatch(found) and not WRAPPERS.match(found):
            return found[:MAX_LINE]
    return None


def transient(line: Optional[str]) -> bool:
    """Whether an exception line says the error may pass on its own (see :data:`TRANSIENT`)."""
    return bool(line) and TRANSIENT.search(line or "") is not None


def rank_exception(rank_failure: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The failed rank's own exception line, from what torchrun said of it (:func:`trainbox.supervise.ranks.failure`);
    None when it said nothing, or only named its wrapper."""
    error = (rank_failure or {}).get("error")
    if not isinstance(error, str):
        return None
    lines = error.splitlines()
    found = exception_line(lines) or next((line.strip()[:MAX_LINE] for line in lines if line.strip()), None)
    return None if found is None or WRAPPERS.match(found) else found


def place(outcome: Outcome, profile: Optional[str], printed: Optional[Mapping[str, Any]] = None) -> str:
    """Where the attempt was when it crashed: ``at`` the last counter its output showed (``printed``, read to the
    output's end), else at its last beat's position, or :data:`BEFORE_PROGRESS` (on ``profile``).

    The output comes first: under torchrun the ranks' last beats are passed over once their processes have ended
    (:mod:`trainbox.supervise.ranks`), and a beat read every half second is not the last one, where the output,
    read to its end, shows the very last counter."""
    beat = printed or (outcome.last_beat if outcome.first_step_ts is not None else None)
    where = position(beat, profile)
    return f"at {where}" if where else BEFORE_PROGRESS + (f", profile {profile}" if profile else "")


@dataclass(frozen=True)
class Output:
    """What a crashed attempt's output showed, read to its end: its ``tail`` (the last display lines, one a line)
    and the last counter it ``printed`` (a beat, None when it showed none)."""

    tail: str = ""
    printed: Optional[Mapping[str, Any]] = None


def named(
    outcome: Outcome,
    profile: Optional[str],
    log: Path,
    rank_failure: Optional[Mapping[str, Any]] = None,
    output: Optional[Output] = None,
) -> Dict[str, Any]:
    """What a crashed attempt's ``Outcome.detail`` gets: its ``exception`` line, whether that line is ``transient``,
    the place it crashed at (``crash_at``, :func:`place`) and the ``log`` that holds its output.

    The exception line is, first found: the failed rank's as torchrun's error file has it (``rank_failure``), the
    first rank traceback in the output (``[rank1]: OSError: ...``), the last exception line of the output that is
    no wrapper's (torchrun's summary of two failed ranks is longer than the last lines a crash event keeps)."""
    output = output or Output()
    traced = ranks.rank_traceback(output.tail)
    exception = (
        rank_exception(rank_failure)
        or rank_exception({"error": traced[1]} if traced else None)
        or exception_line(output.tail.splitlines() or outcome.detail.get("last_output") or [])
    )
    at = place(outcome, profile, output.printed)
    return {"exception": exception, "transient": transient(exception), "crash_at": at, "log": str(log)}
