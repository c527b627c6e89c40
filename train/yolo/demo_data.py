"""A small synthetic detection dataset, so a fresh machine can train without any download.

Each image is a noisy grey background with one to three filled rectangles;
the class is the rectangle's colour (``red`` or ``blue``). Labels are YOLO text
files (``class cx cy w h``, normalised). The output is byte-for-byte
deterministic for a given ``seed`` and size: PNGs are encoded here with zlib at
a fixed level (standard library only: the host side never imports numpy, PIL
or torch).

``data.yaml`` has no ``path:`` key, so Ultralytics resolves ``images/train``
and ``images/val`` relative to the YAML file itself and the directory can be
moved or mounted anywhere.
"""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path
from typing import List, NamedTuple, Tuple

CLASSES: Tuple[Tuple[str, Tuple[int, int, int]], ...] = (
    ("red", (220, 40, 40)),
    ("blue", (40, 60, 220)),
)

Box = Tuple[int, int, int, int, int]  # class, x0, y0, x1, y1 (pixels, end exclusive)


class Images(NamedTuple):
    train: int
    val: int
    imgsz: int


#: The demo's dataset (``trainbox demo``, ``demo-data``'s defaults).
DEMO_IMAGES = Images(train=32, val=8, imgsz=96)
#: The demo's training arguments (any KEY=VALUE given wins; see the module docstring for why each).
DEMO_TRAIN_ARGS: Tuple[str, ...] = ("epochs=15", "imgsz=64", "batch=8", "nbs=8", "warmup_epochs=0", "mosaic=0")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """Encode 8-bit RGB pixel rows (``width * height * 3`` bytes) as a PNG file."""
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[row * stride : (row + 1) * stride] for row in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(raw, 6)) + _png_chunk(b"IEND", b"")
    )


def _render(rng: random.Random, size: int) -> Tuple[bytes, List[Box]]:
    pixels = bytearray(size * size * 3)
    for i in range(size * size):
        grey = 100 + rng.randrange(40)
        pixels[3 * i : 3 * i + 3] = bytes((grey, grey, grey))
    boxes: List[Box] = []
    for _ in range(rng.randint(1, 3)):
        cls = rng.randrange(len(CLASSES))
        w, h = rng.randint(size // 6, size // 3), rng.randint(size // 6, size // 3)
        x0, y0 = rng.randrange(size - w), rng.randrange(size - h)
        colour = bytes(CLASSES[cls][1])
        for y in range(y0, y0 + h):
            start = (y * size + x0) * 3
            pixels[start : start + 3 * w] = colour * w
        boxes.append((cls, x0, y0, x0 + w, y0 + h))
    return bytes(pixels), boxes


def _label_text(boxes: List[Box], size: int) -> str:
    lines = []
    for cls, x0, y0, x1, y1 in boxes:
        cx, cy = (x0 + x1) / 2 / size, (y0 + y1) / 2 / size
        lines.append(f"{cls} {cx:.6f} {cy:.6f} {(x1 - x0) / size:.6f} {(y1 - y0) / size:.6f}")
    return "\n".join(lines) + "\n"


def write_demo_dataset(
    directory: Path, train: int = DEMO_IMAGES.train, val: int = DEMO_IMAGES.val, imgsz: int = DEMO_IMAGES.imgsz, seed: int = 0
) -> Path:
    """Write ``images/{train,val}``, ``labels/{train,val}`` and ``data.yaml``; return the YAML's path."""
    if train < 1 or val < 1:
        raise ValueError("the demo dataset needs at least one train and one val image")
    if imgsz < 16:
        raise ValueError("imgsz must be at least 16 pixels")
    directory = Path(directory)
    rng = random.Random(seed)
    for split, count in (("train", train), ("val", val)):
        images, labels = directory / "images" / split, directory / "labels" / split
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for index in range(count):
            pixels, boxes = _render(rng, imgsz)
            (images / f"{split}_{index:04d}.png").write_bytes(encode_png(imgsz, imgsz, pixels))
            (labels / f"{split}_{index:04d}.txt").write_text(_label_text(boxes, imgsz))
    names = "\n".join(f"  {i}: {name}" for i, (name, _) in enumerate(CLASSES))
    data_yaml = directory / "data.yaml"
    data_yaml.write_text(
        "# trainbox demo dataset (synthetic; python -m trainbox demo-data)\n"
        f"train: images/train\nval: images/val\nnc: {len(CLASSES)}\nnames:\n{names}\n"
    )
    return data_yaml
