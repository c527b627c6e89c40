"""Connecting to the Docker Engine with one-line errors."""

from __future__ import annotations

from typing import Any, Dict

import docker
from docker.errors import DockerException, ImageNotFound

from trainbox.errors import UserError


def api() -> docker.APIClient:
    """Low-level client (it streams build output and logs); fails with what to do."""
    try:
        client = docker.APIClient(**docker.utils.kwargs_from_env(), version="auto", timeout=300)
        client.ping()
    except DockerException as exc:
        raise UserError(
            f"Docker daemon not reachable ({short(exc)}): start it (e.g. `sudo systemctl start docker`"
            " or .ci/docker-setup.sh) and check that you may use it (docker group)"
        ) from None
    return client


def image(client: docker.APIClient, tag: str, flavor: str) -> Dict[str, Any]:
    """Inspect ``tag``; a missing image names the command that builds it."""
    try:
        return client.inspect_image(tag)
    except ImageNotFound:
        raise UserError(f"image {tag} not found: run `invoke build --flavor {flavor}`") from None


def short(exc: BaseException) -> str:
    """The last line of an engine error, at most 160 characters."""
    text = str(exc).strip().splitlines()
    return text[-1][:160] if text else type(exc).__name__
