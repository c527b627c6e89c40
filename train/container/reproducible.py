"""``invoke build --reproducible``: an image whose ID depends only on the commit, not on the build.

Docker's classic builder (the only one docker-py drives, and Debian's
docker.io 20.10 ships a BuildKit too old for ``SOURCE_DATE_EPOCH``) stamps
every image with the build's clock: the config's ``created`` and history, the
``container`` and intermediate image IDs, and every file it writes gets the
time it was written. What was measured here, and what this module does:

- the build context is ``git archive`` of HEAD (the Dockerfile, env/, train/):
  every file the Dockerfile COPYs has the commit's time and mode 0644/0755,
  whatever the checkout's umask and file times (uncommitted changes are left
  out, and said so);
- the Dockerfiles end every RUN that installs packages with
  ``forget-build.sh`` (apt and dpkg logs, apt's caches, ldconfig's aux-cache,
  the ``-old`` databases), and pip's bytecode is already hash-based and
  compiled in one process;
- then the built image is saved, and each of its own layers (the pinned base
  image's are kept byte for byte) is rewritten by :mod:`trainbox.container.layers`
  with every timestamp clamped to ``SOURCE_DATE_EPOCH`` (the commit's time,
  ``git log -1 --format=%ct``); the config gets that time as ``created`` and
  loses what names the build (container IDs, builder version); the result is
  loaded back under the same tag. Its ID is the sha256 of that config, so two
  builds of one commit on two machines get the same ID when their layers match.

The rewrite reads and writes the image twice (save and load: minutes for the
4 GB CPU image on two cores) and replaces the cached layers by the rewritten
ones, so it is an option, not the default.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import IO, List, Optional, Sequence

import docker

from trainbox.container import layers
from trainbox.errors import UserError

#: What an image build reads from the commit: .dockerignore admits only env/ and train/ besides the Dockerfile.
CONTEXT_PATHS = ("env", "train")


def identity(flavor: str, commit: str, image_id: str) -> str:
    """The line two machines compare (``invoke build --reproducible`` and ``invoke verify-rebuild`` end with it):
    equal exactly when their builds of the commit are."""
    return f"{flavor} image of commit {commit} is {image_id}"


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise UserError(f"a reproducible build needs the git checkout: git {' '.join(args)} failed: {detail.strip()}") from None


def source_date_epoch(root: Path) -> int:
    """The commit's time (seconds since 1970), the ``SOURCE_DATE_EPOCH`` of every file and date in the image."""
    return int(_git(root, "log", "-1", "--format=%ct").strip())


def head(root: Path) -> str:
    """The commit a reproducible build builds."""
    return _git(root, "rev-parse", "HEAD").strip()


def uncommitted(root: Path, paths: Sequence[str]) -> List[str]:
    """Files under ``paths`` that differ from HEAD: a reproducible build leaves those changes out."""
    return [line[3:] for line in _git(root, "status", "--porcelain", "--", *paths).splitlines() if line]


def context(root: Path, dockerfile: str) -> IO[bytes]:
    """The build context as ``git archive`` writes it for HEAD: file times are the commit's, modes 0644/0755."""
    archive = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it: docker-py streams it to the engine)
    try:
        subprocess.run(
            # tar.umask: git's default (0002) gives 0664, and a user's git config could give anything else.
            ["git", "-C", str(root), "-c", "tar.umask=0022", "archive", "--format=tar", "HEAD", "--", dockerfile, *CONTEXT_PATHS],
            stdout=archive,
            stderr=subprocess.PIPE,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        archive.close()
        detail = getattr(exc, "stderr", b"") or str(exc).encode()
        raise UserError(f"git archive of HEAD failed: {detail.decode(errors='replace').strip()}") from None
    archive.seek(0)
    return archive


def note_uncommitted(root: Path, dockerfile: str, out: Optional[IO[str]]) -> None:
    changed = uncommitted(root, [dockerfile, *CONTEXT_PATHS])
    if changed and out is not None:
        out.write(f"note: building the commit (HEAD); {len(changed)} uncommitted change(s) left out, e.g. {changed[0]}\n")


def normalize(client: docker.APIClient, tag: str, base: str, epoch: int, out: Optional[IO[str]] = None) -> str:
    """Rewrite the built image ``tag`` (:mod:`trainbox.container.layers`) and load it back under ``tag``; its ID.

    The layers that ``base`` brought are kept as they are (the base is pinned by digest); the built image,
    its intermediate images and the save are removed.
    """
    raw = client.inspect_image(tag)["Id"]
    base_layers = client.inspect_image(base)["RootFS"]["Layers"]
    base_history = len(client.history(base))
    with tempfile.TemporaryDirectory(prefix="trainbox-rebuild-") as work:
        saved = Path(work) / "built.tar"
        save(client, tag, saved)
        rewritten = Path(work) / "rewritten.tar"
        expected = rewrite_saved(saved, rewritten, tag, base_layers, base_history, epoch)
        saved.unlink()
        load(client, rewritten)
    loaded = client.inspect_image(tag)["Id"]
    if loaded != expected:
        raise UserError(f"the engine loaded {tag} as {loaded}, not as the rewritten {expected}")
    if raw != loaded:
        # The build's own image goes (and its intermediate images, the layer cache, with it), unless another tag
        # still names it: then it stays, as that tag's.
        with contextlib.suppress(docker.errors.APIError):
            client.remove_image(raw)
    if out is not None:
        out.write(f"rewrote {tag}: every time clamped to the commit's ({layers.timestamp(epoch)})\n")
    return loaded


def save(client: docker.APIClient, tag: str, path: Path) -> None:
    with path.open("wb") as target:
        for chunk in client.get_image(tag, chunk_size=layers.COPY_BUFFER):
            target.write(chunk)


def load(client: docker.APIClient, path: Path) -> None:
    with path.open("rb") as source:
        for chunk in client.load_image(source):
            if "error" in chunk:
                raise UserError(f"loading the rewritten image failed: {chunk['error'].strip()}")


def rewrite_saved(saved: Path, target: Path, tag: str, base_layers: List[str], base_history: int, epoch: int) -> str:
    """Write ``docker load``'s input for ``saved`` (``docker save``'s output) rewritten; return the new image ID."""
    with tarfile.open(saved) as image, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as out:
        manifest, config = layers.saved_manifest(image)
        diff_ids = list(config["rootfs"]["diff_ids"])
        if diff_ids[: len(base_layers)] != base_layers:
            raise UserError(f"{tag} does not start with its base image's layers: was it built from another base?")
        names = []
        for index, path in enumerate(manifest["Layers"]):
            name = f"layers/{index}.tar"
            if index < len(base_layers):
                add(out, name, image.getmember(path).size, layers.member(image, path), epoch)
            else:
                diff_ids[index] = rewritten_layer(out, name, layers.member(image, path), target.parent, epoch)
            names.append(name)
        config_bytes = layers.rewrite_config(config, base_history, diff_ids, epoch)
        config_name = layers.config_id(config_bytes).split(":", 1)[1] + ".json"
        add(out, config_name, len(config_bytes), io.BytesIO(config_bytes), epoch)
        listing = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode()
        add(out, "manifest.json", len(listing), io.BytesIO(listing), epoch)
    return layers.config_id(config_bytes)


def rewritten_layer(out: tarfile.TarFile, name: str, source: IO[bytes], work: Path, epoch: int) -> str:
    """Rewrite one layer into a file beside ``out`` (its size goes before its bytes), add it as ``name``."""
    with tempfile.TemporaryFile(dir=work) as layer:
        diff_id = layers.rewrite_layer(source, layer, epoch)
        size = layer.tell()
        layer.seek(0)
        add(out, name, size, layer, epoch)
    return diff_id


def add(out: tarfile.TarFile, name: str, size: int, source: IO[bytes], epoch: int) -> None:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mtime, entry.mode = size, epoch, 0o644
    out.addfile(entry, source)
