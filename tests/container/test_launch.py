"""What `invoke train --data` mounts, decided on the host without Docker (train/container/launch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.container import launch
from trainbox.errors import UserError
from trainbox.yolo import dataset


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
