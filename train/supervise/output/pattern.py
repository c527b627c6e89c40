"""A person's own progress line (``--progress-pattern REGEX``): the groups it may name, and why a pattern is refused.

A leaf: it imports nothing of the supervisor, so the settings table checks the flag without importing the output
reader (:mod:`trainbox.supervise.output.progress` reads lines with the pattern once it is accepted).
"""

from __future__ import annotations

import re
from typing import Optional

#: The named groups a ``--progress-pattern`` may use; one of the first three is required.
COUNTER_GROUPS = ("step", "batch", "epoch")
USER_GROUPS = COUNTER_GROUPS + ("total", "phase")


#: The option that adds a user's pattern (its Setting is in :mod:`trainbox.supervise.settings`, named by this).
PATTERN_FLAG = "--progress-pattern"


def pattern_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be a ``--progress-pattern`` (one phrase, starting with the pattern), None when it can:
    named groups ``step``, ``batch`` or ``epoch`` (optional ``total``, ``phase``), nothing else, and a regex that
    cannot match an empty line."""
    try:
        regex = re.compile(text)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"{text!r}: not a regular expression ({exc})"
    unknown = sorted(set(regex.groupindex) - set(USER_GROUPS))
    if unknown:
        return f"{text!r}: unknown group {unknown[0]!r} (the names are {', '.join(USER_GROUPS)})"
    if not set(regex.groupindex) & set(COUNTER_GROUPS):
        example = "(?P<step>\\d+), (?P<batch>\\d+) or (?P<epoch>\\d+)"
        return f"{text!r}: no counter in it; name one, e.g. {example}"
    if regex.search("") is not None:
        return f"{text!r}: it matches an empty line, so it cannot tell a counter from any output"
    return None
