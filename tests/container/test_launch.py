"""What `invoke train` checks and mounts, decided on the host without Docker (train/container/launch.py); and, on
the real Docker Engine, how `invoke stop/logs/status` find a run's container that Docker is still creating."""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import docker
import pytest

from tests.rundir.hostile import Outside
from trainbox.container import launch
from trainbox.errors import UserError
from trainbox.rundir.layout import RunDir
from trainbox.yolo import args, dataset

from .conftest import LOCAL_BASES, ROOT, containers_of, invoke, run_labels


def split_dirs(root: Path, *relative: str) -> None:
    for name in relative:
        (root / name).mkdir(parents=True)


def test_mounts_are_the_dataset_folders_and_the_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    split_dirs(tmp_path / "parts", "images/train", "images/val", "labels/train", "labels/val")
    split_dirs(tmp_path / "extra", "images")
    yaml_file = tmp_path / "data.yaml"  # in the home directory itself, as `--data ~/data.yaml` would be
    yaml_file.write_text(
        f"path: {tmp_path / 'parts'}\ntrain: [images/train, {tmp_path / 'extra' / 'images'}]\nval: images/val\nnames: [a]\n"
    )
    mounts = launch.dataset_mounts(dataset.resolve(str(yaml_file)))
    assert mounts == [yaml_file, tmp_path / "extra", tmp_path / "parts"]


def test_a_dataset_laid_out_in_the_home_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    split_dirs(tmp_path, "images/train", "images/val")
    (tmp_path / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [a]\n")
    with pytest.raises(UserError, match=r"would give the container your whole home directory; move the images"):
        launch.dataset_mounts(dataset.resolve(str(tmp_path / "data.yaml")))


def test_a_relative_path_key_is_refused_for_the_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    split_dirs(tmp_path / "ds", "images/train", "images/val")
    (tmp_path / "data.yaml").write_text("path: ds\ntrain: images/train\nval: images/val\nnames: [a]\n")
    request = launch.TrainRequest(profile="safe", flavor="cpu", root=tmp_path / "checkout", data=tmp_path / "data.yaml")
    with pytest.raises(UserError, match="its relative path: is taken from the folder training runs in"):
        launch.prepare(request)


def inspected_after_restart(run_dir: Path, count: int) -> dict:
    return {
        "RestartCount": count,
        "State": {"StartedAt": "2026-11-23T18:20:05.123456789Z", "Running": True, "Restarting": False},
        "HostConfig": {"RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 3}},
        "Config": {"Labels": {"io.trainbox.run-dir": str(run_dir)}},
    }


def test_a_restart_is_one_line_with_the_reason_from_the_runs_history(tmp_path: Path) -> None:
    """`invoke train` follows a run through Docker's restarts; the line names a hang the health check ended."""
    before = {"RestartCount": 0, "State": {"StartedAt": "2026-11-23T18:10:00.5Z"}}
    started = launch._unix(before["State"]["StartedAt"])
    assert started == 1795457400
    crashed = launch._restart_line(inspected_after_restart(tmp_path, 1), before)
    assert crashed == (
        "trainbox: container restarted by Docker (restart 1 of 3): its supervisor exited (a crash or a kill); "
        "the run resumes from its last checkpoint"
    )
    run = RunDir(tmp_path)
    hang = {"event": "supervisor_hung", "ts": started + 70, "attempt": 0, "age_s": 71.4}
    hang["incident"] = "/runs/r/incidents/20261123181000-supervisor.txt"  # as the container sees it
    run.events.write_text(json.dumps(hang) + "\n")
    line = launch._restart_line(inspected_after_restart(tmp_path, 2), before)
    report = run.supervisor_hang(20261123181000)
    assert line.startswith(
        f"trainbox: container restarted by Docker (restart 2 of 3): its supervisor hung (state.json not updated for 71 s; "
        f"stacks in {report})"
    ), line
    older = launch._restart_line(inspected_after_restart(tmp_path, 2), {"State": {"StartedAt": "2026-11-23T18:20:00Z"}})
    assert "exited (a crash or a kill)" in older, "a hang before the last start is not this restart's reason"


class RestartedContainer:
    """The daemon's answers while a container is restarted by its policy, as `invoke train` saw them in CI: the log
    stream ends on a progress bar's unended draw, and the inspection taken then still shows the old start running."""

    def __init__(self, run_dir: Path) -> None:
        first = {"RestartCount": 0, "State": {"StartedAt": "2026-11-23T18:10:00Z", "Running": True, "Restarting": False}}
        restarted = inspected_after_restart(run_dir, 1)
        last = {
            **restarted,
            "State": {"StartedAt": "2026-11-23T18:20:05Z", "Running": False, "Restarting": False, "ExitCode": 0},
            "Config": {**restarted["Config"], "Hostname": "c0ffee"},  # the final exit as recorded: none here
        }
        self.inspections = [first, first, restarted, last]
        self.streams = [[b"Epoch 1/5 ...\n", b"\r  3/10 [00:02<00:05]"], [], [b"Resuming training\n"]]
        self.since: List[object] = []

    def inspect_container(self, container_id: str) -> dict:
        return self.inspections.pop(0)

    def logs(self, container_id: str, stream: bool, follow: bool, since: object) -> Iterator[bytes]:
        self.since.append(since)
        yield from self.streams.pop(0)


def test_a_restart_seen_late_is_said_once_on_a_line_of_its_own(tmp_path: Path) -> None:
    client = RestartedContainer(tmp_path)
    out = io.StringIO()
    assert launch.stream_logs(client, "c0ffee", out) == 0  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    restarts = [line for line in lines if line.startswith("trainbox: container restarted by Docker")]
    assert len(restarts) == 1 and "(restart 1 of 3)" in restarts[0], lines
    assert lines.index(restarts[0]) == lines.index("Resuming training") - 1, lines
    assert client.since[2] == launch._unix("2026-11-23T18:20:05Z"), "the new start's output from its first line"


class StoppedContainer:
    """The two calls ``_retire`` makes of Docker's API client, for a stopped container whose output is two chunks."""

    def __init__(self) -> None:
        self.removed: List[str] = []

    def logs(self, container_id: str, stream: bool, follow: bool) -> Iterator[bytes]:
        yield b"epoch 1 ...\n"
        yield b"epoch 2 ...\n"

    def remove_container(self, container_id: str) -> None:
        self.removed.append(container_id)


def test_a_logs_link_made_by_the_container_is_never_written_through(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 33 item 1: the container can make ``logs -> ../../elsewhere`` in its run directory; replacing the
    stopped container then saved its output into that host folder (``.bashrc.d``, say)."""
    outside = Outside(tmp_path / "outside").create()
    before = outside.snapshot()
    run = RunDir(tmp_path / "runs" / "r")
    run.root.mkdir(parents=True)
    run.container_log.directory.symlink_to(os.path.relpath(outside.folder, run.root))
    client = StoppedContainer()
    assert launch._retire(client, "c0ffee", "trainbox-r", run) is None  # type: ignore[arg-type]
    outside.assert_intact(before)
    assert client.removed == ["c0ffee"], "the container is replaced all the same: the run resumes"
    assert f"its output is not saved: {run.container_log.directory}: a symbolic link, refused" in capsys.readouterr().err

    run.container_log.directory.unlink()
    run.container_log.directory.mkdir()
    (run.container_log.directory / "container-0.log").write_text("an earlier one\n")
    assert launch._retire(client, "c0ffee", "trainbox-r", run) == run.container_log(1)  # type: ignore[arg-type]
    assert run.container_log(1).read_bytes() == b"epoch 1 ...\nepoch 2 ...\n"


@pytest.mark.parametrize(
    "given, message",
    [
        (
            ["--profile", "saef"],
            "unknown profile 'saef' (did you mean safe?): choose one of balanced, fast, fast-compile, safe, safe-native",
        ),
        (["--set", "epochs=abc"], "epochs=abc: expected int"),
        (["--set", "nosuchkey=1"], "unknown argument 'nosuchkey'"),
        (["--set", "data=/tmp/data.yaml"], "--set data=: the dataset is --data PATH"),
        (["--supervisor", "--stall-timeout abc"], "--supervisor: argument --stall-timeout: expected a number, got 'abc'"),
        (["--supervisor", "--backoff 10 --backoff-max 1"], "--supervisor: --backoff-max (1) must be >= --backoff (10)"),
    ],
    ids=["profile", "value", "key", "data", "supervisor-value", "supervisor-combination"],
)
def test_invoke_train_refuses_bad_input_before_making_anything(tmp_path: Path, given: List[str], message: str) -> None:
    """One line, exit 2, and nothing made: no run directory, and not even the engine asked (it is unreachable here,
    and a request that got that far would end in "Docker daemon not reachable"), so no container or image."""
    runs = tmp_path / "runs"
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock", "TRAINBOX_RUNS_HOST": str(runs)}
    result = invoke(["train", *given], env, timeout=120)  # no --flavor: no note about the flavor chosen either
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbox: error: ") and message in lines[0], result.stderr
    assert not runs.exists()


def test_the_host_checks_against_the_images_ultralytics_without_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host extra has no Ultralytics: `--set` is checked against the pinned copy (env/ultralytics-cfg), never the install."""

    def not_installed() -> Path:
        raise args.OverrideError("ultralytics is not installed")

    monkeypatch.setattr(args, "default_cfg_path", not_installed)
    launch.check_arguments("safe", ["epochs=5", "model=yolov8s.yaml", "amp=false"], ["--stall-timeout", "60"])
    with pytest.raises(UserError, match=r"imgsz=\[1, 2\]: must be a whole number from 32 to 8192"):
        launch.check_arguments("safe", ["imgsz=[1, 2]"], [])


def test_a_failed_run_points_only_at_what_exists(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "safe-20261124-2340")
    run.root.mkdir()
    logs = "see `invoke logs --run safe-20261124-2340`"
    assert launch.failed_line(3, run.root) == f"error: the training container exited with 3: {logs}"
    run.events.write_text("{}\n")
    assert launch.failed_line(3, run.root).endswith(f"{logs} and the run's history, {run.events}")


@contextlib.contextmanager
def created_slowly(docker_api, run: str, volume: str) -> Iterator[threading.Thread]:
    """Create (never start) a container of run ``run`` whose creation takes seconds, in a thread: Docker copies the
    base image's /usr into the new, empty volume mounted there, as it fills a run's new cache volumes from the image.
    The container and the volume are removed afterwards."""
    host_config = docker_api.create_host_config(binds={volume: {"bind": "/usr", "mode": "rw"}}, network_mode="none")
    image, labels = LOCAL_BASES["CUDA_BASE_IMAGE"], run_labels(run)
    creating = threading.Thread(
        target=lambda: docker_api.create_container(image, ["true"], labels=labels, host_config=host_config)
    )
    creating.start()
    try:
        yield creating
    finally:
        creating.join()
        for container in containers_of(docker_api, run):  # before the next attempt lists
            docker_api.remove_container(container["Id"], force=True)
        docker_api.remove_volume(volume, force=True)


def listed_before_created(docker_api, run: str, creating: threading.Thread) -> Optional[str]:
    """The id of run ``run``'s container if Docker lists it before it answers for it, else None."""
    listed: List[Dict[str, Any]] = []
    while not listed and creating.is_alive():
        listed = containers_of(docker_api, run)
    if not listed:
        return None
    try:
        docker_api.inspect_container(listed[0]["Id"])
    except docker.errors.NotFound:
        return listed[0]["Id"]
    return None


def test_a_container_listed_while_docker_still_creates_it_is_waited_for(docker_api, run_name: str) -> None:
    """`invoke stop`, `logs` and `status` find a run's container by listing, and Docker lists it seconds before it
    answers for it: found in that window, it is waited for, not an error that ends the command in a traceback."""
    for attempt in range(3):  # until the window is seen: a creation can be over before the first listing
        with created_slowly(docker_api, run_name, f"trainbox-test-creating-{os.getpid()}-{attempt}") as creating:
            listed = listed_before_created(docker_api, run_name, creating)
            if listed is not None:
                found = launch.find(docker_api, ROOT, run_name)
                assert found["Id"] == listed and docker_api.inspect_container(listed)["State"]["Status"] == "created"
                return
    pytest.fail("in 3 creations Docker never listed the container before it answered for it: nothing was tested")


def test_invoke_train_names_a_new_run_by_its_profile_and_resume_goes_on_with_the_newest(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    request = launch.TrainRequest(profile="safe", flavor="cpu", root=tmp_path, resume=True)
    with pytest.raises(UserError, match=r"^--resume: no run of `safe` under .*runs/ to go on with"):
        launch.prepare(request)
    for name in ("safe-20261128-101010", "safe-20261129-080000", "fast-20301231-000000"):
        (runs / name).mkdir(parents=True)
    assert launch._chosen_run(request, runs) == "safe-20261129-080000"
    new = launch.TrainRequest(profile="safe", flavor="cpu", root=tmp_path)
    fresh = launch._chosen_run(new, runs)
    assert fresh.startswith("safe-") and not os.listdir(runs / fresh), "a new run's directory is made as it is named"
    assert launch._chosen_run(new, runs) != fresh, "a second new run in the same second gets a directory of its own"
    before = sorted(os.listdir(runs))
    with pytest.raises(UserError):
        launch.prepare(launch.TrainRequest(profile="safe", flavor="cpu", root=tmp_path, data=tmp_path / "no-such-data"))
    assert sorted(os.listdir(runs)) == before, "a request refused for what the user gave makes no run directory"
