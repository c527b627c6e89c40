"""KEY=VALUE validation on the host, and the child's own one-line refusals."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tests.supervised import REPO
from tests.yolo.conftest import run_child
from trainbox.container import envfiles
from trainbox.errors import UserError
from trainbox.yolo.args import PINNED_DIR, installed, pinned, validate_overrides, write_pinned


def test_valid_overrides_come_back_typed(demo_data: Path) -> None:
    got = validate_overrides([f"data={demo_data}", "epochs=3", "imgsz=64", "batch=0.5", "lr0=1", "val=false", "device=cpu"])
    assert got == {
        "data": str(demo_data.resolve()),
        "epochs": 3,
        "imgsz": 64,
        "batch": 0.5,
        "lr0": 1,
        "val": False,
        "device": "cpu",
    }


def test_relative_data_path_becomes_absolute(demo_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(demo_data.parent.parent)
    relative = Path(demo_data.parent.name) / demo_data.name
    assert validate_overrides([f"data={relative}"])["data"] == str(demo_data.resolve())


@pytest.mark.parametrize(
    "pairs, message",
    [
        (["epochs=3"], "data= is required"),
        (["data=/no/such/data.yaml"], "no such file"),
        (["{data}", "epochs=three"], "epochs=three: expected int"),
        (["{data}", "val=3"], "val=3: expected bool"),
        (["{data}", "bogus=1"], "unknown argument 'bogus'"),
        (["{data}", "project=/tmp/x"], "project= is set by trainbox"),
        (["{data}", "resume=true"], "resume= is set by trainbox"),
        (["{data}", "save=false"], "save=False"),
        (["{data}", "model=yolov8n.pt"], "never downloads weights"),
        (["{data}", "device=0,1"], "one device per run"),
        (["{data}", "epochs"], "expected KEY=VALUE"),
        (["{data}", "epochs=2", "epochs=3"], "given twice"),
        (["{data}", "epochs=-5"], "epochs=-5: must be a whole number from 1 to 100000"),
        (["{data}", "epochs=100000000000000000000"], "must be a whole number from 1 to 100000"),
        (["{data}", "imgsz=-640"], "imgsz=-640: must be a whole number from 32 to 8192"),
        (["{data}", "imgsz=[640,-1]"], "must be a whole number from 32 to 8192"),
        (["{data}", "workers=-1"], "workers=-1: must be a whole number from 0 to 256"),
        (["{data}", "save_period=-2"], "save_period=-2: must be a whole number from -1 to 100000"),
        (["{data}", "batch=0"], "batch=0: must not be 0"),
        (["{data}", "amp=yes"], "amp=yes: expected true, false or one of auto, fp16, bf16, fp32"),
        (["data={data_dir}"], "is a folder; give the path of its dataset YAML (its data.yaml?)"),
    ],
)
def test_bad_overrides_are_one_clear_line(demo_data: Path, pairs: list, message: str) -> None:
    with pytest.raises(UserError) as caught:
        validate_overrides([p.replace("{data}", f"data={demo_data}").replace("{data_dir}", str(demo_data.parent)) for p in pairs])
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_data_yaml_without_splits_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "data.yaml"
    bad.write_text("names: {0: a}\n")
    with pytest.raises(UserError, match="missing train, val"):
        validate_overrides([f"data={bad}"])


def test_shipped_model_yaml_is_accepted(demo_data: Path) -> None:
    assert validate_overrides([f"data={demo_data}", "model=yolov8n.yaml"])["model"] == "yolov8n.yaml"


def test_the_pinned_copy_is_the_images_ultralytics(tmp_path: Path) -> None:
    """env/ultralytics-cfg/ holds what `invoke train` checks --set against on a host without Ultralytics: the pinned
    version's default.yaml and model YAMLs, byte for byte (this environment installs the same pin)."""
    assert importlib.metadata.version("ultralytics") == envfiles.stack()["ULTRALYTICS_VERSION"]
    for name in ("default.yaml", "models.txt"):
        fresh = (write_pinned(tmp_path) / name).read_bytes()
        assert fresh == (PINNED_DIR / name).read_bytes(), (
            f"env/ultralytics-cfg/{name} is stale: run `python -m trainbox.yolo.args`"
        )
    assert pinned() == installed()


def test_args_module_stays_host_side() -> None:
    code = (
        "import sys, trainbox.yolo.args as a, trainbox.yolo.runner, trainbox.yolo.settings\n"
        "a.load_defaults()\n"
        "bad = [m for m in ('torch', 'ultralytics', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize(
    "profile, pairs, message",
    [
        ("nonesuch", ["{data}"], "unknown profile 'nonesuch'"),
        ("safe", ["data=/no/such.yaml"], "no such file"),
        ("safe", ["{data}", "epochs=x"], "epochs=x: expected int"),
    ],
)
def test_child_refuses_bad_input_with_one_line(tmp_path: Path, demo_data: Path, profile: str, pairs: list, message: str) -> None:
    done = run_child(tmp_path / "run", profile, [p.replace("{data}", f"data={demo_data}") for p in pairs], timeout=60)
    assert done.code == 2
    assert done.output.strip().splitlines() == [done.output.strip()]
    assert message in done.output and "Traceback" not in done.output
    assert not (tmp_path / "run" / "heartbeat.json").exists()
