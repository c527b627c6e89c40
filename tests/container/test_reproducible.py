"""A reproducible build's context and times come from the commit, not from the checkout (real git, no engine)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from trainbox.container import reproducible
from trainbox.errors import UserError

COMMIT_DATE, COMMIT_EPOCH = "2026-01-02T03:04:05Z", 1767323045


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A commit with a Dockerfile, env/, train/ and a file the context leaves out; then a change not committed."""
    for name, text in {"Dockerfile.cpu": "FROM x\n", "env/a.env": "A=1\n", "train/m.py": "x = 1\n", "tests/t.py": ""}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": COMMIT_DATE, "GIT_COMMITTER_DATE": COMMIT_DATE}
    env.update({f"GIT_{who}_{what}": "t" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")})
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "c"]):
        subprocess.run(["git", *command], cwd=tmp_path, env=env, check=True)
    (tmp_path / "train" / "m.py").write_text("x = 2\n")
    os.chmod(tmp_path / "env" / "a.env", 0o664)  # a checkout's umask is not the image's
    return tmp_path


def test_the_context_is_the_commit_s_files_with_the_commit_s_time_and_fixed_modes(repository: Path) -> None:
    with reproducible.context(repository, "Dockerfile.cpu") as archive, tarfile.open(fileobj=archive) as tar:
        files = {member.name: member for member in tar if member.isfile()}
        assert sorted(files) == ["Dockerfile.cpu", "env/a.env", "train/m.py"]
        assert {member.mtime for member in files.values()} == {COMMIT_EPOCH}
        assert {member.mode for member in files.values()} == {0o644}
        assert tar.extractfile(files["train/m.py"]).read() == b"x = 1\n"  # type: ignore[union-attr]


def test_the_epoch_is_the_commit_s_time_and_uncommitted_changes_are_said(repository: Path) -> None:
    assert reproducible.source_date_epoch(repository) == COMMIT_EPOCH
    assert len(reproducible.head(repository)) == 40
    out = io.StringIO()
    reproducible.note_uncommitted(repository, "Dockerfile.cpu", out)
    assert out.getvalue() == "note: building the commit (HEAD); 1 uncommitted change(s) left out, e.g. train/m.py\n"


def test_outside_a_git_checkout_it_says_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^a reproducible build needs the git checkout: git log -1 --format=%ct failed: "):
        reproducible.source_date_epoch(tmp_path)
