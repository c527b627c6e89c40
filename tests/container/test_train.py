"""End to end on the real Docker Engine: `invoke train`, an injected hang, `docker compose up`,
device passthrough with stand-in nodes, and one-line user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.invoked import Invoked
from tests.supervised import SMALL_DEMO_DATA
from trainbox.container import compose, dotenv, engine, envfiles, flavors, launch
from trainbox.errors import ExitCode, UserError
from trainbox.rundir import exit_record

from .conftest import (
    FAST_SUPERVISOR,
    INSPECTED,
    ROOT,
    TEST_GID,
    TEST_UID,
    assert_checkpoint,
    assert_hardened,
    container_of,
    events,
    invoke,
    run_labels,
    settings_of,
)


def env_with(session_env: Dict[str, str], **values: str) -> Dict[str, str]:
    return {**os.environ, **values}


def test_invoke_train_demo_completes(docker_api, cpu_image, runs_dir: Path, run_name: str, session_env) -> None:
    env = env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir))
    started = time.time()
    # The demo with all its arguments but a shorter schedule (the demo's own is docs/getting-started.md's, for a person to watch).
    given = ["--supervisor", FAST_SUPERVISOR, "--set", "epochs=2"]
    result = invoke(["train", "--profile", "safe", "--flavor", "cpu", "--name", run_name, *given], env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "completed after 1 attempt" in result.stdout
    output = result.stdout + result.stderr
    # Nothing that means nothing to the user: matplotlib's read-only config directory, torch 1.13's determinism.
    assert "matplotlib" not in output.lower() and "Upgrade to torch>=2.0.0" not in output, output[-3000:]
    assert "trainbox: trained with amp=False, workers=0, pin_memory=False" in output
    run_dir = runs_dir / run_name
    assert_checkpoint(run_dir)
    first_step = next(e["first_step_ts"] for e in events(run_dir) if e["event"] == "exit")
    print(f"invoke train -> first batch: {first_step - started:.1f} s")
    inspected = container_of(docker_api, run_name)
    assert_hardened(inspected, run_name)
    INSPECTED["invoke"] = settings_of(inspected)


def test_hang_detected_and_resumed_with_read_only_data_and_health(
    docker_api, cpu_image, runs_dir: Path, tmp_path: Path, run_name: str, session_env
) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "trainbox", "demo-data", str(data), *SMALL_DEMO_DATA], check=True, cwd=ROOT)
    env = env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir))
    args = [
        "train",
        "--profile",
        "safe",
        "--flavor",
        "cpu",
        "--name",
        run_name,
        "--data",
        str(data),
        "--env",
        "TRAIN_FAULT=sleep@train_batch,attempt=0,epoch>=2",
        "--supervisor",
        f"--stall-timeout 40 {FAST_SUPERVISOR}",
        "--set",
        "epochs=4",
        "--set",
        "imgsz=64",
    ]  # the 40 s hang alone outlasts Docker's first health check (30 s), however fast the machine trains; epochs 2
    # and 3 are trained after the restart
    invoked = Invoked(args, env)
    inspected = container_of(docker_api, run_name, invoked=invoked)
    data_mount = next(m for m in inspected["Mounts"] if m["Destination"] == str(data))
    assert data_mount["RW"] is False and data_mount["Source"] == str(data)
    assert all(m["Destination"] != envfiles.runtime_env("cpu")["TRAINBOX_DATA"] for m in inspected["Mounts"])
    health_seen = set()
    while invoked.process.poll() is None:
        state = docker_api.inspect_container(inspected["Id"])["State"]
        health_seen.add((state.get("Health") or {}).get("Status"))
        time.sleep(1)
    assert invoked.finish() == 0, invoked.output[-3000:]
    run_dir = runs_dir / run_name
    kinds = [e["event"] for e in events(run_dir)]
    assert "stall" in kinds and "restart" in kinds, kinds
    assert [e["attempt"] for e in events(run_dir) if e["event"] == "start"] == [0, 1]
    assert_checkpoint(run_dir)
    assert "healthy" in health_seen, health_seen
    denied = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            f"{TEST_UID}:{TEST_GID}",
            "--mount",
            f"type=bind,src={data},dst=/probe,readonly",
            "--entrypoint",
            "touch",
            cpu_image["tag"],
            "/probe/x",
        ],
        capture_output=True,
        text=True,
    )
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr


@pytest.mark.parametrize(
    "extra, code",
    [
        # A value only the container reads, from its environment (bad --set and --supervisor values never get this
        # far: test_launch.py): its supervisor refuses it in one line before anything starts.
        (["--env", "TRAINBOX_NOTIFY_ON=nosuchevent", "--supervisor", FAST_SUPERVISOR], ExitCode.USAGE),
        (["--env", "TRAIN_FAULT=crash@train_batch", "--supervisor", f"--max-restarts 0 {FAST_SUPERVISOR}"], ExitCode.GAVE_UP),
    ],
    ids=["bad-input", "gave-up"],
)
def test_a_final_outcome_is_not_restarted_by_docker(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env, extra: List[str], code: ExitCode
) -> None:
    """restart: on-failure:3 restarts on any non-zero exit: the container reports a final outcome as 0 (and Docker
    leaves it stopped), and `invoke train` exits with the real status, recorded in the run directory."""
    env = env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir))
    result = invoke(["train", "--profile", "safe", "--flavor", "cpu", "--name", run_name, *extra], env)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr
    inspected = container_of(docker_api, run_name)
    assert (inspected["RestartCount"], inspected["State"]["ExitCode"]) == (0, 0)
    assert f"exit status {int(code)} is final: reported to Docker as 0" in result.stdout
    assert exit_record.recorded(runs_dir / run_name, inspected["Config"]["Hostname"]) == code


def test_compose_up_gives_the_same_result(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env, tmp_path: Path
) -> None:
    dotenv.write(ROOT, dotenv.settings("cpu"))
    env = env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir), TRAINBOX_RUN_NAME=run_name)
    dotenv.ensure_owned_dir(runs_dir / run_name, TEST_UID, TEST_GID)  # as `TRAINBOX_RUN_NAME=NAME invoke setup` does
    # The image's own command (the demo), with a shorter schedule, as the invoke test's: compose.yaml itself is as shipped.
    shorter = tmp_path / "shorter-demo.yaml"
    shorter.write_text("services:\n  cpu:\n    command: [demo, epochs=2]\n")
    up = ["docker", "compose", "-f", "compose.yaml", "-f", str(shorter), "up"]
    try:
        result = subprocess.run(up, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        assert "completed after 1 attempt" in result.stdout + result.stderr
        assert "matplotlib" not in (result.stdout + result.stderr).lower()
        assert_checkpoint(runs_dir / run_name)
        listed = subprocess.run(
            ["docker", "compose", "ps", "-a", "-q"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        inspected = docker_api.inspect_container(listed[0])
        assert inspected["State"]["ExitCode"] == 0
        assert_hardened(inspected, run_name)
        INSPECTED["compose"] = settings_of(inspected)
    finally:
        subprocess.run(["docker", "compose", "rm", "-f", "-s"], cwd=ROOT, env=env, capture_output=True)
    if "invoke" in INSPECTED:
        assert INSPECTED["invoke"] == INSPECTED["compose"]


def test_parser_agrees_with_docker_compose_config(session_env) -> None:
    dotenv.write(ROOT, dotenv.settings("cpu"))
    result = subprocess.run(
        ["docker", "compose", "--profile", "cpu", "--profile", "rocm", "--profile", "cuda", "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    reference, project = json.loads(result.stdout)["services"], json.loads(result.stdout)["name"]
    for name in flavors.NAMES:
        ours = compose.service(name, dotenv.variables(dotenv.settings("cpu")), ROOT)
        theirs = reference[name]
        assert ours.project == project, "compose's project name: the checkout folder's, normalized"
        assert ours.image == theirs["image"] and ours.user == theirs["user"]
        assert ours.network_mode == theirs["network_mode"] and ours.restart == theirs["restart"]
        assert ours.shm_size == int(theirs["shm_size"])
        assert ours.group_add == [str(g) for g in theirs.get("group_add", [])]
        assert ours.devices == [f"{d['source']}:{d['target']}:{d.get('permissions', 'rwm')}" for d in theirs.get("devices", [])]
        assert ours.environment == theirs["environment"]
        assert ours.build["args"] == theirs["build"]["args"]
        binds = [(v["source"], v["target"], bool(v.get("read_only"))) for v in theirs["volumes"] if v["type"] == "bind"]
        assert [(b["source"], b["target"], b["read_only"]) for b in ours.binds] == binds
        named = [v["target"] for v in theirs["volumes"] if v["type"] == "volume"]
        assert [v["target"] for v in ours.named_volumes] == named
        assert ours.stop_grace_s == compose.parse_duration(theirs["stop_grace_period"])
        assert (ours.cap_drop, ours.security_opt, ours.read_only) == (theirs["cap_drop"], theirs["security_opt"], True)
        assert (ours.tmpfs, ours.pids_limit, ours.mem_limit) == (theirs["tmpfs"], theirs["pids_limit"], int(theirs["mem_limit"]))
        devices = ((theirs.get("deploy") or {}).get("resources") or {}).get("reservations", {}).get("devices", [])
        assert [(r["Driver"], r["Count"], r["Capabilities"]) for r in ours.device_requests] == [
            (d["driver"], -1 if d["count"] in ("all", -1) else int(d["count"]), [d["capabilities"]]) for d in devices
        ]


def test_device_passthrough_and_groups_with_stand_in_nodes(
    docker_api, cpu_image, tmp_path: Path, session_env, monkeypatch
) -> None:
    if os.getuid() != 0:
        pytest.skip("mknod needs root")
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    nodes = {dev / "kfd": 4242, dev / "dri" / "card0": 4343, dev / "dri" / "renderD128": 4242}
    for node, gid in nodes.items():
        os.mknod(node, 0o20660, os.makedev(1, 3))
        os.chmod(node, 0o660)  # crw-rw---- as udev makes them (mknod applies the umask)
        os.chown(node, 0, gid)
    monkeypatch.setenv("TRAINBOX_KFD_DEVICE", str(dev / "kfd"))
    monkeypatch.setenv("TRAINBOX_DRI_DEVICE", str(dev / "dri"))
    values = dotenv.settings("rocm")
    assert (values["TRAINBOX_RENDER_GID"], values["TRAINBOX_VIDEO_GID"]) == ("4242", "4343")
    service = compose.service("rocm", dotenv.variables(values), ROOT)
    launch.check_devices(service)
    service.image = cpu_image["tag"]
    service.binds, service.named_volumes, service.healthcheck = [], [], None
    # Opened for reading and writing as the non-root user, with every capability dropped (CapBnd 0, NoNewPrivs 1):
    # the device cgroup and the numeric groups are what let the user in.
    service.command = [
        "sh",
        "-c",
        "stat -c '%n %F %t:%T' /dev/kfd /dev/dri/renderD128 && grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status"
        " && for node in /dev/kfd /dev/dri/renderD128 /dev/dri/card0; do : <>$node && echo opened $node; done && id -G",
    ]
    kwargs = launch.create_kwargs(service, {})
    container = docker_api.create_container(
        host_config=docker_api.create_host_config(**launch.host_config_kwargs(service)), **kwargs
    )
    try:
        docker_api.start(container["Id"])
        status = docker_api.wait(container["Id"], timeout=60)["StatusCode"]
        out = docker_api.logs(container["Id"]).decode()
    finally:
        docker_api.remove_container(container["Id"], force=True)
    assert status == 0, out
    assert "/dev/kfd character special file 1:3" in out
    assert all(f"{field}:\t0000000000000000" in out for field in ("CapEff", "CapBnd")) and "NoNewPrivs:\t1" in out
    assert all(f"opened /dev/{node}" in out for node in ("kfd", "dri/renderD128", "dri/card0")), out
    assert "/dev/dri/renderD128 character special file 1:3" in out
    assert {"4242", "4343"} <= set(out.strip().splitlines()[-1].split())


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["train", "--flavor", "rocm"], {"TRAINBOX_KFD_DEVICE": "/nonexistent/kfd"}, "/nonexistent/kfd missing"),
        (["train", "--flavor", "cpu", "--data", "/nonexistent/data"], {}, "dataset /nonexistent/data not found"),
        (["train", "--flavor", "cpu"], {"DOCKER_HOST": "unix:///nonexistent.sock"}, "Docker daemon not reachable"),
        (["train", "--flavor", "cpu", "--set", "epochs"], {}, "--set expects KEY=VALUE"),
        (["build", "--flavor", "gpu"], {}, "--flavor must be one of"),
        (["train", "--flavor", "cpu", "--name", "a/b"], {}, "--name 'a/b': use letters, digits"),
        (["train", "--flavor", "cpu", "--name", ".."], {}, "--name '..': use letters, digits"),
    ],
)
def test_user_errors_are_one_line(args: List[str], env: Dict[str, str], message: str, session_env) -> None:
    result = invoke(args, {**os.environ, **env}, timeout=120)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_running_container_of_the_run_is_a_one_line_error(docker_api, cpu_image, run_name: str, session_env) -> None:
    """A stopped one is replaced (tests/container/test_watchdog.py); a running one has the run's supervisor."""
    name = f"{launch.project(ROOT)}-{run_name}"  # the checkout's compose project (its folder's name), then the run
    running = docker_api.create_container(cpu_image["tag"], ["sh", "-c", "sleep 120"], name=name, labels=run_labels(run_name))
    docker_api.start(running["Id"])
    result = invoke(["train", "--flavor", "cpu", "--name", run_name], dict(os.environ), timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"trainbox: error: container {name} is running")
    assert not (ROOT / "runs" / run_name).exists(), "a refused run must not leave a run directory"


def test_missing_image_names_the_build_command(docker_api) -> None:
    with pytest.raises(UserError, match=r"image trainbox:no-such-tag not found: run `invoke build --flavor cpu`"):
        engine.image(docker_api, "trainbox:no-such-tag", "cpu")


def test_invoke_train_from_a_users_folder_with_train_py(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env, tmp_path: Path
) -> None:
    """invoke finds tasks.py through --search-root; the user's train.py and train/ beside it change nothing."""
    folder = tmp_path / "project"
    (folder / "train").mkdir(parents=True)
    (folder / "train.py").write_text("raise SystemExit('the user train.py was imported')\n")
    (folder / "train" / "__init__.py").write_text("raise SystemExit('the user train/ package was imported')\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "invoke",
            "--search-root",
            str(ROOT),
            "train",
            "--flavor",
            "cpu",
            "--name",
            run_name,
            "--supervisor",
            FAST_SUPERVISOR,
            "--set",
            "epochs=1",
        ],
        cwd=folder,
        env=env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "was imported" not in result.stdout + result.stderr
    assert_checkpoint(runs_dir / run_name)


def _export(folder: Path, layout: str) -> Path:
    """The demo dataset rearranged as a real export: an absolute path: (Ultralytics' own exports) or
    Roboflow's ../train/images beside a data.yaml; returns the YAML's path."""
    subprocess.run([sys.executable, "-m", "trainbox", "demo-data", str(folder / "demo"), *SMALL_DEMO_DATA], check=True, cwd=ROOT)
    demo = folder / "demo"
    if layout == "absolute path:":
        yaml_file = folder / "configs" / "data.yaml"
        yaml_file.parent.mkdir()
        yaml_file.write_text(f"path: {demo}\ntrain: images/train\nval: images/val\nnames: {{0: box}}\n")
        return yaml_file
    for split, name in (("train", "train"), ("val", "valid")):
        for kind in ("images", "labels"):
            (folder / "export" / name).mkdir(parents=True, exist_ok=True)
            (demo / kind / split).rename(folder / "export" / name / kind)
    yaml_file = folder / "export" / "data.yaml"
    yaml_file.write_text("train: ../train/images\nval: ../valid/images\nnc: 1\nnames: [box]\n")
    return yaml_file


@pytest.mark.parametrize("layout", ["absolute path:", "roboflow ../"])
def test_invoke_train_on_a_users_export(
    docker_api, cpu_image, runs_dir: Path, run_name: str, session_env, tmp_path: Path, layout: str
) -> None:
    """The YAML works unchanged inside: what it names is mounted read-only at the same paths (#19 item 14)."""
    yaml_file = _export(tmp_path, layout)
    result = invoke(
        [
            "train",
            "--flavor",
            "cpu",
            "--name",
            run_name,
            "--data",
            str(yaml_file),
            "--supervisor",
            FAST_SUPERVISOR,
            "--set",
            "epochs=1",
            "--set",
            "imgsz=64",
        ],
        env_with(session_env, TRAINBOX_RUNS_HOST=str(runs_dir)),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert_checkpoint(runs_dir / run_name)
    assert [e["event"] for e in events(runs_dir / run_name)] == ["start", "device", "exit"], "no crash, no restart"
    mounts = {m["Destination"]: m for m in container_of(docker_api, run_name)["Mounts"]}
    assert str(tmp_path) not in mounts, "only the dataset's folders, never the folder around them"
    assert all(not m["RW"] for d, m in mounts.items() if d.startswith(str(tmp_path)))
