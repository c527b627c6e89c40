"""The real Slurm cluster the end-to-end tests submit to (:mod:`tests.slurm.cluster`), started once per session.

Every test that uses ``slurm_cluster`` is marked ``slurm`` and runs in one xdist worker (tests/conftest.py): one
cluster, with its two one-CPU nodes, serves them one after another. Without the packages the fixture skips, which
the suite-wide rule turns into a failure under CI (``.ci/slurm-setup.sh`` installs them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.slurm.cluster import Cluster, missing, running


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    lacking = missing()
    if lacking:
        pytest.skip(f"no Slurm here ({', '.join(lacking)} missing): bash .ci/slurm-setup.sh installs it")
    # A short root: munged's socket path must fit a sockaddr_un (108 bytes).
    with running(Path(tmp_path_factory.mktemp("slurm", numbered=True))) as cluster:
        yield cluster
