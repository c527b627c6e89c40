"""Two reproducible builds of one commit, on two engines with empty caches, give the same image ID; and the
comparison verify-rebuild runs names a file planted in a layer.

The image is Dockerfile.cpu itself, every step of it (apt, forget-build.sh, hash-pycs.py, the venv, the
hash-locked pip install, compileall, the app layer), built from a commit of a copy of the build context whose
lock keeps five of cpu.lock's packages (pip, a compiled one, three pure ones) instead of torch's 4 GB: about 4
minutes a build on CI's two cores, where the full image takes about 17 (bench/rebuild_cpu.py runs that one).
Engine 1 is the machine's; engine 2 has its own data root and gets only the base image, copied from engine 1
and checked by ID (the base is pinned, as the Dockerfile's digest pins the registry's). Both builds run without
layer cache.
"""

from __future__ import annotations

import concurrent.futures
import copy
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import docker
import pytest

from tests.container.bundle.conftest import BASE_IMAGE, build_environment
from tests.container.conftest import OWN_IMAGES, build_context
from trainbox.container import build, compose, dotenv, layers, locks, rebuild

pytestmark = [OWN_IMAGES]

TAG = "trainbox-rebuildtest:cpu"
PLANTED = "trainbox-rebuildtest:planted"
#: Five of cpu.lock's packages: pip (the lock upgrades the venv's), psutil (a compiled extension), three pure ones.
SMALL_LOCK = ("pip", "psutil", "six", "packaging", "idna")
#: The commit's time: any fixed one (git's environment variables set it).
COMMIT_DATE = "2026-01-02T03:04:05Z"
#: A file of the app layer (the last layer, COPY train/), changed in the planted image.
PLANTED_FILE = "opt/trainbox/trainbox/__init__.py"


def small_lock(text: str, keep: tuple = SMALL_LOCK) -> str:
    """cpu.lock with its header and only the ``keep`` packages' entries (name line and hash lines)."""
    lines: List[str] = []
    kept = True
    for line in text.splitlines(keepends=True):
        if not line.startswith((" ", "#")):
            kept = line.split("==", 1)[0] in keep
        if line.startswith("#") or kept:
            lines.append(line)
    return "".join(lines)


@pytest.fixture(scope="module")
def small_commit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository with one commit: the build context with the small lock."""
    root = build_context(tmp_path_factory.mktemp("small-commit"))
    lock = root / "env" / "requirements" / "cpu.lock"
    lock.write_text(small_lock(lock.read_text()))
    env = {**os.environ, "GIT_AUTHOR_DATE": COMMIT_DATE, "GIT_COMMITTER_DATE": COMMIT_DATE}
    env.update({f"GIT_{who}_{what}": "trainbox test" for who in ("AUTHOR", "COMMITTER") for what in ("NAME", "EMAIL")})
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "small image"]):
        subprocess.run(["git", *command], cwd=root, env=env, check=True)
    return root


def build_arguments(root: Path) -> Tuple[compose.Service, Dict[str, Any]]:
    """``invoke build --reproducible --no-cache``'s service and build arguments for ``root``'s commit, tagged TAG."""
    with build_environment():
        service = compose.service("cpu", dotenv.variables(dotenv.settings("cpu")), root)
    arguments = build.service_build_arguments(service, root, no_cache=True)
    arguments["tag"] = TAG
    arguments["buildargs"]["LOCK_SHA256"] = locks.lock_digest(root / "env" / "requirements" / "cpu.lock")
    return service, arguments


def timed_build(client: docker.APIClient, name: str, root: Path, prepared: Tuple[compose.Service, Dict[str, Any]]) -> str:
    """One reproducible build of ``root``'s commit on ``client``; its image ID (the time goes to stderr)."""
    started = time.monotonic()
    service, arguments = prepared
    image_id = build.build_commit(client, service, copy.deepcopy(arguments), root, sys.stderr)
    print(f"\nreproducible build on {name}: {image_id} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return image_id


@pytest.fixture(scope="module")
def two_builds(engine1: docker.APIClient, engine2: docker.APIClient, small_commit: Path) -> Iterator[Dict[str, str]]:
    """The two builds, at once: they share nothing but the machine, and on CI's two cores the one fetches
    packages while the other compiles."""
    if not engine2.images(name=BASE_IMAGE):
        engine2.load_image(b"".join(engine1.get_image(BASE_IMAGE)))
    assert engine2.inspect_image(BASE_IMAGE)["Id"] == engine1.inspect_image(BASE_IMAGE)["Id"]
    prepared = build_arguments(small_commit)  # here: the environment is patched once, not by two threads at a time
    engines = {"engine 1": engine1, "engine 2": engine2}
    try:
        with concurrent.futures.ThreadPoolExecutor(len(engines)) as pool:
            builds = {name: pool.submit(timed_build, client, name, small_commit, prepared) for name, client in engines.items()}
            yield {name: future.result() for name, future in builds.items()}
    finally:
        for client in engines.values():
            for tag in (TAG, PLANTED):
                if client.images(name=tag):
                    client.remove_image(tag, force=True)


def test_two_builds_on_two_engines_with_empty_caches_give_one_image_id(
    engine1: docker.APIClient, engine2: docker.APIClient, two_builds: Dict[str, str]
) -> None:
    assert two_builds["engine 1"] == two_builds["engine 2"]
    assert engine1.inspect_image(TAG)["RootFS"] == engine2.inspect_image(TAG)["RootFS"]
    # What makes it an image of the commit, not of the build: the commit's time, and no build container.
    found = engine1.inspect_image(TAG)
    assert found["Created"] == COMMIT_DATE and found["Container"] == ""


def planted(client: docker.APIClient, tag: str, target: str) -> str:
    """Load ``tag`` again as ``target`` with one byte more in :data:`PLANTED_FILE` of its last layer; its ID."""
    with rebuild.saved(client, tag) as image:
        manifest, config = layers.saved_manifest(image)
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as copy:
            for index, path in enumerate(manifest["Layers"]):
                data = layers.member(image, path).read()
                if index == len(manifest["Layers"]) - 1:
                    data = changed(data)
                    config["rootfs"]["diff_ids"][index] = layers.config_id(data)
                add(copy, path, data)
            config_bytes = json.dumps(config).encode()
            add(copy, "config.json", config_bytes)
            add(copy, "manifest.json", json.dumps([{**manifest, "Config": "config.json", "RepoTags": [target]}]).encode())
    for chunk in client.load_image(out.getvalue()):
        assert "error" not in chunk, chunk
    return layers.config_id(config_bytes)


def changed(layer: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(layer)) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in source:
            data = source.extractfile(member).read() if member.isreg() else None
            if member.name == PLANTED_FILE:
                data += b"\n"
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    entry = tarfile.TarInfo(name)
    entry.size = len(data)
    tar.addfile(entry, io.BytesIO(data))


def test_the_comparison_names_a_file_planted_in_a_layer(engine1: docker.APIClient, two_builds: Dict[str, str]) -> None:
    planted_id = planted(engine1, TAG, PLANTED)
    here = engine1.inspect_image(TAG)
    lines = rebuild.verdict(engine1, TAG, here, PLANTED, planted_id)
    layer_count = len(here["RootFS"]["Layers"])
    assert lines[0] == f"the rebuild differs from {TAG} ({here['Id']}):"
    assert lines[1].startswith(f"layer {layer_count} of {layer_count} (COPY dir:")
    assert lines[1].endswith(" in /opt/trainbox/trainbox/) differs:")
    assert lines[2].startswith(f"  /{PLANTED_FILE}: content differs (")
    assert len(lines) == 3
