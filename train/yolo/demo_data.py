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

The demo (``trainbox demo``: ``invoke train`` and ``docker compose up`` without a
dataset, and the native route) must show that the pipeline trains, not only that it
runs: within a few CPU minutes, a from-scratch yolov8n reaches a mAP well above 0 and
its training losses fall. What decides it is the number of optimizer steps at full
learning rate, not of images: Ultralytics' warm-up lasts at least 100 iterations, its
weights' learning rate climbing from 0, so the earlier demo (3 epochs of 2 batches)
trained inside it throughout (mAP 0.0000 in every run); and past the warm-up it
accumulates gradients up to a nominal batch of 64 images (``nbs``) per step. Hence
:data:`DEMO_TRAIN_ARGS`: no warm-up, a step per batch (``nbs=8``), no mosaic (at 64 px
it quarters every object), 15 epochs of 64 images, 120 steps in all. Measured on this project's 2-core machine (2026-11-25;
other work kept its load at 5 to 19, so the wall time says little): mAP50 0 until
epoch 9, then 0.18, 0.38, 0.44, 0.73, 0.87 and 0.90 at epoch 15; box, cls and dfl
losses 3.95, 2.00, 2.04 at epoch 2 falling to 2.41, 0.95, 1.15 (the first epoch's are
lower: Ultralytics' assigner matches few anchors to an untrained model); 7.4 CPU
minutes. With Ultralytics' ``nbs=64`` (and no warm-up) 256 images at ``batch=16`` took
10 epochs, 40 steps, for mAP50 0.59 (6.2 CPU minutes); 128 images of larger objects at
``batch=8``, two steps an epoch, reached no mAP in 7 epochs. The tests train on 32 + 8 images at 96 px (``tests/supervised.py``).
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


#: The demo's dataset (``trainbox demo``, ``demo-data``'s defaults): 8 batches of 8 per epoch at the demo's 64 px.
DEMO_IMAGES = Images(train=64, val=16, imgsz=64)
#: The demo's training arguments (any KEY=VALUE given wins; the module docstring says why each, with the numbers).
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
