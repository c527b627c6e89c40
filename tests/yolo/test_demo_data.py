"""The demo dataset: deterministic, and a valid detection dataset for Ultralytics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.supervised import REPO
from trainbox.yolo.demo_data import write_demo_dataset


def _tree(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "a", train=4, val=2, imgsz=32)
    write_demo_dataset(tmp_path / "b", train=4, val=2, imgsz=32)
    write_demo_dataset(tmp_path / "c", train=4, val=2, imgsz=32, seed=1)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")
    assert len(_tree(tmp_path / "a")) == 2 * (4 + 2) + 1


def test_ultralytics_reads_every_image_and_label(demo_data: Path) -> None:
    from ultralytics.data import YOLODataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(demo_data))
    assert data["nc"] == 2 and data["names"] == {0: "red", 1: "blue"}
    for split, count in (("train", 32), ("val", 8)):
        dataset = YOLODataset(img_path=data[split], data=data, task="detect", imgsz=96, augment=False)
        assert len(dataset) == count
        boxes = sum(len(label["bboxes"]) for label in dataset.labels)
        lines = sum(len(p.read_text().splitlines()) for p in (demo_data.parent / "labels" / split).glob("*.txt"))
        assert boxes == lines > count
        sample = dataset[0]
        assert tuple(sample["img"].shape) == (3, 96, 96)


def test_writing_it_needs_neither_numpy_nor_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from trainbox.yolo.demo_data import write_demo_dataset\n"
        f"write_demo_dataset(Path({str(tmp_path)!r}))\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    assert (tmp_path / "data.yaml").is_file()
