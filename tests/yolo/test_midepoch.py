"""Mid-epoch checkpoints: a run killed inside an epoch continues with the very next unseen batch.

Every run trains yolov8n.yaml for real on CPU (64 demo images of 64 px, batch
8: 8 batches an epoch, 2 epochs, the first one all warm-up) and records, via
``TRAIN_SAMPLE_LOG``, each sample it loads and each batch it trains.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from tests.supervised import REPO, Finished, start_cli, survivors, train_cli, wait_for
from tests.yolo.conftest import load_checkpoint
from trainbox import heartbeat
from trainbox.rundir.layout import RunDir
from trainbox.yolo.demo_data import write_demo_dataset

ARGS = ("epochs=2", "imgsz=64", "batch=8", "nbs=16", "mosaic=0.0", "plots=False", "device=cpu")
MID = "midepoch_checkpoint_batches: 2\n"
PROFILES = {
    "mid": "safe.yaml",
    "four": "fast.yaml",
    "zero": "safe.yaml",
    "asked": "safe.yaml",
}
EXTRA = {
    "mid": MID + "startup_fallback: null\n",
    "four": MID + "fallback: zero\n",
    "zero": MID + "startup_fallback: null\n",
    "asked": "midepoch_checkpoint_s: 0\nstartup_fallback: null\n",  # mid-epoch checkpoints only when asked for
}

pytestmark = pytest.mark.training  # every test here trains Ultralytics for real


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("mid-data"), train=64, val=8, imgsz=64)


@pytest.fixture(scope="module")
def profiles_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("profiles")
    for name, base in PROFILES.items():
        text = (REPO / "env" / "profiles" / base).read_text()
        kept = [line for line in text.splitlines() if not line.startswith(("fallback:", "startup_fallback:"))]
        (directory / f"{name}.yaml").write_text("\n".join(kept) + "\n" + EXTRA[name])
    shutil.copy(REPO / "env" / "profiles" / "safe-native.yaml", directory)
    return directory


def run(run_dir: Path, profile: str, profiles_dir: Path, data: Path, fault: str = "") -> Finished:
    args = [
        "run", "--profile", profile, "--profiles-dir", str(profiles_dir), "--run-dir", str(run_dir),
        "--stall-timeout", "30", "--startup-timeout", "180", "--backoff", "0.2",
        "--ladder-policy", "down",  # the fallback itself is tested here; the cost policy may stay after one cheap stall
        f"data={data}", *ARGS,
    ]  # fmt: skip
    env = {"TRAIN_FAULT": fault, "TRAIN_SAMPLE_LOG": str(run_dir / "samples.log")}
    done = train_cli(args, run_dir=run_dir, env=env, timeout=600)
    assert done.code == 0, (done.stdout + done.stderr)[-4000:]
    assert survivors(run_dir) == []
    return done


Entry = Tuple[str, int, int, int, List[str]]


def log(done: Finished) -> List[Entry]:
    """(kind, epoch, batch-or-index, attempt, files) per line of the sample log."""
    entries = []
    for line in (done.run_dir / "samples.log").read_text().splitlines():
        kind, epoch, number, attempt, *files = line.split()
        entries.append((kind, int(epoch), int(number), int(attempt), files))
    return entries


def trained(done: Finished) -> Dict[Tuple[int, int], List[str]]:
    """Which images each (epoch, batch) trained on; a batch trained again after a restart replaces the first."""
    return {(e, b): files for kind, e, b, _, files in log(done) if kind == "train"}


def first_resumed_batch(done: Finished, attempt: int) -> Tuple[int, int]:
    return next((e, b) for kind, e, b, a, _ in log(done) if kind == "train" and a == attempt)


def loaded(done: Finished, attempt: int, epoch: int) -> Set[str]:
    return {files[0] for kind, e, _, a, files in log(done) if kind == "load" and a == attempt and e == epoch}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, profiles_dir: Path, data: Path) -> Finished:
    return run(tmp_path_factory.mktemp("whole") / "run", "mid", profiles_dir, data)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory, profiles_dir: Path, data: Path) -> Finished:
    fault = "sigkill@train_batch,attempt=0,epoch=1,batch=7"
    return run(tmp_path_factory.mktemp("killed") / "run", "mid", profiles_dir, data, fault)


def test_resumed_run_sees_the_same_samples_in_the_same_order(uninterrupted: Finished, killed: Finished) -> None:
    whole = trained(uninterrupted)
    assert sorted(whole) == [(e, b) for e in range(2) for b in range(8)]
    assert trained(killed) == whole
    assert killed.kinds() == ["start", "device", "crash", "restart", "start", "device", "exit"]
    epoch, batch = first_resumed_batch(killed, attempt=1)
    assert epoch == 0 and 2 <= batch <= 6, "continued inside the first epoch from its last mid-epoch checkpoint"
    skipped = {f for (e, b), files in whole.items() if e == 0 and b < batch for f in files}
    assert not skipped & loaded(killed, attempt=1, epoch=0), "batches already trained are never loaded again"
    assert not (killed.run_dir / "train" / "weights" / "midepoch.pt").exists(), "removed once its epoch ended"


def test_resumed_run_ends_with_the_same_weights(uninterrupted: Finished, killed: Finished) -> None:
    import torch

    whole = load_checkpoint(uninterrupted.run_dir / "train" / "weights" / "last.pt")["model"].float().state_dict()
    resumed = load_checkpoint(killed.run_dir / "train" / "weights" / "last.pt")["model"].float().state_dict()
    assert whole.keys() == resumed.keys()
    worst = max((whole[k] - resumed[k]).abs().max().item() for k in whole if whole[k].is_floating_point())
    assert worst <= 1e-3, f"largest weight difference {worst}"
    assert any(not torch.equal(whole[k], torch.zeros_like(whole[k])) for k in whole)


def test_kill_during_a_midepoch_write_keeps_the_previous_checkpoint(tmp_path: Path, profiles_dir: Path, data: Path) -> None:
    done = run(tmp_path / "run", "mid", profiles_dir, data, "sigkill@midsave,attempt=0,epoch=1,batch>=4")
    (crash,) = done.of("crash")
    assert crash["last_beat"]["phase"] == "save"
    epoch, batch = first_resumed_batch(done, attempt=1)
    assert epoch == 0 and 1 <= batch < 4, "resumed from the checkpoint written before the killed one"
    weights = done.run_dir / "train" / "weights"
    assert not list(weights.glob(".midepoch.pt.*")), "the torn temporary file was cleaned up"


def test_resume_after_fallback_from_four_workers_to_none(
    tmp_path: Path, profiles_dir: Path, data: Path, uninterrupted: Finished
) -> None:
    done = run(tmp_path / "run", "four", profiles_dir, data, "sleep@train_batch,attempt=0,epoch=1,batch=7")
    assert [(s["attempt"], s["profile"]) for s in done.of("start")] == [(0, "four"), (1, "zero")]
    output = done.stdout + done.stderr
    assert "Using 4 dataloader workers" in output and "Using 0 dataloader workers" in output
    epoch, batch = first_resumed_batch(done, attempt=1)
    assert epoch == 0 and batch >= 2
    assert trained(done) == trained(uninterrupted), "the same order with 4 workers, then none"


def test_a_checkpoint_asked_for_is_written_at_the_next_optimizer_step(tmp_path: Path, profiles_dir: Path, data: Path) -> None:
    """What ``--on-slow restart`` asks before it restarts a slow attempt (trainbox.supervise.pace.watch): the trainer,
    with no mid-epoch cadence of its own, writes its mid-epoch checkpoint and beats ``checkpoint_ts``."""
    run_dir = tmp_path / "run"
    args = ["run", "--profile", "asked", "--profiles-dir", str(profiles_dir), "--run-dir", str(run_dir), "--quiet",
            "--stall-timeout", "15", "--startup-timeout", "180", f"data={data}", *ARGS]  # fmt: skip
    supervisor = start_cli(args)
    files = RunDir(run_dir)
    beat = lambda: heartbeat.read(files.heartbeat) or {}  # noqa: E731 - the child's last beat
    try:
        wait_for(lambda: beat().get("step", 0) >= 2, 300, "the second training step")
        asked = time.time()
        files.checkpoint_request.write_text("{}")
        # An epoch-end checkpoint also beats checkpoint_ts (it may come first: an epoch here lasts a few seconds);
        # the mid-epoch one says how long it took. Seen once under gradient accumulation, at the first step that
        # makes no optimizer step, the request stays asked for until the next one.

        def asked_for() -> bool:
            last = beat()  # one read: both fields from the same beat
            return last.get("checkpoint_ts", 0) >= asked and "midepoch_save_s" in last

        wait_for(lambda: asked_for() or supervisor.poll() is not None, 120, "the mid-epoch checkpoint")
        assert asked_for(), f"the run ended with no mid-epoch checkpoint; its last beat: {beat()}"
    finally:
        assert supervisor.wait(timeout=600) == 0
    said = [line for line in files.attempt_log(0).read_text().splitlines() if "mid-epoch" in line]
    assert any(line.startswith("trainbox: 1 mid-epoch checkpoint(s) written") for line in said), said
