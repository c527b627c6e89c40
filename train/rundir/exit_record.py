"""A container's final outcome, kept from Docker's restart policy and recorded for ``invoke train``.

compose.yaml's ``restart: on-failure:3`` lets Docker start the container again
when the supervisor itself crashes (an uncaught exception, an OOM kill). Docker
restarts on *every* non-zero exit and cannot be told to leave some out, but a
run that completed, gave up after its restart budget, was given bad input or
is misconfigured ends the same way however often it is started
(:meth:`trainbox.errors.ExitCode.is_final`). So where the container sets
:data:`ENGINE_RESTARTS_ENV` (compose.yaml does, next to ``restart``), ``run``
and ``supervise`` report such an outcome to Docker as 0, say so in one line,
and record the real status in ``RUN_DIR/container-exit.json`` with the
container's hostname (its short ID); ``invoke train`` reads it back
(:func:`recorded`) and exits with the real status. A status that is not
final (a crash) reaches Docker unchanged and is restarted, at most 3 times.

The record is written and read through :mod:`trainbox.rundir.safe` and typed
(:data:`EXIT_RECORD`): a container cannot make ``invoke train`` follow a link or
read a FIFO there, and a record that says nothing usable is no record.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from trainbox.errors import ExitCode
from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import Schema, exit_code, read_record, text

ENGINE_RESTARTS_ENV = "TRAINBOX_ENGINE_RESTARTS_ON_FAILURE"
#: The commands whose outcome the container's restart policy is about (the image's ``train`` runs ``run``).
SUPERVISED_COMMANDS = ("run", "demo", "supervise")
#: The record is one small object.
MAX_RECORD_BYTES = 4096
EXIT_RECORD = Schema({"code": exit_code, "hostname": text}, required=frozenset({"code", "hostname"}))


def for_engine(command: Optional[str], code: int, run_dir: Path) -> int:
    """The status to exit with: ``code``, or 0 for a final outcome where the engine restarts on failure."""
    if os.environ.get(ENGINE_RESTARTS_ENV) != "1" or command not in SUPERVISED_COMMANDS or not ExitCode.is_final(code):
        return code
    run = RunDir(run_dir)
    record = run.container_exit
    line = json.dumps({"code": code, "hostname": socket.gethostname()}) + "\n"
    try:
        written = run.files.replace(record, line.encode()) is None
    except OSError:
        written = False  # a full disk
    if not written:
        return code  # unrecorded, a status can only be told to Docker as it is
    if code == ExitCode.OK:
        return code
    sys.stderr.write(
        f"trainbox: exit status {code} is final: reported to Docker as 0 so that its restart policy does not start"
        f" the run again ({record} keeps {code})\n"
    )
    return int(ExitCode.OK)


def recorded(run_dir: Path, hostname: str) -> Optional[int]:
    """The status recorded by the container with ``hostname`` in ``run_dir``, if it recorded one."""
    run = RunDir(run_dir)
    record, _ = read_record(run.files, run.container_exit, MAX_RECORD_BYTES, EXIT_RECORD)
    return int(record["code"]) if record is not None and record["hostname"] == hostname else None
