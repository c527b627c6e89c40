"""The ``env/`` files: pinned versions (``stack.env``) and runtime environments.

Format: ``KEY=VALUE`` lines, no quotes, ``#`` comments; the same parser reads
them here, in the image's entry point and in ``setup-app.sh``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

from trainbox import SOURCE_ROOT
from trainbox.container import flavors
from trainbox.errors import UserError

REPO_ROOT = SOURCE_ROOT
ENV_DIR = flavors.ENV_DIR
STACK_FILE = ENV_DIR / "stack.env"

_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")


def read_env_file(path: Path) -> Dict[str, str]:
    """Parse one env file; a malformed line is a :class:`UserError` naming it."""
    values: Dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise UserError(f"{path}:{number}: expected KEY=VALUE without spaces or quotes")
        values[match.group(1)] = match.group(2)
    return values


def stack() -> Dict[str, str]:
    """Every pinned version (``env/stack.env``)."""
    return read_env_file(STACK_FILE)


def runtime_env(flavor: str) -> Dict[str, str]:
    """The environment a container of ``flavor`` starts with (before overrides)."""
    merged: Dict[str, str] = {}
    for path in flavors.get(flavor).env_paths():
        merged.update(read_env_file(path))
    return merged
