"""The programs trainbox knows by their command, in milliseconds: where their checkpoints are, how they resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from trainbox.supervise.resume.recipes import glob_escape, option, recognise, without


@pytest.fixture(autouse=True)
def _no_ultralytics_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(tmp_path / "no-config"))
    monkeypatch.chdir(tmp_path)  # no git checkout around it either


def test_yolo_train_resumes_its_own_last_pt_not_whatever_a_search_finds() -> None:
    argv = ["yolo", "detect", "train", "model=yolov8n.yaml", "data=coco8.yaml", "epochs=3", "resume=False"]
    program = recognise(argv)
    assert program is not None and program.name == "yolo" and program.workers == "workers"
    assert program.globs == ("runs/*/train*/weights/last.pt",)
    resumed = program.resumed(argv, "/w/runs/detect/train2/weights/last.pt")
    assert resumed == [
        "yolo",
        "detect",
        "train",
        "data=coco8.yaml",
        "epochs=3",
        "resume=True",
        "model=/w/runs/detect/train2/weights/last.pt",
    ]


def test_yolo_s_project_and_name_and_its_runs_folder_say_where_last_pt_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text(json.dumps({"runs_dir": "/data/runs"}))
    monkeypatch.setenv("YOLO_CONFIG_DIR", str(config))
    program = recognise(["/usr/bin/yolo", "train", "project=exp[1]", "name=a"])
    assert program is not None and program.globs == (
        "/data/runs/*/exp[[]1]/a*/weights/last.pt",
        "runs/*/exp[[]1]/a*/weights/last.pt",
        "exp[[]1]/a*/weights/last.pt",
    )
    absolute = recognise(["yolo", "train", "project=/abs/p"])
    assert absolute is not None and absolute.globs == ("/abs/p/train*/weights/last.pt",)
    (tmp_path / ".git").mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    in_checkout = recognise(["yolo", "train"])
    assert in_checkout is not None and f"{tmp_path}/runs/*/train*/weights/last.pt" in in_checkout.globs


def test_a_trainer_script_resumes_from_its_newest_checkpoint_folder(tmp_path: Path) -> None:
    (tmp_path / "run_clm.py").write_text("parser = HfArgumentParser((ModelArguments, TrainingArguments))\n")
    (tmp_path / "train.py").write_text("args = TrainingArguments(output_dir=given.output_dir)\n")
    argv = ["python", "run_clm.py", "--output_dir", "out", "--resume_from_checkpoint", "old", "--dataloader_num_workers", "4"]
    program = recognise(argv)
    assert program is not None and (program.name, program.globs) == ("hf", ("out/checkpoint-*",))
    assert program.resumed(argv, "out/checkpoint-50") == [
        "python", "run_clm.py", "--output_dir", "out", "--dataloader_num_workers", "4",
        "--resume_from_checkpoint", "out/checkpoint-50",
    ]  # fmt: skip
    assert recognise(["torchrun", "train.py", "--output-dir=o"]).globs == ("o/checkpoint-*",)  # type: ignore[union-attr]


def test_a_script_is_taken_for_a_known_program_only_when_it_can_take_the_resume(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("parser = argparse.ArgumentParser()\nparser.add_argument('--output_dir')\n")
    assert recognise(["python", "plain.py", "--output_dir", "out"]) is None, "no Trainer arguments: no --resume_from_checkpoint"
    assert recognise(["python", "missing.py", "--output_dir", "out"]) is None
    assert recognise(["python", "plain.py", "--out_dir=o", "--init_from=scratch"]) is None, "nanoGPT's words, not its script"


def test_nanogpt_resumes_with_init_from_and_its_out_dir_from_flag_config_or_script(tmp_path: Path) -> None:
    config = tmp_path / "train_char.py"
    config.write_text("out_dir = 'out-char'\neval_interval = 250\n")
    (tmp_path / "train.py").write_text("init_from = 'scratch'\nexec(open('configurator.py').read())\n")
    argv = ["python", "train.py", str(config), "--init_from=scratch", "--max_iters=100"]
    program = recognise(argv)
    assert program is not None and program.name == "nanogpt" and program.globs == ("out-char/ckpt.pt",)
    assert program.resumed(argv, "out-char/ckpt.pt") == [
        "python",
        "train.py",
        str(config),
        "--max_iters=100",
        "--init_from=resume",
    ]
    flagged = recognise([*argv, "--out_dir=mine"])
    assert flagged is not None and flagged.globs == ("mine/ckpt.pt",)
    script = tmp_path / "train2.py"
    script.write_text("init_from = 'scratch'\nout_dir = 'o'\nexec(open('configurator.py').read())\n")
    by_text = recognise(["python3", str(script)])
    assert by_text is not None and by_text.globs == ("o/ckpt.pt",) and by_text.workers is None


def test_lightning_resumes_with_ckpt_path_where_the_script_declares_it(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text("import lightning as L\nparser.add_argument('--ckpt_path')\n")
    program = recognise(["python", str(script), "--max_epochs", "3"])
    assert program is not None and program.name == "lightning"
    assert program.globs == ("lightning_logs/*/checkpoints/*.ckpt", "checkpoints/*.ckpt")
    assert program.resumed(["python", str(script), "--ckpt_path=x"], "a.ckpt") == ["python", str(script), "--ckpt_path", "a.ckpt"]
    rooted = recognise(["python", "fit.py", "--ckpt_path", "last", "--default_root_dir", "/r"])
    assert rooted is not None and rooted.globs[0] == "/r/lightning_logs/*/checkpoints/*.ckpt"


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--lr", "0.1"],
        ["yolo", "predict", "model=x.pt"],
        ["python", "-c", "print(1)"],
        ["bash", "-c", "yolo train"],
        ["python", "missing_script.py"],
    ],
)
def test_anything_else_is_not_recognised(argv: List[str]) -> None:
    assert recognise(argv) is None


def test_options_are_read_and_removed_in_both_spellings() -> None:
    argv = ["a", "--x", "1", "--x=2", "--y", "--x"]
    assert option(argv, "--x") == "2" and option(["--x"], "--x") is None
    assert without(argv, "--x") == ["a", "--y"]
    assert glob_escape("a*b?[c]") == "a[*]b[?][[]c]"


@pytest.mark.parametrize("prefix", [["env", "VAR=1"], ["/usr/bin/env", "-u", "HOME", "A=b", "B="], ["nice", "-n", "5"]])
def test_a_program_behind_env_and_its_assignments_is_recognised_and_its_prefix_kept(prefix: List[str]) -> None:
    program = recognise([*prefix, "yolo", "train", "data=coco8.yaml"])
    assert program is not None and program.name == "yolo"
    assert program.resumed([*prefix, "yolo", "train", "data=coco8.yaml", "model=yolo11n.pt"], "/r/last.pt") == [
        *prefix,
        "yolo",
        "train",
        "data=coco8.yaml",
        "resume=True",
        "model=/r/last.pt",
    ]
    assert recognise([*prefix, "python", "train.py"]) is None
