"""A plain PyTorch training script made supervisable with one line: ``beat(...)`` per batch.

Supervised, it is found within a minute when a DataLoader worker hangs, and it
resumes from its own checkpoint::

    python -m trainbox supervise --stall-timeout 60 -- python examples/plain_pytorch.py --workers 2

``torch.compile`` can take minutes before the first batch; the script declares
that as a ``compile`` phase with its own budget, so a slow compile is not
mistaken for a stall (``--compile``). Workers start with ``spawn`` by default:
``fork`` after the runtime is up (CUDA, ROCm, a compile worker pool) is what
deadlocked the report this example comes from.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainbox import faults
from trainbox.atomic import atomic_writer
from trainbox.heartbeat import beat


class Noise(Dataset):
    """Random images with a learnable label: the class is the brightest channel."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        faults.point("worker", index=index)  # trainbox's fault-injection site; a no-op unless TRAIN_FAULT is set
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, 32, 32, generator=generator)
        label = int(image.mean(dim=(1, 2)).argmax())
        return image, label


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 3),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", choices=["spawn", "forkserver", "fork"], default="spawn")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (declared compile phase)")
    parser.add_argument("--compile-timeout", type=float, default=1800.0)
    parser.add_argument("--checkpoint", type=Path, default=Path(os.environ.get("TRAIN_RUN_DIR", ".")) / "plain.pt")
    args = parser.parse_args()

    torch.manual_seed(0)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start_epoch = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        print(f"resumed from {args.checkpoint} at epoch {start_epoch}", flush=True)
    step_fn = net
    if args.compile:
        beat("compile", timeout=args.compile_timeout)
        step_fn = torch.compile(net)

    loader = DataLoader(
        Noise(args.samples),
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        multiprocessing_context=args.start_method if args.workers else None,
        persistent_workers=args.workers > 0,
    )
    step = start_epoch * len(loader)
    for epoch in range(start_epoch, args.epochs):
        for batch, (images, labels) in enumerate(loader):
            loss = nn.functional.cross_entropy(step_fn(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            beat("train", epoch=epoch, batch=batch, step=step, loss=round(loss.item(), 4))  # the one line
        beat("save", epoch=epoch, timeout=300)
        with atomic_writer(args.checkpoint) as handle:
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, handle)
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
