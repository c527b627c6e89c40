"""What a person can be told of, and how their notifier is named: the words ``--notify`` and ``--notify-on`` accept.

A leaf: it imports nothing of the supervisor, so the settings table can check these flags without importing the
notifier (:mod:`trainbox.supervise.notify.notifier`), which itself reads the settings.
"""

from __future__ import annotations

import shlex
from typing import FrozenSet, List

#: The events a person can be told of (``--notify-on``): stalls, restarts and giving up; a run gone slow and
#: back to its pace (issue 29); the supervisor's final ``exit``; a hung supervisor ended by ``health --act``.
NOTIFY_EVENTS = ("stall", "restart", "give_up", "slow", "recovered", "exit", "supervisor_hung")
#: The default: when a person is needed (the run gave up, or its supervisor hung) and when it is over.
DEFAULT_EVENTS: FrozenSet[str] = frozenset({"give_up", "exit", "supervisor_hung"})
#: The environment variable that names the event, for notifiers that do not parse JSON.
EVENT_ENV = "TRAINBOX_EVENT"
#: How long a notifier may run (issue 31): an HTTPS POST over a slow link or a hand-off to the local mail
#: transfer agent takes a second or two; ten is generous for that and still short against any budget.
LIMIT_S = 10.0


def parse_events(text: str) -> FrozenSet[str]:
    """``--notify-on give_up,exit``: the event names; ValueError (one phrase, for the flag's line) names an unknown one."""
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(NOTIFY_EVENTS))
    if unknown or not names:
        shown = f"unknown event {unknown[0]!r}" if unknown else "no event named"
        raise ValueError(f"{text!r}: {shown}; choose from {','.join(NOTIFY_EVENTS)}")
    return names


def parse_command(text: str) -> List[str]:
    """``--notify 'examples/notify/ntfy.sh my-topic'``: the command's words (no shell); ValueError if there are none."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc} (quote it as for a shell)") from None
    if not words:
        raise ValueError("needs a command, e.g. --notify 'examples/notify/ntfy.sh TOPIC'")
    return words
