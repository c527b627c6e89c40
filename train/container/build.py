"""``invoke build``: build a flavor's image from its compose service, output streamed live.

docker-py builds with the classic builder (no BuildKit syntax in the
Dockerfiles) and only its low-level API streams progress. Build args,
Dockerfile, context and tag come from the service's ``build:`` section, so
``docker compose build`` and ``invoke build`` produce the same image. The
flavor's hash lock is checked first (:func:`locks.check`): an absent,
incomplete or stale lock stops the build with one line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterable, Optional, TextIO

from trainbox.container import compose, dotenv, engine, locks
from trainbox.errors import UserError
from trainbox.interrupt import StopRequested


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
    try:
        for chunk in stream:
            if "error" in chunk:
                raise UserError(f"build of {service.image} failed: {chunk['error'].strip()}")
            text = chunk.get("stream") or chunk.get("status")
            if text:
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()
    except StopRequested as stop:
        client.close()  # the engine cancels a build whose client hung up
        stop.what = stop.what or f"the build of {service.image} (no image was tagged)"
        raise
    out.write(f"built {service.image} in {time.monotonic() - started:.0f} s\n")
    return service.image
