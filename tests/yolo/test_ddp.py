"""``trainbox run ... device=0,1``: what reaches Ultralytics' DDP ranks, checked on a machine without GPUs.

Ultralytics launches DDP itself: ``generate_ddp_command`` pickles the trainer's
class, arguments, model and callbacks and writes a script that
``torch.distributed.run`` starts once per rank. Without GPUs the ranks cannot
train (Ultralytics' DDP setup is CUDA only), so the test makes the launcher as
``device=0,1`` makes it on a two-GPU machine (``ddp``, ``world_size=2``),
generates the real command and script, and runs that script under a real
torchrun with 2 ranks, its last line (``trainer.train()``) replaced by a probe
of what each rank's trainer got.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.supervised import REPO
from tests.yolo.conftest import child_env
from trainbox.rundir.layout import RunDir

pytestmark = pytest.mark.training  # builds yolov8n and reads the demo data in Ultralytics

LAUNCHER = """
import json, os, sys
from pathlib import Path
from trainbox.yolo import profiles
from trainbox.rundir.layout import RunDir
from trainbox.yolo import offline
from trainbox.yolo.settings import from_profile

run = RunDir(Path(sys.argv[1]))
offline.install_network_guard(run.network_log)  # as trainbox.yolo.runner prepares the launcher
offline.prepare_environment(run.ultralytics)
from ultralytics.utils.dist import generate_ddp_command
from trainbox.yolo.trainer import ProfiledDetectionTrainer

settings = from_profile(profiles.load("balanced"), {}, 120.0, run.network_log)
settings.publish()
overrides = dict(data=sys.argv[2], model="yolov8n.yaml", device="cpu", imgsz=64, batch=8, project=str(run.train.parent),
                 name=run.train.name, exist_ok=True)
trainer = ProfiledDetectionTrainer(overrides=overrides, settings=settings)
trainer.model = trainer.get_model(cfg="yolov8n.yaml")  # as YOLO.train does
trainer.ddp, trainer.world_size = True, 2  # what device=0,1 sets on a machine with two GPUs
trainer.hand_over_to_ranks()  # what ProfiledDetectionTrainer.train does before Ultralytics' DDP launch
cmd, script = generate_ddp_command(trainer)
print(json.dumps({"cmd": cmd, "script": script, "env": dict(os.environ)}))
"""

#: Replaces the generated script's ``trainer.train()``: what this rank's trainer got.
PROBE = """
    import json as _json, os as _os
    from trainbox import heartbeat as _heartbeat
    from trainbox.yolo import offline as _offline
    _heartbeat.beat("setup", force=True)
    _names = {e: [getattr(f, "__qualname__", "") for f in fs] for e, fs in trainer.callbacks.items()}
    _line = "PROBE " + _json.dumps({
        "rank": int(_os.environ["RANK"]), "class": type(trainer).__name__, "settings": _os.environ["TRAIN_RUN_SETTINGS"],
        "workers": trainer.args.workers, "start_method": trainer.settings.multiprocessing_context,
        "offline": _os.environ.get("YOLO_OFFLINE"), "guard": str(_offline._guard_log),
        "batch_end": [n for n in _names["on_train_batch_end"] if n.startswith(("TrainingBeats", "MidEpoch"))],
    }) + "\\n"
    # One write of the whole line: both ranks share the pipe, and print() under PYTHONUNBUFFERED writes the text and
    # its newline apart, so the two ranks' lines could interleave ("PROBE {...}PROBE {...}"). A write of under
    # PIPE_BUF bytes (4096 on Linux) to a pipe is atomic.
    _bytes = _line.encode()
    assert len(_bytes) < 4096
    _os.write(1, _bytes)
"""


def probes(output: str) -> List[Dict[str, Any]]:
    return sorted((json.loads(line[len("PROBE ") :]) for line in output.splitlines() if line.startswith("PROBE ")), key=str)


def test_every_ddp_rank_rebuilds_the_profiled_trainer_with_the_launchers_settings(demo_data: Path, tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    launcher = [sys.executable, "-c", LAUNCHER, str(run.root), str(demo_data)]
    launched = subprocess.run(launcher, env=child_env(run.root), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr
    generated = json.loads(launched.stdout.strip().splitlines()[-1])
    cmd, script = generated["cmd"], Path(generated["script"])
    assert cmd[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node"] and cmd[4] == "2"
    assert cmd[5] == "--master_port" and cmd[7] == str(script)
    assert script.parent == run.ultralytics / "Ultralytics" / "DDP", "in the run's own Ultralytics directory"
    text = script.read_text()
    assert text.rstrip().endswith("trainer.train()")
    script.write_text(text.rstrip()[: -len("trainer.train()")].rstrip() + "\n" + PROBE)

    # Ultralytics runs the command from the launcher, whose environment torchrun passes on to every rank.
    ranks = subprocess.run(cmd, env=generated["env"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ranks.returncode == 0, ranks.stdout + ranks.stderr
    found = probes(ranks.stdout)
    assert [p["rank"] for p in found] == [0, 1], ranks.stdout
    for probe in found:
        assert probe["class"] == "ProfiledDetectionTrainer"
        assert probe["settings"] == generated["env"]["TRAIN_RUN_SETTINGS"]
        assert probe["workers"] == 2 and probe["start_method"] == "spawn", (
            "the balanced profile's loader, not Ultralytics' 0 on CPU"
        )
        assert probe["offline"] == "1" and probe["guard"] == str(run.network_log), "offline, with the network guard installed"
        assert sorted(probe["batch_end"]) == ["MidEpoch.on_train_batch_end", "TrainingBeats.on_train_batch_end"], "each once"
        beat = json.loads(run.rank_heartbeat(probe["rank"]).read_text())
        assert beat["rank"] == probe["rank"] and beat["world_size"] == 2 and beat["phase"] == "setup"
    assert not run.network_log.exists()
