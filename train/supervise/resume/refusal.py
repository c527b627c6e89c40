"""A resume the program refuses: its usage error, before its first progress, naming the words trainbox added.

Why it exists. trainbox adds resume words to a command it recognises (:mod:`trainbox.supervise.resume.recipes`) or
that the user configured (``--resume-args``). A script can look like a known program and still not take them: a
``Trainer`` script with its own argparse has ``--output_dir`` but no ``--resume_from_checkpoint``. It answers with
argparse's usage error and exit status 2 at once; given the same words again it refuses again, and two attempts in
a row without progress end the run as a configuration error, although the command as the user gave it runs fine.
So such a refusal withdraws the words: the next attempt runs the command as given, and the restart line says so.

What counts (:func:`refused`), all of it, so that a crash of the program's own is never read as one:

* the attempt was given resume words, and exited by itself with :data:`USAGE_EXIT` before any progress;
* its last output lines hold argparse's ``error: unrecognized arguments:`` naming at least one of those words.

Pure: tested in milliseconds.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from trainbox.supervise.policy import Outcome, OutcomeKind

#: argparse's exit status for a usage error (``parser.error``), as most command-line tools use it.
USAGE_EXIT = 2
#: argparse's line for words it does not know: ``prog: error: unrecognized arguments: --resume_from_checkpoint x``.
UNRECOGNIZED = re.compile(r"error: unrecognized arguments: (.*)")


def refused(outcome: Outcome, given: Sequence[str]) -> Optional[str]:
    """The words of ``given`` (the resume words the attempt was given) that the program refused, as one string;
    None when the attempt did not end by refusing them (see the module docstring)."""
    if not given or outcome.kind is not OutcomeKind.EXITED or outcome.code != USAGE_EXIT or outcome.beats:
        return None
    for line in reversed(outcome.detail.get("last_output") or []):
        found = UNRECOGNIZED.search(str(line))
        if found is None:
            continue
        unknown = {word.split("=", 1)[0] for word in found.group(1).split()}
        named = [word for word in given if word.startswith("-") and word.split("=", 1)[0] in unknown]
        return " ".join(named) if named else None
    return None
