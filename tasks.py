"""invoke tasks for the trainbox containers (thin: the work is in train/container/).

    invoke setup                      write .env (pins, UID/GID, video/render GIDs, flavor)
    invoke build [--flavor cpu] [--reproducible]   build the image, output streamed live
    invoke verify-rebuild [--flavor cpu] [--expect sha256:...]   rebuild the commit from scratch and compare
    invoke train --profile safe [--flavor rocm|cuda|cpu] [--data PATH] [--set KEY=VALUE ...]
                 [--env KEY=VALUE ...] [--supervisor "--stall-timeout 120"] [--name RUN | --resume]
    invoke status [--run NAME] [--deadline 07:00] [--watch]
    invoke logs / stop / shell / test
    invoke doctor [--flavor rocm|cuda|cpu] [--no-docker]
    invoke warmup --profile safe [--flavor rocm] --set data=/data/data.yaml [--set imgsz=640 ...]
    invoke lock [--flavor cpu]        hash-locked requirements: env/requirements/<flavor>.lock
    invoke fingerprint [--out FILE]   JSON fingerprint of the image and this host
    invoke verify FILE                name every difference from this machine (none: identical)
    invoke bundle OUT.tar [--flavor]  image, compose.yaml, env/ and the lock, with a manifest
    invoke restore OUT.tar [--into DIR] [--sha256 DIGEST] [--accept-compose]

Ultralytics overrides are passed with a repeated ``--set KEY=VALUE`` (invoke
has no positional varargs); container environment with ``--env KEY=VALUE``.
Every user error ends with one line (invoke.Exit), never a traceback.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from invoke import Exit, task
from invoke.main import program

from trainbox import errors, interrupt
from trainbox.container import build as build_image
from trainbox.container import bundle as bundles
from trainbox.container import compose, dotenv, engine, flavors, launch, locks, rebuild
from trainbox.container import fingerprint as fingerprints
from trainbox.doctor import cli as doctor_cli
from trainbox.view import live
from trainbox.view import status as run_status

ROOT = Path(__file__).resolve().parent
FLAVOR_HELP = "rocm, cuda or cpu (default: rocm when /dev/kfd exists, cuda when /dev/nvidiactl does, else cpu)"
HELP_FLAGS = ("-h", "--help")
#: Task parameters that name a file or directory, in every task that has them: a value starting
#: with '-' is a mistyped option (or invoke's parser handing one over), never a path.
PATH_PARAMETERS = frozenset({"out", "bundle", "file", "into", "data", "run_dir", "ca_cert"})


def one_line_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into invoke.Exit with its one-line message, and a stop signal into exit 128+N.

    Ctrl-C, SIGTERM and SIGHUP are handled from the task's first line (trainbox.interrupt says why
    Python's own KeyboardInterrupt cannot be relied on). Tasks that hand the terminal to a child
    through ``c.run`` are wrapped by :func:`_one_line_errors_only` instead: invoke forwards Ctrl-C
    to that child itself.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with interrupt.stop_requests():
                return _one_line_errors_only(function)(*args, **kwargs)
        except interrupt.StopRequested as stop:
            raise Exit(interrupt.message(stop, f"invoke {function.__name__}"), code=stop.exit_code) from None

    return wrapper


def _one_line_errors_only(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _check_arguments(function, inspect.signature(function).bind(*args, **kwargs).arguments)
            return function(*args, **kwargs)
        except errors.TrainboxError as exc:
            raise Exit(errors.line(exc), code=exc.code) from None

    return wrapper


def _check_arguments(function: Callable[..., Any], arguments: Dict[str, Any]) -> None:
    """Answer ``--help``/``-h`` given where a positional argument goes; refuse a path that starts with '-'.

    invoke's parser fills a task's missing positional arguments before it looks for its own
    flags (pyinvoke/invoke#982, open in 3.0.3): ``invoke bundle --help`` calls the task with
    ``out="--help"``. A task whose positionals are all given (``invoke bundle b.tar --help``)
    and a task without any get invoke's own help; this puts the other case on the same path.
    """
    parameters = inspect.signature(function).parameters.values()
    positional = [parameter.name for parameter in parameters if parameter.default is parameter.empty][1:]  # after the context
    if any(arguments.get(name) in HELP_FLAGS for name in positional):
        program.print_task_help(function.__name__)
        raise Exit(code=0)
    for name, value in arguments.items():
        for path in value if isinstance(value, list) else [value]:
            if name in PATH_PARAMETERS and isinstance(path, str) and path.startswith("-"):
                spelled = name.upper() if name in positional else f"--{name.replace('_', '-')}"
                raise errors.UserError(
                    f"{spelled} {path!r} looks like an option, not a path: for a file of that name, write ./{path}"
                )


def _flavor(flavor: Optional[str]) -> str:
    if flavor is None:
        flavor = flavors.default_for_host()
        if flavor == "cpu":
            print("note: no /dev/kfd or /dev/nvidiactl: using the cpu flavor (--flavor rocm|cuda to insist)", file=sys.stderr)
    return flavors.get(flavor).name


@task(
    help={
        "flavor": FLAVOR_HELP,
        "ca_cert": "extra CA certificate file or directory for builds (repeatable)",
    },
    iterable=["ca_cert"],
)
@one_line_errors
def setup(c, flavor=None, ca_cert=None):
    """Write .env for docker compose and create the shared cache volumes (then: docker compose up)."""
    flavor = _flavor(flavor)
    values = dotenv.settings(flavor, ca_cert or [])
    path = dotenv.write(ROOT, values)
    print(f"wrote {path}")
    service = compose.service(flavor, dotenv.variables(values), ROOT)
    if service.named_volumes:
        launch.ensure_volumes(engine.api(), service)


@task(
    help={
        "flavor": FLAVOR_HELP,
        "ca_cert": "extra CA certificate file or directory, trusted inside the build (repeatable; also $TRAINBOX_CA_CERTS)",
        "no_cache": "rebuild every layer",
        "reproducible": "build the commit (not uncommitted changes) so that the image ID depends on it alone:"
        " the same on any machine; the image is rewritten once after the build (minutes)",
    },
    iterable=["ca_cert"],
)
@one_line_errors
def build(c, flavor=None, ca_cert=None, no_cache=False, reproducible=False):
    """Build the flavor's image through the Docker SDK, streaming progress."""
    build_image.build(_flavor(flavor), ROOT, ca_cert or [], no_cache, reproducible=reproducible)


@task(
    help={
        "flavor": FLAVOR_HELP,
        "ca_cert": "extra CA certificate file or directory, as given to the first build (repeatable; also $TRAINBOX_CA_CERTS)",
        "expect": "the image ID the first machine printed (sha256:...): exit 1 unless the rebuild has it",
    },
    iterable=["ca_cert"],
)
@one_line_errors
def verify_rebuild(c, flavor=None, ca_cert=None, expect=None):
    """Rebuild this commit from scratch beside the image and compare: one line with the image ID when identical,
    else what differs, layer by layer and file by file (exit 1); the last line is the one to compare between machines."""
    raise Exit(code=rebuild.verify(_flavor(flavor), ROOT, ca_cert or [], expect))


@task(
    help={
        "profile": "training profile from env/profiles (safe, balanced, fast)",
        "flavor": FLAVOR_HELP,
        "data": "dataset: a data.yaml or its directory, mounted read-only (default: the demo dataset)",
        "set": "Ultralytics/run override KEY=VALUE (repeatable)",
        "env": "container environment KEY=VALUE (repeatable)",
        "supervisor": "options for `python -m trainbox run`, e.g. '--stall-timeout 120 --max-restarts 3'",
        "name": "run name (default: PROFILE-TIMESTAMP); the run directory is runs/NAME (the same name again resumes it)",
        "resume": "go on with the newest run of this profile (runs/PROFILE-TIMESTAMP) instead of starting a new one",
        "no_build": "fail instead of building a missing image",
    },
    iterable=["set_", "env"],
)
@one_line_errors
def train(c, profile="safe", flavor=None, data=None, set_=None, env=None, supervisor="", name=None, resume=False, no_build=False):
    """Train in a container created from compose.yaml's service; Ctrl-C stops it gracefully."""
    if name and resume:
        raise errors.UserError("--name names the run to go on with, --resume picks the newest: give one of them")
    environment = dict(pair.split("=", 1) for pair in launch.parse_pairs(env or [], "--env"))
    overrides, supervisor_args = list(set_ or []), shlex.split(supervisor)
    launch.check_arguments(profile, overrides, supervisor_args)  # a mistake is the only line, before the flavor's note
    request = launch.TrainRequest(
        profile=profile,
        flavor=_flavor(flavor),
        root=ROOT,
        data=Path(data) if data else None,
        overrides=overrides,
        supervisor_args=supervisor_args,
        environment=environment,
        run_name=name,
        build_missing=not no_build,
        resume=resume,
    )
    code, run_dir = launch.train(request)
    if code != 0:
        raise Exit(launch.failed_line(code, run_dir), code=code)


@task(
    help={
        "run": "run name (default: the newest run)",
        "run_dir": "a run directory instead",
        "deadline": f"{run_status.DEADLINE_FORMATS}: does the run finish in time?",
        "watch": "a live view, refreshed every second from the run directory, until Ctrl-C",
    }
)
@one_line_errors
def status(c, run=None, run_dir=None, deadline=None, watch=False):
    """Epoch, batch, throughput, ETA, restarts, stalls, health and checkpoint age of a run (--watch: live)."""
    directory, health = launch.locate(ROOT, run, Path(run_dir) if run_dir else None)
    when = run_status.parse_deadline(deadline, datetime.datetime.now()) if deadline else None
    if watch:
        raise Exit(code=live.main(directory, when, health))
    print("\n".join(run_status.render(directory, run_status.read(directory), health, when)))


@task(help={"run": "run name (default: the newest run)", "follow": "keep streaming"})
@one_line_errors
def logs(c, run=None, follow=False):
    """Print the run container's logs."""
    launch.logs(ROOT, run, follow)


@task(help={"run": "run name (default: the newest run)"})
@one_line_errors
def stop(c, run=None):
    """Stop the run's container, giving the supervisor its grace period to save."""
    print(f"stopped {launch.stop(ROOT, run)}")


@task(
    help={
        "run": "run whose container to enter (default: the newest running one, else a fresh container)",
        "flavor": "image for a fresh container",
    }
)
@one_line_errors
def shell(c, run=None, flavor=None):
    """Interactive shell in the run's container (or a fresh one) with the image's environment."""
    launch.exec_shell(launch.shell_command(run, _flavor(flavor), ROOT))


@task(help={"pytest_args": "extra pytest arguments, e.g. '-k compose'"})
def test(c, pytest_args=""):
    """Run the container and bundle test suites (need a Docker Engine; see .ci/docker-setup.sh)."""
    command: List[str] = [sys.executable, "-m", "pytest", "tests/container", "tests/container/bundle", *pytest_args.split()]
    c.run(" ".join(command), pty=sys.stdout.isatty())


@task(help={"flavor": FLAVOR_HELP})
@one_line_errors
def lock(c, flavor=None):
    """Write env/requirements/<flavor>.lock: every pin of env/ with the sha256 of its wheels."""
    print(f"wrote {locks.lock(_flavor(flavor))}")


@task(
    help={
        "flavor": "image of this flavor; " + FLAVOR_HELP,
        "out": "write the JSON to FILE instead of printing it",
    }
)
@one_line_errors
def fingerprint(c, flavor=None, out=None):
    """JSON fingerprint: image ID, labels, pip freeze, MIOpen hashes, versions; host kernel, driver, GPU."""
    ref = fingerprints.image_ref(_flavor(flavor), ROOT)
    taken = fingerprints.collect(ref)
    if taken["image"] is None:
        print(f"note: image {ref} is not on this engine: the fingerprint covers the host only", file=sys.stderr)
    if out:
        fingerprints.write(Path(out), taken)
        print(f"wrote {out}")
    else:
        sys.stdout.write(fingerprints.dumps(taken))


@task(help={"file": "a fingerprint written by `invoke fingerprint --out`"})
@one_line_errors
def verify(c, file):
    """Compare a fingerprint with this machine: one line per difference, nothing when identical."""
    differences = fingerprints.verify(Path(file))
    if differences:
        print("\n".join(differences))
        raise Exit(code=1)


@task(
    help={
        "out": "the bundle file to write (e.g. trainbox-cpu.tar)",
        "flavor": "image of this flavor; " + FLAVOR_HELP,
    }
)
@one_line_errors
def bundle(c, out, flavor=None):
    """Write image, compose.yaml, env/ (the lock included) and a sha256 manifest into one tar; print its sha256."""
    bundles.bundle(Path(out), fingerprints.image_ref(_flavor(flavor), ROOT), ROOT)


@task(
    help={
        "bundle": "a file written by `invoke bundle`",
        "into": "directory for compose.yaml, env/ and .env (default: this checkout)",
        "sha256": "refuse the bundle unless its manifest has this sha256 (printed by `invoke bundle`);"
        " without it the bundle is restored as unverified",
        "accept_compose": "use the bundle's compose.yaml although it differs from this checkout's (the diff is printed)",
    }
)
@one_line_errors
def restore(c, bundle, into=None, sha256=None, accept_compose=False):
    """Verify a bundle, docker load it, confirm the image ID, write .env for this host; print the next command."""
    target = Path(into) if into else ROOT
    restored = bundles.restore(Path(bundle), target, expected_digest=sha256, checkout=ROOT, accept_compose=accept_compose)
    bundles.report(restored)


@task(
    help={
        "flavor": FLAVOR_HELP,
        "no_docker": "leave out the Docker Engine and image checks",
    }
)
@one_line_errors
def doctor(c, flavor=None, no_docker=False):
    """Check this host (devices, groups, driver, GPU arch -> HSA override and kdb, shm, disk, image); write .env."""
    raise Exit(code=doctor_cli.doctor(flavor=_flavor(flavor), docker=not no_docker))


@task(
    iterable=["set_"],
    help={
        "profile": "profile whose convolution backend applies (default: safe)",
        "flavor": FLAVOR_HELP,
        "set_": "the run's Ultralytics arguments, repeatable: --set data=/data/data.yaml --set imgsz=640 --set batch=16",
    },
)
@_one_line_errors_only
def warmup(c, profile="safe", flavor=None, set_=None):
    """Compile and cache MIOpen's kernels at the training shapes, in the compose service's container."""
    flavor = _flavor(flavor)
    dotenv.write(ROOT, dotenv.settings(flavor))
    command = ["docker", "compose", "run", "--rm", flavor, "warmup", "--profile", profile, *(set_ or [])]
    c.run(shlex.join(command), pty=sys.stdout.isatty())
