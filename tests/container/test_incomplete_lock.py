"""`docker compose build` goes around `invoke build`'s lock check, so the Dockerfiles refuse an incomplete lock
themselves: with a `# MISSING` line the build stops at the step right after the lock is copied in, with the
same one line as :func:`locks.check`, before pip runs. On the real Docker Engine, in a copy of the build context
whose CPU lock lost torch's hashes (the checkout and the shared trainbox:cpu image are left alone)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict

import pytest

from tests.container.conftest import build_context
from trainbox.container import dotenv, locks
from trainbox.errors import UserError

#: Tag for the copy's image, so that a build that wrongly succeeded could not replace the shared trainbox:cpu.
TEST_TAG = "trainbox:incomplete-lock-test"


def copy_context(target: Path) -> Path:
    build_context(target)
    compose_file = target / "compose.yaml"
    text = compose_file.read_text()
    assert text.count("image: trainbox:cpu\n") == 1
    compose_file.write_text(text.replace("image: trainbox:cpu\n", f"image: {TEST_TAG}\n"))
    return target


def drop_torch_hashes(lock: Path) -> None:
    """torch's requirement and hashes become the `# MISSING` line `invoke lock` writes for an unreachable index."""
    text = lock.read_text()
    broken, count = re.subn(
        r"^torch==(\S+) \\\n(?:    --hash=sha256:\w+(?: \\\n|\n))+",
        r"# MISSING torch==\1: https://pypi.org/simple/torch/ unreachable ([Errno -2] Name or service not known)\n",
        text,
        flags=re.M,
    )
    assert count == 1, "cpu.lock has no torch requirement to break"
    lock.write_text(broken)


def test_compose_build_refuses_an_incomplete_lock_at_its_first_step(
    tmp_path: Path, session_env: Dict[str, str], docker_api
) -> None:
    context = copy_context(tmp_path)
    requirements = context / "env" / "requirements"
    drop_torch_hashes(locks.lock_path("cpu", requirements))
    with pytest.raises(UserError) as refused:
        locks.check("cpu", requirements)
    expected = str(refused.value).replace(f"{requirements}/", "env/requirements/")
    assert expected == (
        "env/requirements/cpu.lock has no hash for torch==1.13.1:"
        " run `invoke lock --flavor cpu` on a machine that reaches the index"
    )
    dotenv.write(context, dotenv.settings("cpu"))
    try:
        result = subprocess.run(
            ["docker", "compose", "build", "cpu"], cwd=context, env=session_env, capture_output=True, text=True, timeout=600
        )
    finally:
        if docker_api.images(name=TEST_TAG):
            docker_api.remove_image(TEST_TAG, force=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    # BuildKit's progress: "#9 [cpu  5/11] RUN ..." starts step 5, "#9 0.172 TEXT" is what it printed.
    copy_step = re.search(r"^#\d+ \[cpu\s+(\d+)/\d+\] COPY env/requirements/cpu\.lock ", output, re.M)
    check_step = re.search(r"^#(\d+) \[cpu\s+(\d+)/\d+\] RUN lock=", output, re.M)
    assert copy_step and check_step, output[-3000:]
    assert int(check_step.group(2)) == int(copy_step.group(1)) + 1
    assert re.findall(rf"^#{check_step.group(1)} \d+\.\d+ (.*)$", output, re.M) == [expected], output[-3000:]
    assert not re.search(rf"\[cpu\s+{int(check_step.group(2)) + 1}/", output), "a step after the check ran"
