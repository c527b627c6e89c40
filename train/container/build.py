"""``invoke build``: build a flavor's image from its compose service, output streamed live.

docker-py builds with the classic builder (no BuildKit syntax in the
Dockerfiles) and only its low-level API streams progress. Build args,
Dockerfile, context and tag come from the service's ``build:`` section, so
``docker compose build`` and ``invoke build`` produce the same image. The
flavor's hash lock is checked first (:func:`locks.check`): an absent,
incomplete or stale lock stops the build with one line.

Behind a proxy that re-signs TLS, pip and apt inside the build fail on the
proxy's certificate and the engine's error names only the failed RUN; a
build whose output showed a certificate-verification failure ends with a
line naming the fix (the proxy's CA via ``--ca-cert`` or ``TRAINBOX_CA_CERTS``).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, TextIO

import docker

from trainbox.container import compose, dotenv, engine, locks
from trainbox.container import reproducible as reproducible_build
from trainbox.errors import UserError
from trainbox.interrupt import StopRequested

#: What a TLS verification failure looks like in the build's output: Python/pip's ssl error,
#: apt's (GnuTLS) "Certificate verification failed", curl's and wget's.
CERTIFICATE_FAILURE = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|Certificate verification failed|SSL certificate problem|cannot verify \S+'s certificate"
)
CA_FIX = (
    "the build could not verify a TLS certificate (a proxy that re-signs TLS?):"
    " give that proxy's CA with --ca-cert PATH or TRAINBOX_CA_CERTS=PATH"
)


def build(
    flavor: str,
    root: Path,
    ca_certs: Iterable[str] = (),
    no_cache: bool = False,
    out: Optional[TextIO] = None,
    reproducible: bool = False,
) -> str:
    """Build ``flavor``'s image; return its tag. Checks the lock, then writes .env.

    ``reproducible``: build the commit (``git archive`` of HEAD) and rewrite the image so that its ID
    depends only on the commit (:mod:`trainbox.container.reproducible`)."""
    out = out or sys.stdout
    locks.check(flavor)
    values = dotenv.settings(flavor, ca_certs)
    dotenv.write(root, values)
    service = compose.service(flavor, dotenv.variables(values), root)
    started = time.monotonic()
    client = engine.api()
    arguments = service_build_arguments(service, root, no_cache)
    if not reproducible:
        stream(client, arguments, out)
        out.write(f"built {service.image} in {time.monotonic() - started:.0f} s\n")
        return service.image
    image_id = build_commit(client, service, arguments, root, out)
    out.write(f"built {service.image} in {time.monotonic() - started:.0f} s\n")
    out.write(reproducible_build.identity(flavor, arguments["buildargs"]["SOURCE_COMMIT"], image_id) + "\n")
    return service.image


def service_build_arguments(service: compose.Service, root: Path, no_cache: bool) -> Dict[str, Any]:
    """docker-py's build arguments for the service's ``build:`` section (context: the checkout's folder)."""
    spec = service.build
    return {
        "path": str(root / spec.get("context", ".")),
        "dockerfile": spec.get("dockerfile", "Dockerfile"),
        "tag": service.image,
        "buildargs": {key: str(value) for key, value in (spec.get("args") or {}).items()},
        "network_mode": spec.get("network"),
        "nocache": no_cache,
        "rm": True,
        "forcerm": True,
        "decode": True,
    }


def build_commit(client: docker.APIClient, service: compose.Service, arguments: Dict[str, Any], root: Path, out: TextIO) -> str:
    """Build HEAD's ``git archive`` with ``arguments``, then rewrite the image to depend only on the commit; its ID."""
    dockerfile = arguments.pop("path") and arguments["dockerfile"]
    reproducible_build.note_uncommitted(root, dockerfile, out)
    # The label names the commit built, never "-dirty": uncommitted changes are not in the context.
    arguments["buildargs"]["SOURCE_COMMIT"] = reproducible_build.head(root)
    with reproducible_build.context(root, dockerfile) as context:
        stream(client, {**arguments, "fileobj": context, "custom_context": True}, out)
    base = next(value for key, value in arguments["buildargs"].items() if key.endswith("_BASE_IMAGE"))
    return reproducible_build.normalize(client, arguments["tag"], base, reproducible_build.source_date_epoch(root), out)


def stream(client: docker.APIClient, arguments: Dict[str, Any], out: TextIO) -> None:
    """Run one build with ``arguments``, its output streamed to ``out``; a failed step is one line."""
    certificate_failed = False
    tag = arguments["tag"]
    try:
        for chunk in client.build(**arguments):
            if "error" in chunk:
                hint = f"; {CA_FIX}" if certificate_failed else ""
                raise UserError(f"build of {tag} failed: {chunk['error'].strip()}{hint}")
            text = chunk.get("stream") or chunk.get("status")
            if text:
                certificate_failed = certificate_failed or CERTIFICATE_FAILURE.search(text) is not None
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()
    except StopRequested as stop:
        client.close()  # the engine cancels a build whose client hung up
        stop.what = stop.what or f"the build of {tag} (no image was tagged)"
        raise
