"""A resume the program refuses, in milliseconds: its usage error before any progress, naming the words it was given."""

from __future__ import annotations

from typing import Optional

import pytest

from trainbox.supervise.policy import Outcome, OutcomeKind
from trainbox.supervise.resume.refusal import refused

GIVEN = ["--resume_from_checkpoint", "/w/out/checkpoint-10"]
USAGE = "usage: t.py [-h] [--output_dir OUTPUT_DIR]"


def ended(code: Optional[int], *output: str, beats: int = 0, kind: OutcomeKind = OutcomeKind.EXITED) -> Outcome:
    return Outcome(kind, code=code, beats=beats, detail={"last_output": list(output)})


@pytest.mark.parametrize(
    "outcome, words",
    [
        (ended(2, USAGE, "t.py: error: unrecognized arguments: --resume_from_checkpoint /w/out/checkpoint-10"), GIVEN[0]),
        (ended(2, "t.py: error: unrecognized arguments: --lr 3 --resume_from_checkpoint=/x"), GIVEN[0]),
        (ended(2, "t.py: error: unrecognized arguments: --lr 3"), None),  # the user's own word
        (ended(2, "t.py: error: the following arguments are required: --data"), None),
        (ended(1, "t.py: error: unrecognized arguments: --resume_from_checkpoint x"), None),  # not a usage error
        (ended(2, "error: unrecognized arguments: --resume_from_checkpoint x", beats=1), None),  # it had begun
        (ended(None, "error: unrecognized arguments: --resume_from_checkpoint x", kind=OutcomeKind.STALLED), None),
        (ended(2), None),
    ],
)
def test_only_a_usage_error_that_names_the_words_given_is_a_refusal(outcome: Outcome, words: Optional[str]) -> None:
    assert refused(outcome, GIVEN) == words


def test_nothing_given_nothing_refused() -> None:
    assert refused(ended(2, "x: error: unrecognized arguments: --resume_from_checkpoint y"), []) is None
    assert refused(ended(2, "x: error: unrecognized arguments: --init_from=resume"), ["--init_from=resume"]) == (
        "--init_from=resume"
    )
