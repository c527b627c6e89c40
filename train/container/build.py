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
from typing import Iterable, Optional, TextIO

from trainbox.container import compose, dotenv, engine, locks
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
) -> str:
    """Build ``flavor``'s image; return its tag. Checks the lock, then writes .env."""
    out = out or sys.stdout
    locks.check(flavor)
    values = dotenv.settings(flavor, ca_certs)
    dotenv.write(root, values)
    service = compose.service(flavor, dotenv.variables(values), root)
    spec = service.build
    client = engine.api()
    started = time.monotonic()
    stream = client.build(
        path=str(root / spec.get("context", ".")),
        dockerfile=spec.get("dockerfile", "Dockerfile"),
        tag=service.image,
        buildargs={key: str(value) for key, value in (spec.get("args") or {}).items()},
        network_mode=spec.get("network"),
        nocache=no_cache,
        rm=True,
        forcerm=True,
        decode=True,
    )
    certificate_failed = False
    try:
        for chunk in stream:
            if "error" in chunk:
                hint = f"; {CA_FIX}" if certificate_failed else ""
                raise UserError(f"build of {service.image} failed: {chunk['error'].strip()}{hint}")
            text = chunk.get("stream") or chunk.get("status")
            if text:
                certificate_failed = certificate_failed or CERTIFICATE_FAILURE.search(text) is not None
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()
    except StopRequested as stop:
        client.close()  # the engine cancels a build whose client hung up
        stop.what = stop.what or f"the build of {service.image} (no image was tagged)"
        raise
    out.write(f"built {service.image} in {time.monotonic() - started:.0f} s\n")
    return service.image
