"""Dataset YAMLs resolved on the host as Ultralytics resolves them: absolute path:, ../ references, lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainbox.errors import UserError
from trainbox.yolo import dataset


def images(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "0.jpg").write_bytes(b"")
    return folder


def test_absolute_path_key_as_ultralytics_exports_write_it(tmp_path: Path) -> None:
    root = tmp_path / "datasets" / "parts"
    train, val = images(root / "images" / "train"), images(root / "images" / "val")
    yaml_file = tmp_path / "elsewhere" / "data.yaml"
    yaml_file.parent.mkdir()
    yaml_file.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {{0: part}}\n")
    found = dataset.resolve(str(yaml_file), cwd=tmp_path)
    assert found.root == root and found.splits == {"train": [train], "val": [val]}
    assert found.paths() == [yaml_file.parent, root, train, val]


def test_roboflow_parent_references_and_lists(tmp_path: Path) -> None:
    """Roboflow writes train: ../train/images beside data.yaml; Ultralytics retries without the ../."""
    export = tmp_path / "export"
    train, valid = images(export / "train" / "images"), images(export / "valid" / "images")
    extra = images(tmp_path / "more" / "images")
    (export / "data.yaml").write_text(f"train: ../train/images\nval: [../export/valid/images, {extra}]\nnc: 1\nnames: [part]\n")
    found = dataset.resolve(str(export / "data.yaml"), cwd=tmp_path)
    assert found.splits == {"train": [train], "val": [valid, extra]}


def test_missing_split_folder_is_one_line_and_download_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "downloaded"
    yaml_file = tmp_path / "data.yaml"
    images(tmp_path / "images" / "train")
    yaml_file.write_text(
        f"train: images/train\nval: images/val\nnames: [a]\ndownload: |\n  open({str(marker)!r}, 'w').write('ran')\n"
    )
    with pytest.raises(UserError) as caught:
        dataset.resolve(str(yaml_file), cwd=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and f"val images not found at {tmp_path / 'images' / 'val'}" in message
    assert "never runs a YAML's download:" in message and not marker.exists()


def test_relative_path_key_is_taken_from_the_working_directory(tmp_path: Path) -> None:
    images(tmp_path / "run-here" / "ds" / "train")
    images(tmp_path / "run-here" / "ds" / "val")
    yaml_file = tmp_path / "cfg" / "data.yaml"
    yaml_file.parent.mkdir()
    yaml_file.write_text("path: ds\ntrain: train\nval: val\nnames: [a]\n")
    assert dataset.resolve(str(yaml_file), cwd=tmp_path / "run-here").root == tmp_path / "run-here" / "ds"
    with pytest.raises(UserError, match=r"path: ds does not exist \(a relative path: is taken from the folder you run in"):
        dataset.resolve(str(yaml_file), cwd=tmp_path)
