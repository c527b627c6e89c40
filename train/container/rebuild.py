"""``invoke verify-rebuild``: build the commit again from scratch, beside the image this machine has, and compare.

The rebuild is a reproducible build (:mod:`trainbox.container.reproducible`) with
no layer cache, tagged ``<image>-rebuild`` and removed afterwards. Its image ID
(the sha256 of its config, which lists the sha256 of every layer) either equals
the one of the image here, and one line says so with the ID, or it does not, and
:mod:`trainbox.container.imagediff` names what differs: config fields, then each
differing layer by its Dockerfile step and, in it, each differing file.

Whatever the outcome, the last line is the rebuild's identity, the same line
``invoke build --reproducible`` ends with: ``<flavor> image of commit <sha> is
sha256:<id>``. Run on two machines, the two lines are equal exactly when the two
builds are. With no image here yet, the rebuild becomes the image and its line
is all there is to compare.
"""

from __future__ import annotations

import contextlib
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, TextIO

import docker
from docker.errors import APIError, ImageNotFound

from trainbox.container import build, compose, dotenv, engine, imagediff, reproducible

REBUILD_SUFFIX = "-rebuild"
#: What a build writes while it runs goes here (stdout carries the verdict alone).
PROGRESS = sys.stderr
SOURCE_COMMIT_LABEL = "io.trainbox.source-commit"


def verify(
    flavor: str, root: Path, ca_certs: Iterable[str] = (), expect: Optional[str] = None, out: Optional[TextIO] = None
) -> int:
    """Rebuild ``flavor``'s image of HEAD without cache and compare; print the verdict; 0 when identical."""
    out = out or sys.stdout
    client = engine.api()
    service = compose.service(flavor, dotenv.variables(dotenv.settings(flavor, ca_certs)), root)
    commit = reproducible.head(root)
    here = existing(client, service.image)
    if here is not None:
        note_other_commit(here, commit, service.image, out)
    tag = service.image + REBUILD_SUFFIX if here is not None else service.image
    arguments = build.service_build_arguments(service, root, no_cache=True)
    arguments["tag"] = tag
    rebuilt = build.build_commit(client, service, arguments, root, PROGRESS)
    try:
        lines = verdict(client, service.image, here, tag, rebuilt)
    finally:
        if tag != service.image:
            with contextlib.suppress(APIError):
                client.remove_image(tag)
    if expect is not None and expect.strip() != rebuilt:
        lines.append(f"the rebuild is {rebuilt}, not the expected {expect.strip()}")
    out.write("".join(line + "\n" for line in [*lines, reproducible.identity(flavor, commit, rebuilt)]))
    return 0 if len(lines) == 0 else 1


def existing(client: docker.APIClient, image: str) -> Optional[dict]:
    with contextlib.suppress(ImageNotFound):
        return client.inspect_image(image)
    return None


def note_other_commit(here: dict, commit: str, image: str, out: TextIO) -> None:
    built_from = ((here.get("Config") or {}).get("Labels") or {}).get(SOURCE_COMMIT_LABEL, "")
    if built_from != commit:
        out.write(f"note: {image} was built from {built_from or 'an unknown commit'}; this checkout, rebuilt, is {commit}\n")


def verdict(client: docker.APIClient, image: str, here: Optional[dict], tag: str, rebuilt: str) -> List[str]:
    """Nothing when the rebuild is the image here (or there is none to compare with); else what differs."""
    if here is None:
        PROGRESS.write(f"note: there was no {image} here to compare with: the rebuild is now {image}\n")
        return []
    if here["Id"] == rebuilt:
        PROGRESS.write(f"the rebuild is identical to {image}\n")
        return []
    with saved(client, image) as image_tar, saved(client, tag) as rebuild_tar:
        differences = imagediff.differences(imagediff.saved_image(image_tar, image), imagediff.saved_image(rebuild_tar, tag))
    return [f"the rebuild differs from {image} ({here['Id']}):", *differences]


@contextlib.contextmanager
def saved(client: docker.APIClient, tag: str) -> Iterator[tarfile.TarFile]:
    """``tag`` as ``docker save`` writes it, in a temporary file, opened (removed after the block)."""
    with tempfile.TemporaryDirectory(prefix="trainbox-compare-") as work:
        path = Path(work) / "image.tar"
        reproducible.save(client, tag, path)
        with tarfile.open(path) as tar:
            yield tar
