"""Suite-wide rules: the test layers, and in CI a test that cannot run fails loudly instead of skipping.

Layers (markers registered in pyproject.toml):

* ``docker``: needs the Docker Engine (every test that uses the ``docker_api``, ``engine1`` or ``engine2``
  fixture, marked here);
* ``training``: trains for real, Ultralytics or torch (tests that use the ``demo_data`` fixture, marked
  here, and tests marked by hand);
* ``slurm``: needs a real Slurm cluster on this machine (every test that uses ``slurm_cluster``, marked here);
* ``slow``: over about a minute on 2 cores without being either of the above.

``python -m pytest -n 4 -m "not docker and not training"`` is the inner loop; CI runs everything, in parallel
(``-n 4``) with the Docker tests kept in two workers: those that build images of their own, and the rest.
"""

from __future__ import annotations

import os
from typing import List

import pytest

from tests.hosts import h100_host, host_copy  # noqa: F401  (fixtures for every folder that reads recorded host trees)
from tests.supervised import end_started

#: The suite runs four workers on two cores, and each torch process a test starts has intra-op threads of its own. By
#: default libgomp's idle threads spin while they wait for work: oversubscribed, the spinning takes the cores the other
#: processes wait for. Measured on this 2-core machine, a 2-epoch Ultralytics run (``trainbox run --profile safe``)
#: beside three busy processes: 92 CPU-s and 96 s with the default, 18 CPU-s and 25 s with PASSIVE; on an idle machine
#: 18-20 s either way. Every process the tests start inherits it (the containers have their own environment).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: fixture -> the layer every test that uses it (directly or through another fixture) belongs to.
LAYER_OF_FIXTURE = {
    "docker_api": "docker",
    "engine1": "docker",
    "engine2": "docker",
    "demo_data": "training",
    "slurm_cluster": "slurm",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks it adds
def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    for item in items:
        for fixture, layer in LAYER_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, layer))
        if item.get_closest_marker("docker") and not item.get_closest_marker("xdist_group"):
            # Under pytest-xdist (-n), one worker runs them all, one after another: they share the engine's
            # images (a session fixture builds each once per worker) and the checkout's .env, which they rewrite.
            # Modules that share neither name a group of their own (tests/container/conftest.py: OWN_IMAGES).
            item.add_marker(pytest.mark.xdist_group("docker"))
        if item.get_closest_marker("slurm") and not item.get_closest_marker("xdist_group"):
            # One Slurm cluster (a session fixture, tests/slurm/conftest.py) on one worker: its two one-CPU nodes run
            # the jobs one after another.
            item.add_marker(pytest.mark.xdist_group("slurm"))
    # A group's tests run in collection order on its worker; a stable sort keeps that order otherwise.
    items.sort(key=lambda item: item.get_closest_marker("last_in_group") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run every test: {report.longrepr}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The supervisors tests started in the background end with the session, an interrupted one too (Ctrl-C): a
    module fixture's runs (tests/supervise/pace) would otherwise train on, re-parented to PID 1."""
    end_started()
