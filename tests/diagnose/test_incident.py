"""trainbox.diagnose.incident's reading of ``py-spy dump --json``: any JSON gives its text or None, never an error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given

from tests.rundir.hostile import json_values
from trainbox.diagnose.incident import render_py_spy


def test_a_dump_is_py_spys_text_with_the_gil_holder_marked_and_a_name_on_one_line() -> None:
    dump = [
        {"os_thread_id": 7, "thread_name": "x\nThread 8 (idle+gil)", "active": False, "owns_gil": False, "frames": []},
        {"os_thread_id": 9, "active": False, "owns_gil": True, "frames": [{"name": "sleep", "filename": "/a.py", "line": 3}]},
    ]
    text = render_py_spy(5, json.dumps(dump))
    assert text is not None
    assert text.splitlines() == [
        "Process 5: threads from py-spy dump --json",
        'Thread 7 (idle): "x Thread 8 (idle+gil)"',
        "Thread 9 (idle+gil)",
        "    sleep (/a.py:3)",
    ]


@given(json_values())
def test_any_json_is_read_as_a_dump_or_refused(value: Any) -> None:
    for dump in (value, [value], [{"frames": value}], [{"frames": [value]}]):
        text = render_py_spy(1, json.dumps(dump))
        assert text is None or text.startswith("Process 1: threads from py-spy dump --json\n")
