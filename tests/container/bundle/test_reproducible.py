"""The CPU image's Python environment is compiled so that a rebuild gives the same bytes.

Two whole builds of the CPU image with empty caches, on two engines, give one image ID: that is measured in
``bench/rebuild_cpu.py`` (two full builds of the 4 GB image are half an hour of CI's two cores), and CI builds a
small image with the same recipe twice (``test_rebuild.py``). Here the image the suite builds anyway (its layers
come from the docker group's build of the same inputs) is checked for what the recipe promises of its bytecode.

What makes the bytecode reproducible: pip installs with ``--no-compile``, then ``compileall
--invalidation-mode unchecked-hash`` writes every .pyc once with the source's
hash instead of its mtime in the header, under ``PYTHONHASHSEED=0`` (frozenset
constants are marshalled in set order, which follows the string hash seed)
and in one process (``-j1``: marshal's back-reference flags depend on the
refcounts left by what the process compiled before, so worker scheduling
changes a few files). ``PYTHONDONTWRITEBYTECODE=1`` keeps anything from
writing timestamped .pyc later. Imports stay as fast as with pip's own .pyc.
"""

from __future__ import annotations

import sys
from typing import Iterator

import docker
import pytest

from tests.container.bundle.conftest import ROOT, build_environment
from tests.container.conftest import OWN_IMAGES
from trainbox.container import compose, dotenv

#: Last in its group: by then the docker group has built trainbox:cpu from the same inputs, and this build takes its
#: layers from that build instead of being a full build of its own beside it (about 7 minutes of CI's two cores).
pytestmark = [OWN_IMAGES, pytest.mark.last_in_group]

TAG = ("trainbox-repro", "cached")
#: Prints "<.py count> <.pyc count> <.pyc that are not unchecked-hash>" for site-packages.
PYC_FLAGS = r"""
import pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
pyc = list(site.rglob("*.pyc"))
other = [p for p in pyc if int.from_bytes(p.read_bytes()[4:8], "little") != 0b01]
print(len(list(site.rglob("*.py"))), len(pyc), len(other))
"""


def build(client: docker.APIClient, repository: str, tag: str) -> str:
    """Build the cpu service's image as repository:tag (not trainbox:cpu; no .env written); return its ID."""
    with build_environment():
        service = compose.service("cpu", dotenv.variables(dotenv.settings("cpu")), ROOT)
    spec = service.build
    for chunk in client.build(
        path=str(ROOT / spec.get("context", ".")),
        dockerfile=spec.get("dockerfile", "Dockerfile"),
        tag=f"{repository}:{tag}",
        buildargs={key: str(value) for key, value in (spec.get("args") or {}).items()},
        network_mode=spec.get("network"),
        rm=True,
        forcerm=True,
        decode=True,
    ):
        if "error" in chunk:
            pytest.fail(f"build {repository}:{tag} failed: {chunk['error'].strip()}", pytrace=False)
        if chunk.get("stream"):
            sys.stderr.write(chunk["stream"])
    return client.inspect_image(f"{repository}:{tag}")["Id"]


def run(client: docker.APIClient, image: str, script: str) -> str:
    container = client.create_container(
        image,
        command=["sh", "-c", script],
        network_disabled=True,
        host_config=client.create_host_config(network_mode="none"),
    )
    try:
        client.start(container)
        if client.wait(container, timeout=600)["StatusCode"] != 0:
            pytest.fail(f"{script!r} failed in {image}: {client.logs(container).decode()[-2000:]}", pytrace=False)
        return client.logs(container, stdout=True, stderr=False).decode()
    finally:
        client.remove_container(container, force=True)


@pytest.fixture(scope="module")
def cached_build(engine1: docker.APIClient) -> Iterator[str]:
    """The cpu service's image, built from the layer cache the docker group left (seconds, not a full build)."""
    yield build(engine1, *TAG)
    engine1.remove_image(":".join(TAG), force=True)


def test_bytecode_is_hash_based_and_complete(engine1: docker.APIClient, cached_build: str) -> None:
    """Every module has a .pyc, and none records a timestamp (flags 0b01: hash-based, unchecked)."""
    sources, compiled, timestamped = map(int, run(engine1, cached_build, f"python -c '{PYC_FLAGS}'").split())
    assert timestamped == 0 and compiled >= 0.95 * sources, (sources, compiled, timestamped)
