"""``invoke train`` / ``stop`` / ``logs`` / ``shell``: containers from compose.yaml's services.

The container is created through the Docker SDK from the resolved compose
service (:mod:`trainbox.container.compose`) plus what differs per run: command,
run name, dataset mount and extra environment.

The same ``invoke train --name RUN`` again resumes RUN (after a ``docker kill``,
a reboot, a stop): a *stopped* container of that name is retired first, its
output saved to ``runs/RUN/logs/container-<n>.log`` (``docker logs`` would be
gone with it), while a running one is refused, since a run has one supervisor.
The run directory was written by that container, so the log is written through
:mod:`trainbox.rundir.safe`: a ``logs`` link the container made is refused (the
output is then not saved, and the line says so), never written through
(issue 33 item 1: ``logs -> ../../../.bashrc.d`` had the host write there).
Following a run goes on through Docker's restarts of its container (a hung
supervisor ended by ``health --act``, a crash) and says each in one line.

What the user gave is checked here, on the host, before any image, container,
``.env`` or run directory is made (:func:`check_arguments`): the profile, every
``--set KEY=VALUE`` and every ``--supervisor`` option, with the code and the
messages ``python -m trainbox run`` uses inside (:mod:`trainbox.yolo.profiles`,
:mod:`trainbox.yolo.args` against the image's pinned Ultralytics,
:mod:`trainbox.supervise.settings`). A mistake is one line and exit 2, and
leaves nothing behind.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterable, List, NoReturn, Optional, TextIO, Tuple

import docker
from docker.types import DeviceRequest, Mount

from trainbox.container import build, compose, dotenv, engine, envfiles, flavors
from trainbox.errors import UserError
from trainbox.interrupt import StopRequested, on_stop
from trainbox.rundir import exit_record, owner
from trainbox.rundir.events import read_events
from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import Refusal
from trainbox.supervise import settings
from trainbox.view import status as run_status
from trainbox.yolo import args, dataset, profiles

RUN_LABEL = "io.trainbox.run"
#: The compose project (the checkout) a run's container belongs to: `invoke logs/stop/status` look in their own.
PROJECT_LABEL = "io.trainbox.project"
#: Docker's container-name characters (the container is <project>-NAME; runs/NAME is its directory).
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
DEFAULT_GRACE_S = 10.0
#: Docker lists a container while it still creates it, and answers "No such container" to everything else until it is
#: done: copying the image's files into the run's new cache volumes took 2.6-9 s here on 2 busy cores. A container
#: found by listing is waited for this long before the command gives up with a line.
CREATING_WAIT_S = 30.0


@dataclass
class TrainRequest:
    """One ``invoke train``: the profile, flavor, dataset and overrides of a run."""

    profile: str
    flavor: str
    root: Path
    data: Optional[Path] = None
    overrides: List[str] = field(default_factory=list)
    supervisor_args: List[str] = field(default_factory=list)
    environment: Dict[str, str] = field(default_factory=dict)
    run_name: Optional[str] = None
    build_missing: bool = True
    #: Go on with the newest run of the profile (``invoke train --resume``) instead of a new one.
    resume: bool = False


def parse_pairs(pairs: Iterable[str], what: str) -> List[str]:
    """Validate repeated ``KEY=VALUE`` options (``--set``, ``--env``)."""
    result = []
    for pair in pairs:
        key, sep, _ = pair.partition("=")
        if not sep or not key:
            raise UserError(f"{what} expects KEY=VALUE, got {pair!r}")
        result.append(pair)
    return result


class _SupervisorOptions(argparse.ArgumentParser):
    """``--supervisor``'s options, parsed as ``python -m trainbox run`` parses them (the settings table)."""

    def __init__(self) -> None:
        super().__init__(prog="--supervisor", add_help=False)
        settings.add_arguments(self, profile_defaults=True)
        self.add_argument("--quiet", action="store_true")

    def error(self, message: str) -> NoReturn:
        raise UserError(
            f"--supervisor: {message} (it takes the options of `python -m trainbox run --help` but --run-dir and --profiles-dir)"
        )


def check_arguments(profile: str, overrides: List[str], supervisor_args: List[str]) -> None:
    """Refuse a bad profile, ``--set`` or ``--supervisor`` option as the training process would, before anything is made."""
    profiles.load(profile)
    given = args.check_pairs(parse_pairs(overrides, "--set"), args.pinned())
    if "data" in given:
        raise UserError("--set data=: the dataset is --data PATH (mounted read-only; without it, the demo dataset)")
    try:
        settings.SupervisorSettings.from_arguments(_SupervisorOptions().parse_args(supervisor_args))
    except ValueError as exc:
        raise UserError(f"--supervisor: {exc}") from None


def _dataset_yaml(data: Path) -> Path:
    """The dataset YAML ``--data`` names: the file itself, or a directory's data.yaml."""
    path = data.expanduser().resolve()
    if path.is_dir():  # not the run directory: the dataset
        if not (path / "data.yaml").is_file():  # not the run directory: the dataset
            raise UserError(f"dataset {path} has no data.yaml: pass the YAML file or its directory")
        return path / "data.yaml"
    if path.is_file():  # not the run directory: the dataset
        return path
    raise UserError(f"dataset {data} not found: pass a data.yaml or its directory (demo: `python -m trainbox demo-data DIR`)")


def _folder_of(split: Path) -> Path:
    """What to mount for one split: Ultralytics finds labels by swapping the last ``images`` folder for
    ``labels``, so a path under ``X/images/`` needs all of ``X``; any other path, itself."""
    parts = split.parts
    if "images" in parts[:-1] or split.name == "images":
        last = len(parts) - 1 - parts[::-1].index("images")
        return Path(*parts[:last])
    return split


def dataset_mounts(found: dataset.Dataset) -> List[Path]:
    """The host paths to mount read-only, each at the same path inside, so the YAML works unchanged.

    The YAML file itself (not its folder: ``--data ~/data.yaml`` must not mount the home directory) and
    each split's dataset folder, leaving out any that another one contains.
    """
    wanted = sorted({found.yaml_file, *(_folder_of(p) for paths in found.splits.values() for p in paths)})
    kept: List[Path] = []
    for path in wanted:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    for path in kept:
        if path in (Path.home(), Path(path.anchor)):
            raise UserError(
                f"dataset: mounting {path} would give the container your whole {'home' if path != Path(path.anchor) else 'root'}"
                " directory; move the images and labels into a folder of their own"
            )
    return kept


def _valid_run_name(name: str) -> str:
    """A run name is a directory under runs/ and part of a container name: Docker's characters, no path."""
    if not RUN_NAME.fullmatch(name) or name in (".", ".."):
        raise UserError(f"--name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


def check_devices(service: compose.Service) -> None:
    """A device the service passes through must exist on this host."""
    for device in service.devices:
        host_path = Path(device.split(":")[0])
        if not host_path.exists():  # not the run directory: a device node
            raise UserError(f"{host_path} missing: {flavors.get(service.name).no_gpu_fix}")


def create_kwargs(service: compose.Service, labels: Dict[str, str]) -> Dict[str, Any]:
    """``APIClient.create_container`` keyword arguments (minus host_config) for ``service``."""
    return {
        "image": service.image,
        "command": service.command,
        "user": service.user,
        "environment": dict(service.environment),
        "healthcheck": service.healthcheck,
        "labels": labels,
        "stop_timeout": int(service.stop_grace_s) if service.stop_grace_s is not None else None,
        "use_config_proxy": False,
    }


def host_config_kwargs(service: compose.Service) -> Dict[str, Any]:
    """``APIClient.create_host_config`` keyword arguments for ``service``."""
    mounts = [Mount(b["target"], b["source"], type="bind", read_only=b["read_only"]) for b in service.binds]
    mounts += [Mount(v["target"], v["source"], type="volume") for v in service.named_volumes]
    restart = None
    if service.restart and service.restart != "no":
        name, _, count = service.restart.partition(":")
        restart = {"Name": name, "MaximumRetryCount": int(count or 0)}
    return {
        "mounts": mounts,
        "network_mode": service.network_mode,
        "restart_policy": restart,
        "shm_size": service.shm_size,
        "devices": service.devices or None,
        "group_add": service.group_add or None,
        "init": service.init,
        "device_requests": [_device_request(r) for r in service.device_requests] or None,
        "cap_drop": service.cap_drop or None,
        "security_opt": service.security_opt or None,
        "read_only": service.read_only,
        "tmpfs": service.tmpfs or None,
        "pids_limit": service.pids_limit,
        "mem_limit": service.mem_limit,
    }


def _device_request(fields: Dict[str, Any]) -> DeviceRequest:
    """A DeviceRequest with compose's exact fields (the SDK alone would send an absent DeviceIDs as [])."""
    request = DeviceRequest(**fields)
    request.update(fields)
    return request


def _resolve_dataset(data: Path) -> dataset.Dataset:
    """``--data`` resolved on the host; a dataset the container could not read as given is one line."""
    found = dataset.resolve(str(_dataset_yaml(data)))
    if found.root_from_cwd:
        raise UserError(
            f"dataset {found.yaml_file}: its relative path: is taken from the folder training runs in, "
            "which the container does not share; make path: absolute, or leave it out"
        )
    return found


def _chosen_run(request: TrainRequest, runs: Path) -> str:
    """A run of ``invoke train`` is named by its profile (:func:`trainbox.rundir.owner.choose`): a new
    ``PROFILE-YYYYmmdd-HHMMSS``, or with ``--resume`` the newest such run under ``runs``."""
    return owner.choose(request.profile, None, request.resume, runs).name


def prepare(request: TrainRequest) -> Tuple[compose.Service, Dict[str, str]]:
    """Check the request, write .env, resolve the flavor's service and apply this run's settings.

    Every check on what the user gave comes before anything is written.
    """
    check_arguments(request.profile, request.overrides, request.supervisor_args)
    values = dotenv.settings(request.flavor)
    overrides = parse_pairs(request.overrides, "--set")
    found = _resolve_dataset(request.data) if request.data is not None else None
    # A new run's directory is made as it is named (two runs started in one second get two): after the checks.
    run_name = _valid_run_name(request.run_name or _chosen_run(request, request.root / values.get("TRAINBOX_RUNS_HOST", "runs")))
    mounts = dataset_mounts(found) if found is not None else []
    dotenv.write(request.root, values)
    variables = dict(dotenv.variables(values), TRAINBOX_RUN_NAME=run_name)
    service = compose.service(request.flavor, variables, request.root)
    runtime = envfiles.runtime_env(request.flavor)
    if found is None:
        service.command = ["demo", "--profile", request.profile, *request.supervisor_args, *overrides]
    else:
        # The dataset appears at its host paths (an absolute path: or ../ in the YAML then works as is),
        # in place of compose's mount of the demo dataset.
        service.binds = [b for b in service.binds if b["target"] != runtime["TRAINBOX_DATA"]]
        service.binds += [{"source": str(p), "target": str(p), "read_only": True} for p in mounts]
        data_arg = f"data={found.yaml_file}"
        service.command = ["train", "--profile", request.profile, *request.supervisor_args, *overrides, data_arg]
    service.environment.update(request.environment)
    # compose mounts only the run's own directory, runs/<name>, at the same place under TRAINBOX_RUNS.
    run_dir = Path(next(b["source"] for b in service.binds if b["target"] == f"{runtime['TRAINBOX_RUNS']}/{run_name}"))
    labels = {
        RUN_LABEL: run_name,
        PROJECT_LABEL: service.project,
        "io.trainbox.flavor": request.flavor,
        "io.trainbox.profile": request.profile,
        "io.trainbox.run-dir": str(run_dir),
    }
    return service, labels


def start(request: TrainRequest) -> Tuple[docker.APIClient, str, compose.Service]:
    """Create and start the run's container; return (client, container id, service).

    A stop signal before the container runs (during an image build, say) leaves no container behind.
    """
    with on_stop("the run before its container started"):
        return _start(request)


def _start(request: TrainRequest) -> Tuple[docker.APIClient, str, compose.Service]:
    service, labels = prepare(request)
    check_devices(service)
    client = engine.api()
    try:
        engine.image(client, service.image, request.flavor)
    except UserError:
        if not request.build_missing:
            raise
        print(f"note: image {service.image} not found, building it first", file=sys.stderr)
        build.build(request.flavor, request.root)
    ensure_volumes(client, service)
    host_config = client.create_host_config(**host_config_kwargs(service))
    run, name = labels[RUN_LABEL], f"{service.project}-{labels[RUN_LABEL]}"
    taken = UserError(
        f"container {name} is running: run {run} is training already (follow it: `invoke logs --run {run} --follow`;"
        f" stop it: `invoke stop --run {run}`)"
    )
    previous = client.containers(all=True, filters={"name": f"^/{name}$"})
    if previous and _running(client.inspect_container(previous[0]["Id"])):
        raise taken  # before the run directory is made: a refused run leaves nothing behind
    user = (service.user or "0:0").split(":")
    # The run's own directory is what the container mounts: it must exist, owned by the container's user.
    dotenv.ensure_owned_dir(Path(labels["io.trainbox.run-dir"]), int(user[0]), int(user[-1]))
    if previous:
        _retire(client, previous[0]["Id"], name, RunDir(Path(labels["io.trainbox.run-dir"])))
    try:
        container = client.create_container(host_config=host_config, name=name, **create_kwargs(service, labels))
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # taken since the look above
            raise taken from None
        raise
    try:
        client.start(container["Id"])
    except BaseException as exc:
        # Not started (a stop signal, a refused GPU...): leave no container behind to block the run's name.
        client.remove_container(container["Id"], force=True)
        if isinstance(exc, docker.errors.APIError) and service.device_requests and "device driver" in str(exc):
            fix = flavors.get(request.flavor).no_gpu_fix
            raise UserError(f"Docker cannot give the container a GPU ({engine.short(exc)}): {fix}") from None
        raise
    return client, container["Id"], service


def _running(inspected: Dict[str, Any]) -> bool:
    """Whether a container is (or is about to be) running: paused or being restarted by its policy counts."""
    state = inspected["State"]
    return bool(state["Running"] or state["Restarting"] or state["Paused"])


#: Saved container logs looked at for a free number (a run is replaced a few times a day).
MAX_CONTAINER_LOGS = 100_000


def _retire(client: docker.APIClient, container_id: str, name: str, run: RunDir) -> Optional[Path]:
    """Save a stopped container's output into the run directory, then remove the container; the log's path, or
    None when the run directory refused it (said in the line)."""
    files = run.files
    listed = files.list_dir(run.container_log.directory, MAX_CONTAINER_LOGS)
    numbers = [n for n in map(run.container_log.number_of, listed.value or []) if n is not None]
    log = run.container_log(max(numbers, default=-1) + 1)
    refused, where = listed.refused, run.container_log.directory
    if refused in (None, Refusal.MISSING):
        refused, where = files.replace(log, client.logs(container_id, stream=True, follow=False)), log
    client.remove_container(container_id)
    saved = f"its output is saved in {log}" if refused is None else f"its output is not saved: {refused.line(where)}"
    print(f"note: replaced the stopped container {name} ({saved}); the run resumes", file=sys.stderr)
    return None if refused is not None else log


def ensure_volumes(client: docker.APIClient, service: compose.Service) -> None:
    """Create the service's shared cache volumes that are missing (compose.yaml declares them external)."""
    for volume in service.named_volumes:
        if not any(
            v["Name"] == volume["source"] for v in client.volumes(filters={"name": volume["source"]}).get("Volumes") or []
        ):
            client.create_volume(volume["source"])


def stream_logs(client: docker.APIClient, container_id: str, out: Optional[TextIO] = None) -> int:
    """Stream logs until the container stops for good and return its exit code; each restart is one line.

    A restart is told by the container's ``RestartCount`` against the last start announced, not against the last
    inspection: an inspection taken as the stream ends may still show the old start running (the daemon records the
    exit after it closes the log), and the restart must be said when it is seen, whenever that is.
    """
    out = out or sys.stdout
    since: Optional[int] = None
    announced = client.inspect_container(container_id)  # the start whose output is being followed
    at_line_start = True
    while True:
        for chunk in client.logs(container_id, stream=True, follow=True, since=since):
            text = chunk.decode(errors="replace")
            out.write(text)
            out.flush()
            at_line_start = text.endswith("\n") if text else at_line_start
        since = int(time.time())
        inspected = client.inspect_container(container_id)
        while inspected["State"]["Restarting"]:  # the policy's delay: wait for the new start
            time.sleep(0.5)
            inspected = client.inspect_container(container_id)
        restarted = inspected["RestartCount"] > announced["RestartCount"]
        if restarted:
            # A killed child leaves its progress bar's last draw unended: the line starts a line of its own.
            out.write(("" if at_line_start else "\n") + _restart_line(inspected, announced) + "\n")
            out.flush()
            at_line_start, announced = True, inspected
            since = _unix(inspected["State"]["StartedAt"])  # the new start's output, from its first line
        if not inspected["State"]["Running"]:
            return _real_exit(inspected)
        if not restarted:
            time.sleep(0.5)  # the stream ended but the container runs on (a daemon hiccup): follow it again


def _unix(docker_time: str) -> int:
    """Docker's ``2026-11-23T18:20:01.123456789Z`` as whole unix seconds."""
    moment = datetime.datetime.strptime(docker_time[:19], "%Y-%m-%dT%H:%M:%S")
    return int(moment.replace(tzinfo=datetime.timezone.utc).timestamp())


def _restart_line(inspected: Dict[str, Any], before: Dict[str, Any]) -> str:
    """One line for a restart by Docker's policy, with the reason the run's history gives."""
    maximum = (inspected["HostConfig"].get("RestartPolicy") or {}).get("MaximumRetryCount")
    count = f"restart {inspected['RestartCount']}" + (f" of {maximum}" if maximum else "")
    run_dir = (inspected["Config"].get("Labels") or {}).get("io.trainbox.run-dir")
    previous_start = _unix(before["State"]["StartedAt"])
    run = RunDir(Path(run_dir or "."))
    events = read_events(run.events) if run_dir else []
    hang = next((e for e in reversed(events) if e.get("event") == "supervisor_hung" and e["ts"] >= previous_start), None)
    why = "its supervisor exited (a crash or a kill)"
    if hang is not None:
        # The event names the report as the container sees it; the same file on this host (a name only: no "..").
        report = run.supervisor_hang.directory / PurePosixPath(hang.get("incident", "none")).name
        why = f"its supervisor hung (state.json not updated for {hang.get('age_s', 0.0):.0f} s; stacks in {report})"
    return f"trainbox: container restarted by Docker ({count}): {why}; the run resumes from its last checkpoint"


def _real_exit(inspected: Dict[str, Any]) -> int:
    """The container's exit status, or the final one it reported to Docker as 0 (:mod:`trainbox.rundir.exit_record`)."""
    code = int(inspected["State"]["ExitCode"])
    run_dir = (inspected["Config"].get("Labels") or {}).get("io.trainbox.run-dir")
    if code != 0 or run_dir is None:
        return code
    recorded = exit_record.recorded(Path(run_dir), inspected["Config"]["Hostname"])
    return code if recorded is None else recorded


def follow(client: docker.APIClient, container_id: str, grace_s: float, out: Optional[TextIO] = None) -> int:
    """:func:`stream_logs` for the run's owner: a stop signal stops the container gracefully and is re-raised.

    The first Ctrl-C (or SIGTERM/SIGHUP) gives the supervisor inside ``grace_s`` to save
    (``docker stop``: SIGTERM, then SIGKILL); a second one during that wait kills the container at once.
    Needs :func:`trainbox.interrupt.stop_requests` around it.
    """
    out = out or sys.stdout
    try:
        return stream_logs(client, container_id, out)
    except StopRequested as stop:
        out.write(f"\n{stop.name}: stopping the container (up to {grace_s:.0f} s to save; {stop.name} again stops it at once)\n")
        out.flush()
        try:
            client.stop(container_id, timeout=int(grace_s))
            stop.what = "the container; the run directory keeps its checkpoints"
        except StopRequested:
            client.kill(container_id)
            stop.what = "the container at once (killed); the run resumes from its last checkpoint"
        raise stop from None


def train(request: TrainRequest, out: Optional[TextIO] = None) -> Tuple[int, Path]:
    """Run training in a container, following its logs; return its exit code and the run directory."""
    client, container_id, service = start(request)
    run_dir = Path(client.inspect_container(container_id)["Config"]["Labels"]["io.trainbox.run-dir"])
    return follow(client, container_id, service.stop_grace_s or DEFAULT_GRACE_S, out), run_dir


def failed_line(code: int, run_dir: Path) -> str:
    """``invoke train``'s last line when its container ended with ``code`` != 0: where to look, only what exists."""
    run = RunDir(run_dir)
    history = f" and the run's history, {run.events}" if run.files.stat(run.events).value is not None else ""
    return f"error: the training container exited with {code}: see `invoke logs --run {run_dir.name}`{history}"


def project(root: Path) -> str:
    """The compose project of the checkout at ``root`` (:func:`trainbox.container.compose.project_name`)."""
    return compose.project_name(dotenv.variables(dotenv.settings()), root)


def find(client: docker.APIClient, root: Path, run: Optional[str] = None) -> Dict[str, Any]:
    """The container of run ``run`` of this checkout, else its newest trainbox container, once Docker has created it."""
    labels = [f"{PROJECT_LABEL}={project(root)}", f"{RUN_LABEL}={run}" if run else RUN_LABEL]
    containers = client.containers(all=True, filters={"label": labels})
    if not containers:
        raise UserError(f"no trainbox container{' for run ' + run if run else ''}: start one with `invoke train`")
    newest = max(containers, key=lambda c: c["Created"])
    _wait_until_created(client, newest)
    return newest


def _wait_until_created(client: docker.APIClient, listed: Dict[str, Any]) -> None:
    """Return once Docker answers for a container it listed (see :data:`CREATING_WAIT_S`); a line if it never does."""
    deadline = time.monotonic() + CREATING_WAIT_S
    while True:
        try:
            client.inspect_container(listed["Id"])
            return
        except docker.errors.NotFound:
            if time.monotonic() >= deadline:
                name = listed["Names"][0].lstrip("/")
                raise UserError(
                    f"Docker lists container {name} but has not answered for it in {CREATING_WAIT_S:.0f} s (still being"
                    " created, or removed since): try again in a moment"
                ) from None
            time.sleep(0.2)


def stop(root: Path, run: Optional[str] = None) -> str:
    """Stop a run's container within its grace period; return its run name."""
    client = engine.api()
    container = find(client, root, run)
    timeout = client.inspect_container(container["Id"])["Config"].get("StopTimeout") or DEFAULT_GRACE_S
    client.stop(container["Id"], timeout=int(timeout))
    return container["Labels"][RUN_LABEL]


def logs(root: Path, run: Optional[str] = None, follow_logs: bool = False, out: Optional[TextIO] = None) -> None:
    """Print a run's container logs."""
    out = out or sys.stdout
    client = engine.api()
    container = find(client, root, run)
    if follow_logs:
        with on_stop(f"following the logs of {container['Names'][0].lstrip('/')} (the container runs on)"):
            stream_logs(client, container["Id"], out)
        return
    out.write(client.logs(container["Id"]).decode(errors="replace"))


def shell_command(run: Optional[str], flavor: str, root: Path) -> List[str]:
    """The docker CLI command for an interactive shell: in the run's container, else a fresh one."""
    client = engine.api()
    if run is not None or client.containers(filters={"label": [RUN_LABEL, f"{PROJECT_LABEL}={project(root)}"]}):
        container = find(client, root, run)
        if container["State"] == "running":
            return ["docker", "exec", "-it", container["Id"], "trainbox", "bash"]
    values = dotenv.settings(flavor)
    dotenv.write(root, values)
    service = compose.service(flavor, dotenv.variables(values), root)
    engine.image(client, service.image, flavor)
    user = ["--user", service.user] if service.user else []
    mounts = [
        f"--mount=type=bind,src={b['source']},dst={b['target']}{',readonly' if b['read_only'] else ''}" for b in service.binds
    ]
    gpus = ["--gpus", "all"] if service.device_requests else []
    network = ["--network", service.network_mode or "none"]
    return ["docker", "run", "--rm", "-it", *network, *gpus, *user, *_hardening_flags(service), *mounts, service.image, "bash"]


def _hardening_flags(service: compose.Service) -> List[str]:
    """compose's cap_drop, security_opt, read_only, tmpfs, pids_limit and mem_limit as docker CLI flags."""
    flags = [f"--cap-drop={cap}" for cap in service.cap_drop] + [f"--security-opt={opt}" for opt in service.security_opt]
    flags += ["--read-only"] if service.read_only else []
    flags += [f"--tmpfs={mount}" for mount in service.tmpfs]
    flags += [f"--pids-limit={service.pids_limit}"] if service.pids_limit is not None else []
    flags += [f"--memory={service.mem_limit}"] if service.mem_limit is not None else []
    return flags


def exec_shell(command: List[str]) -> None:
    """Replace this process with the interactive docker CLI command."""
    os.execvp(command[0], command)


def locate(root: Path, run: Optional[str], run_dir: Optional[Path]) -> Tuple[Path, Optional[str]]:
    """(run directory, container health or None) for ``invoke status``: run ``run``, else the newest run.

    The newest is the one with the latest last event under the runs directory, whichever route made it
    (:func:`trainbox.view.status.newest_run`); its container's health, where it has one that Docker knows.
    """
    if run_dir is not None:
        return run_dir, None
    runs = root / dotenv.settings().get("TRAINBOX_RUNS_HOST", "runs")
    directory = runs / run if run else run_status.newest_run(runs)
    if not directory.is_dir():  # run directory, checked: only whether it is a folder
        raise UserError(f"no run {run} under {runs}: `invoke status` without --run shows the newest")
    return directory, _health(root, directory.name)


def _health(root: Path, run: str) -> Optional[str]:
    """``healthy (container running)``, or None where the run has no container (compose's, a native one) or no engine."""
    try:
        client = engine.api()
        container = find(client, root, run)
    except UserError:
        return None
    state = client.inspect_container(container["Id"])["State"]
    health = (state.get("Health") or {}).get("Status") or state["Status"]
    return f"{health} (container {state['Status']})"
