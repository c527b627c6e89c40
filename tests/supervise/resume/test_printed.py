"""The folders a run said it writes to, read back from its attempt logs, in milliseconds; any log fuzzed."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainbox.supervise.resume.printed import HEAD_BYTES, PrintedFolders
from trainbox.supervise.resume.recipes import YOLO_SAYS


def test_the_folders_the_attempts_named_at_their_start(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "attempt-0.log").write_text("engine/trainer: \x1b[1mtask=detect, save_dir=/w/runs/detect/exp, plots=False\n")
    (logs / "attempt-1.log").write_text("x" * HEAD_BYTES + "save_dir=/w/late, \n")  # past the head: not read
    (logs / "attempt-2.log").write_text("save_dir=/w/runs/detect/exp-3\n")
    (logs / "notes.log").write_text("save_dir=/w/other\n")  # no attempt's log
    printed = PrintedFolders(tmp_path)
    assert printed.found(YOLO_SAYS) == [Path("/w/runs/detect/exp"), Path("/w/runs/detect/exp-3")]
    (logs / "attempt-0.log").write_text("save_dir=/w/changed\n")  # a head once read is final: never read again
    assert printed.found(YOLO_SAYS) == [Path("/w/runs/detect/exp"), Path("/w/runs/detect/exp-3")]
    assert PrintedFolders(tmp_path / "none").found(YOLO_SAYS) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs=st.dictionaries(st.sampled_from(["attempt-0.log", "attempt-1.log", "attempt-x.log"]), st.binary(max_size=200)))
def test_any_log_gives_folders_or_none_never_an_error(tmp_path: Path, logs: dict) -> None:
    run = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
    (run / "logs").mkdir(parents=True)
    for name, data in logs.items():
        (run / "logs" / name).write_bytes(b"save_dir=" + data)
    found = PrintedFolders(run).found(re.compile(r"save_dir=([^,\n]+)"))
    assert all(isinstance(folder, Path) for folder in found)
