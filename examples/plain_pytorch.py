"""A plain PyTorch training script made supervisable with one line: ``beat(...)`` per batch.

Supervised, it is found within a minute when a DataLoader worker hangs, and it
resumes from its own checkpoint::

    python -m trainbox supervise --stall-timeout 60 -- python examples/plain_pytorch.py --workers 2

``torch.compile`` can take minutes before the first batch; the script declares
that as a ``compile`` phase with its own budget, so a slow compile is not
mistaken for a stall (``--compile``). Workers start with ``spawn`` by default:
``fork`` after the runtime is up (CUDA, ROCm, a compile worker pool) is what
deadlocked the report this example comes from.

It trains on the GPU when torch sees one (``--device auto``; ROCm's GPUs are
``cuda`` in torch too) and says so in its first line. ``--amp`` is mixed
precision on the GPU: bf16 autocast where the GPU has bf16, else fp16 with a
gradient scaler. On the CPU ``--amp`` is refused rather than turned into CPU
bf16 autocast, which is slower than fp32 on CPUs without bf16 matrix units and
would only make a small example less exact. The checkpoint is loaded onto this
run's device (``map_location``), so a run resumes on another device than the one
that wrote it (a GPU run continued on the CPU, or the reverse).

Under torchrun it trains data-parallel: one process per rank, gloo on the CPU
and nccl on the GPU (rank ``LOCAL_RANK``'s own), DistributedDataParallel and a
DistributedSampler. Every rank beats (each into its own heartbeat file) and
loads the checkpoint; rank 0 alone writes it, atomically. ``@record`` hands a
rank's exception to torchrun's error file, which the supervisor reports::

    python -m trainbox supervise --stall-timeout 60 -- torchrun --nproc-per-node 2 examples/plain_pytorch.py

With several nodes, ``--checkpoint`` must name one file that every node sees.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, ContextManager, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

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


class UsageError(Exception):
    """A request this machine cannot run; printed as one line, exit 2."""


def pick_device(requested: str) -> torch.device:
    """``auto``: the GPU when torch sees one, else the CPU; ``cuda`` without one is a usage error."""
    has_gpu = torch.cuda.is_available()
    if requested == "cuda" and not has_gpu:
        raise UsageError("--device cuda, but torch sees no GPU (torch.cuda.is_available() is False); use --device cpu or auto")
    return torch.device("cuda" if requested == "cuda" or (requested == "auto" and has_gpu) else "cpu")


def amp_dtype(device: torch.device, amp: bool) -> Optional[torch.dtype]:
    """The autocast dtype for ``--amp`` on ``device`` (None: full precision)."""
    if not amp:
        return None
    if device.type != "cuda":
        raise UsageError("--amp needs a GPU (--device cuda or auto on a machine with one); on the CPU leave --amp out")
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(device: torch.device, dtype: Optional[torch.dtype]) -> ContextManager[object]:
    """Autocast to ``dtype`` on ``device``; nothing at all for full precision (torch 1.13 warns at a disabled CPU autocast)."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def grad_scaler(enabled: bool) -> Any:
    """A gradient scaler for fp16 (bf16 needs none); a pass-through when disabled."""
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3, where torch.cuda.amp.GradScaler is deprecated
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def describe(device: torch.device, dtype: Optional[torch.dtype]) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    ranks = f", rank {dist.get_rank()} of {dist.get_world_size()} ({dist.get_backend()})" if dist.is_initialized() else ""
    return f"training on {device.type} ({name}), {'amp ' + str(dtype).replace('torch.', '') if dtype else 'fp32'}{ranks}"


def join_ranks(device: torch.device) -> torch.device:
    """Under torchrun (``RANK`` set): join the process group; a GPU rank takes GPU ``LOCAL_RANK``. Else nothing."""
    if "RANK" not in os.environ:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def is_writer() -> bool:
    """Whether this process writes the checkpoint: rank 0, or the only process."""
    return not dist.is_initialized() or dist.get_rank() == 0


@record  # under torchrun: a rank's exception goes into its error file (TORCHELASTIC_ERROR_FILE)
def main() -> int:
    try:
        return train(parse_args())
    except UsageError as error:
        print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        return 2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", choices=["spawn", "forkserver", "fork"], default="spawn")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (declared compile phase)")
    parser.add_argument("--compile-timeout", type=float, default=1800.0)
    parser.add_argument("--checkpoint", type=Path, default=Path(os.environ.get("TRAIN_RUN_DIR", ".")) / "plain.pt")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: the GPU when there is one")
    parser.add_argument("--amp", action="store_true", help="mixed precision on the GPU (bf16 where supported, else fp16)")
    return parser.parse_args()


def train(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    dtype = amp_dtype(device, args.amp)
    device = join_ranks(device)
    print(describe(device, dtype), flush=True)
    torch.manual_seed(0)
    net = model().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = grad_scaler(dtype == torch.float16)
    start_epoch = 0
    if args.checkpoint.exists():
        # Onto this run's device, whichever device wrote it. weights_only stays torch's default (True from
        # torch 2.6; the file holds only tensors and numbers): torch 1.13's weights-only loader cannot read a float.
        state = torch.load(args.checkpoint, map_location=device)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scaler.is_enabled() and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        start_epoch = state["epoch"] + 1
        print(f"resumed from {args.checkpoint} at epoch {start_epoch}", flush=True)
    # DDP starts every rank from rank 0's weights and averages the gradients; `net` stays the plain module, so the
    # checkpoint is the same with or without torchrun.
    step_fn = DistributedDataParallel(net) if dist.is_initialized() else net
    if args.compile:
        beat("compile", timeout=args.compile_timeout)
        step_fn = torch.compile(step_fn)

    data = Noise(args.samples)
    sampler = DistributedSampler(data, seed=0) if dist.is_initialized() else None  # each rank its share, reshuffled per epoch
    loader = DataLoader(
        data,
        batch_size=args.batch,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=args.workers,
        multiprocessing_context=args.start_method if args.workers else None,
        persistent_workers=args.workers > 0,
        pin_memory=device.type == "cuda",  # page-locked batches: the copy below overlaps with compute
    )
    step, total_steps = start_epoch * len(loader), args.epochs * len(loader)
    for epoch in range(start_epoch, args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch, (images, labels) in enumerate(loader):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with autocast(device, dtype):
                loss = nn.functional.cross_entropy(step_fn(images), labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            # The one line. total_steps lets a ladder's policy weigh the work left (docs/your-own-script.md).
            beat("train", epoch=epoch, batch=batch, step=step, loss=round(loss.item(), 4), total_steps=total_steps)
            faults.point("step", epoch=epoch, step=step)
        beat("save", epoch=epoch, timeout=300)
        if is_writer():
            state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}
            with atomic_writer(args.checkpoint) as handle:
                torch.save(dict(state, epoch=epoch), handle)
            beat("save", epoch=epoch, checkpoint_ts=time.time())  # written: what a stall from here would redo
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
