"""trainbox.atomic: new files respect the umask, secrets are 0600, a replaced file keeps its mode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainbox.atomic import write_text_atomic
from trainbox.container import dotenv

NEW_FILE = "import sys; from trainbox.atomic import write_text_atomic; write_text_atomic(sys.argv[1], 'x')"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_respect_the_umask(tmp_path: Path, umask: int, expected: int) -> None:
    target = tmp_path / "file"
    subprocess.run([sys.executable, "-c", NEW_FILE, str(target)], check=True, preexec_fn=lambda: os.umask(umask))
    assert mode(target) == expected


def test_a_replaced_file_keeps_its_mode_and_permissions_win(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("old")
    target.chmod(0o640)
    write_text_atomic(target, "new")
    assert mode(target) == 0o640 and target.read_text() == "new"
    write_text_atomic(target, "secret", permissions=0o600)
    assert mode(target) == 0o600


def test_dotenv_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("old=1\n")
    (tmp_path / ".env").chmod(0o644)  # as earlier versions wrote it
    values = {
        **dotenv.settings("cpu"),
        "TRAINBOX_DATA_HOST": str(tmp_path / "data"),
        "TRAINBOX_RUNS_HOST": str(tmp_path / "runs"),
    }
    path = dotenv.write(tmp_path, values)
    assert mode(path) == 0o600
