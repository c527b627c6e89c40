"""Two reproducible no-cache builds of the full CPU image, one per Docker Engine: their image IDs and times.

    python bench/rebuild_cpu.py

What ``invoke build --reproducible --no-cache --flavor cpu`` does, twice, at once: on this machine's engine and
on a second dockerd with its own data root (tests/container/bundle/engine2.py), which gets only the base image
(copied from engine 1 and checked by ID: the base is pinned). Both build HEAD of a fresh clone of this checkout,
tagged trainbox-rebuildbench:cpu (the machine's trainbox:cpu is left alone), with the environment the container
tests use (the locally bootstrapped base, this machine's extra CA certificates). When the IDs differ, the
comparison ``invoke verify-rebuild`` prints is recorded. Needs root (the second engine) and about 20 GB of disk
while it runs; both images are removed at the end. Writes bench/results/rebuild-cpu.{json,md}.

The CI test (tests/container/bundle/test_rebuild.py) makes the same check on a small image with the same
Dockerfile; this one covers the 4 GB image with torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict

import docker
from common import REPO, write_results
from images import build_env

from tests.container.bundle.engine2 import SecondEngine
from trainbox.container import build, compose, dotenv, imagediff, rebuild

TAG = "trainbox-rebuildbench:cpu"
BASE = "trainbox-base:bullseye"


def reproducible_build(client: docker.APIClient, source: Path, log: Path, result: Dict[str, Any]) -> None:
    """``invoke build --reproducible --no-cache``'s build of ``source``'s HEAD as TAG; fills ``result``."""
    started = time.monotonic()
    service = compose.service("cpu", dotenv.variables(dotenv.settings("cpu")), source)
    arguments = build.service_build_arguments(service, source, no_cache=True)
    arguments["tag"] = TAG
    try:
        with log.open("w") as out:
            result["image_id"] = build.build_commit(client, service, arguments, source, out)
    except Exception as exc:  # recorded; the other build goes on
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - started)
    print(f"{log.stem}: {result}", flush=True)  # at once: the builds take half an hour


def both(source: Path, logs: Path) -> Dict[str, Dict[str, Any]]:
    one = docker.APIClient(version="auto", timeout=3600)
    second = SecondEngine()
    two = second.start()
    results: Dict[str, Dict[str, Any]] = {"engine 1": {}, "engine 2": {}}
    try:
        two.load_image(b"".join(one.get_image(BASE)))
        assert two.inspect_image(BASE)["Id"] == one.inspect_image(BASE)["Id"]
        threads = [
            threading.Thread(target=reproducible_build, args=(client, source, logs / f"{name[-1]}.log", results[name]))
            for name, client in (("engine 1", one), ("engine 2", two))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if results["engine 1"].get("image_id") != results["engine 2"].get("image_id") and "error" not in str(results):
            with rebuild.saved(one, TAG) as a, rebuild.saved(two, TAG) as b:
                results["differences"] = imagediff.differences(imagediff.saved_image(a, "1"), imagediff.saved_image(b, "2"))  # type: ignore[assignment]
    finally:
        if one.images(name=TAG):
            one.remove_image(TAG)
        second.stop()
    return results


def main() -> int:
    os.environ.update(build_env())
    os.environ.setdefault("TRAINBOX_CPU_BASE_IMAGE", BASE)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src"
        subprocess.run(["git", "clone", "-q", str(REPO), str(source)], check=True)
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        results = both(source, Path(tmp))
        for name in ("1", "2"):
            tail = (Path(tmp) / f"{name}.log").read_text().splitlines(True)[-4:]
            print(f"--- engine {name}: last lines of the build\n" + "".join(tail))
    ids = [results[name].get("image_id", results[name].get("error")) for name in ("engine 1", "engine 2")]
    same = ids[0] == ids[1] and "error" not in str(results)
    md = (
        "# Reproducible CPU image: two no-cache builds on two engines\n\nCommand: `python bench/rebuild_cpu.py`"
        f" (commit {commit}; both builds at once on this machine's two cores)\n\n"
        "| engine | image ID | build + rewrite s |\n| --- | --- | --- |\n"
        + "".join(f"| {name} | {ids[i]} | {results[name]['seconds']} |\n" for i, name in enumerate(("engine 1", "engine 2")))
        + f"\nSame image ID: {'yes' if same else 'no'}\n"
        + "".join(f"\n    {line}" for line in results.get("differences", [])[:60])  # type: ignore[index]
        + "\n"
    )
    print(md)
    print(write_results("rebuild-cpu", {"commit": commit, "same_image_id": same, **results}, md))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
