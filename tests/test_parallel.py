"""The parallel suite's one promise: tests in an xdist group share one worker (the Docker tests rely on it).

pytest-xdist's ``--dist loadgroup`` (pyproject.toml's addopts) groups tests by renaming their node ids to end in
``@<group>``; a pytest that stores node ids elsewhere makes the rename a silent no-op (pytest 9 with xdist 3.8 did),
and the Docker tests then run in every worker at once, rebuilding the same images and rewriting the same ``.env``.
"""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("docker")
def test_a_grouped_test_is_renamed_for_its_group(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        assert "@" not in request.node.nodeid, "without -n there are no groups"
        return
    assert request.node.nodeid.endswith("@docker"), (
        f"xdist did not group {request.node.nodeid}: the Docker tests would run in every worker (pytest version?)"
    )
