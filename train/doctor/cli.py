"""``python -m trainbox doctor [--inside]``: the handler ``train/cli.py`` wires in.

On the host it checks devices, groups, driver, GPU arch → HSA override and
kdb, the NVIDIA driver version and Container Toolkit (cuda flavor), shared
memory, Docker (and whether it can hand out NVIDIA GPUs), free disk and the
image, and writes compose's ``.env`` (through ``trainbox.container.dotenv``)
unless ``--no-env``. Inside the image (``--inside``) it checks what the
training process will really load. Exit status 1 when a check failed, else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, TextIO

from trainbox.doctor import checkup, devices, render
from trainbox.doctor.result import Check, fail, ok

INSIDE_FIX = "run the host doctor from the trainbox checkout; inside the image run `python -m trainbox doctor --inside`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inside", action="store_true", help="check the training environment inside the image")
    parser.add_argument(
        "--flavor",
        choices=checkup.FLAVORS,
        default=None,
        help="image flavor (default: rocm when /dev/kfd exists, cuda when /dev/nvidiactl exists, else cpu)",
    )
    parser.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to inspect (a recorded host tree)")
    parser.add_argument("--no-docker", action="store_true", help="leave out the Docker Engine and image checks")
    parser.add_argument("--no-env", action="store_true", help="do not write .env for compose")
    parser.add_argument(
        "--min-free-gib", type=float, default=None, help="free disk to require (default: what building the image needs)"
    )


def _write_env(flavor: str) -> Check:
    from trainbox.container import dotenv, envfiles
    from trainbox.errors import UserError

    try:
        path = dotenv.write(envfiles.REPO_ROOT, dotenv.settings(flavor))
    except (UserError, OSError) as exc:
        return fail(".env", f"not written: {exc}", "fix the error above, then run `invoke setup`")
    return ok(".env", f"wrote {path} for compose (flavor {flavor})")


def _image_tag(flavor: str) -> str:
    from trainbox.container import compose, dotenv

    return compose.service(flavor, dotenv.variables(dotenv.settings(flavor))).image


def host(
    flavor: Optional[str] = None,
    root: Path = Path("/"),
    docker: bool = True,
    write_env: bool = True,
    min_free: Optional[int] = None,
) -> List[Check]:
    """Every host check; on the real host (``root`` is ``/``) also write compose's .env, or check it (``write_env=False``)."""
    from trainbox.container import envfiles
    from trainbox.errors import UserError

    flavor = flavor or checkup.default_flavor(root)
    try:
        stack = envfiles.stack()
        override = envfiles.runtime_env("rocm").get("HSA_OVERRIDE_GFX_VERSION")
        image_tag = _image_tag(flavor) if docker else None
    except (OSError, UserError) as exc:
        return [fail("env files", f"cannot read the pins and compose.yaml in {envfiles.REPO_ROOT}: {exc}", INSIDE_FIX)]
    checks = checkup.host_checks(root, devices.current_identity(), flavor, stack, override, image_tag, min_free)
    if Path(root).resolve() == Path("/"):
        checks.append(_write_env(flavor) if write_env else devices.check_dotenv_gids(envfiles.REPO_ROOT / ".env", root))
    return checks


def doctor(
    inside: bool = False,
    flavor: Optional[str] = None,
    root: Path = Path("/"),
    docker: bool = True,
    write_env: bool = True,
    out: Optional[TextIO] = None,
    min_free: Optional[int] = None,
) -> int:
    """Run the host (or ``inside``) doctor, print one line per check; 1 when a check failed, else 0."""
    if inside:
        from trainbox.doctor import inside as inside_doctor

        checks = inside_doctor.inside_checks()
    else:
        checks = host(flavor, root, docker, write_env, min_free)
    (out or sys.stdout).write(render.format_report(checks))
    return render.exit_status(checks)


def main(args: argparse.Namespace) -> int:
    """Handler for ``python -m trainbox doctor`` (arguments from :func:`add_arguments`)."""
    min_free = None if args.min_free_gib is None else int(args.min_free_gib * 2**30)
    return doctor(args.inside, args.flavor, args.root, not args.no_docker, not args.no_env, min_free=min_free)
