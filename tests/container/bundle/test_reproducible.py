"""Two builds of the CPU image from the same lock give the same Python environment, file for file.

Build A uses the layer cache (its layers come from an earlier build of the
same inputs, or it is built now); build B, made after it, uses none. Both must have the same
``pip freeze`` and the same sha256 for every file under site-packages. This
costs one full no-cache build (network, minutes), made once for this module and removed after it
(a second copy of the image's 4 GB on disk only while it is compared).

What makes it hold: pip installs with ``--no-compile``, then ``compileall
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
from typing import Dict, Iterator, Tuple

import docker
import pytest

from tests.container.bundle.conftest import ROOT, build_environment
from tests.container.conftest import OWN_IMAGES
from trainbox.container import compose, dotenv, fingerprint

#: Last in its group: by then the docker group has built trainbox:cpu from the same inputs, and build A takes its
#: layers from that build instead of being a full build of its own beside it (about 7 minutes of CI's two cores).
pytestmark = [OWN_IMAGES, pytest.mark.last_in_group]

TAGS = {"cached": ("trainbox-repro", "cached"), "fresh": ("trainbox-repro", "fresh")}
SITE_HASHES = (
    'cd "$(python -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"'
    " && find . -type f -print0 | sort -z | xargs -0 sha256sum"
)
#: Prints "<.py count> <.pyc count> <.pyc that are not unchecked-hash>" for site-packages.
PYC_FLAGS = r"""
import pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
pyc = list(site.rglob("*.pyc"))
other = [p for p in pyc if int.from_bytes(p.read_bytes()[4:8], "little") != 0b01]
print(len(list(site.rglob("*.py"))), len(pyc), len(other))
"""


def build(client: docker.APIClient, repository: str, tag: str, nocache: bool) -> str:
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
        nocache=nocache,
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
def two_builds(engine1: docker.APIClient) -> Iterator[Tuple[str, str]]:
    ids = (build(engine1, *TAGS["cached"], nocache=False), build(engine1, *TAGS["fresh"], nocache=True))
    yield ids
    for repository, tag in TAGS.values():
        engine1.remove_image(f"{repository}:{tag}", force=True)


def site_hashes(client: docker.APIClient, image: str) -> Dict[str, str]:
    lines = (line.split("  ", 1) for line in run(client, image, SITE_HASHES).splitlines() if line)
    return {path: digest for digest, path in lines}


def test_two_builds_from_the_same_lock_have_identical_site_packages(
    engine1: docker.APIClient, two_builds: Tuple[str, str]
) -> None:
    cached, fresh = two_builds
    freeze = [fingerprint.probe_image(engine1, image)["pip_freeze"] for image in two_builds]
    assert freeze[0] == freeze[1]
    a, b = site_hashes(engine1, cached), site_hashes(engine1, fresh)
    differing = sorted(path for path in set(a) | set(b) if a.get(path) != b.get(path))
    pyc = [path for path in differing if path.endswith(".pyc")]
    print(
        f"\nreproducibility: {len(a)} files, {len(differing)} differ ({len(pyc)} .pyc); "
        f"others: {[p for p in differing if p not in pyc][:20]}",
        file=sys.stderr,
    )
    assert differing == []


def test_bytecode_is_hash_based_and_complete(engine1: docker.APIClient, two_builds: Tuple[str, str]) -> None:
    """Every module has a .pyc, and none records a timestamp (flags 0b01: hash-based, unchecked)."""
    sources, compiled, timestamped = map(int, run(engine1, two_builds[1], f"python -c '{PYC_FLAGS}'").split())
    assert timestamped == 0 and compiled >= 0.95 * sources, (sources, compiled, timestamped)
