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
name and is never a repeat: only the restart budget ends it. Pure functions of the outcome, tested in
milliseconds (``tests/supervise/test_crashes.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from trainbox.supervise.policy import Outcome, position

#: The last line of a Python traceback: an exception's (dotted) class name, a name that says it is one, and its
#: message (``RuntimeError: ...``, ``subprocess.CalledProcessError: ...``, ``KeyboardInterrupt``).
EXCEPTION = re.compile(
    r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure)(?::\s.*|:?)",
)
#: An exception line is quoted at most this long (a message may hold a whole tensor).
MAX_LINE = 300
#: The place of a crash that came before the attempt's first step.
BEFORE_PROGRESS = "before any progress"


def exception_line(lines: Sequence[str]) -> Optional[str]:
    """The last line of ``lines`` (the output's last display lines) that ends a traceback, stripped; None."""
    for line in reversed(lines):
        found = line.strip()
        if EXCEPTION.fullmatch(found):
            return found[:MAX_LINE]
    return None


def place(outcome: Outcome, profile: Optional[str]) -> str:
    """Where the attempt was when it crashed: ``at`` its last position, or :data:`BEFORE_PROGRESS` (on ``profile``)."""
    if outcome.first_step_ts is None:
        return BEFORE_PROGRESS + (f", profile {profile}" if profile else "")
    where = position(outcome.last_beat, profile)
    return f"at {where}" if where else BEFORE_PROGRESS


def named(outcome: Outcome, profile: Optional[str], log: Path) -> Dict[str, Any]:
    """What a crashed attempt's ``Outcome.detail`` gets: its ``exception`` line (when its output ended with one),
    the place it crashed at (``crash_at``) and the ``log`` that holds its output."""
    exception = exception_line(outcome.detail.get("last_output") or [])
    return {"exception": exception, "crash_at": place(outcome, profile), "log": str(log)}
