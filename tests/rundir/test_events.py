"""events.jsonl: the documented table of events (docs/contract.md) and ``trainbox.rundir.events.EVENTS`` name the same events."""

from __future__ import annotations

import re

from tests.supervised import REPO
from trainbox.rundir.events import EVENTS, device_fields


def test_the_docs_document_every_event_and_no_other() -> None:
    text = (REPO / "docs" / "contract.md").read_text()
    table = text.split("**`events.jsonl`**", 1)[1].split("\n\n")[1]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert sorted(documented) == sorted(EVENTS)


def test_a_device_event_takes_the_beats_device_object_without_the_records_own_fields() -> None:
    beat = {"phase": "setup", "device": {"kind": "cuda", "amp": True, "ts": 1, "event": "x", "attempt": 9}}
    assert device_fields(beat) == {"kind": "cuda", "amp": True}
    assert device_fields({"phase": "train", "device": "cuda"}) is None
    assert device_fields(None) is None
