"""The training DataLoader alone: trainbox's, as a profile builds it, against bare Ultralytics', with no model.

    python bench/loader.py [--train 512] [--imgsz 320] [--batch 16] [--workers 2] [--epochs 3] [--rounds 4]
                           [--profile fast] [--variants bare,trainbox,...] [--out DIR]

Both loaders read the same generated dataset (``trainbox.yolo.demo_data``) through the same Ultralytics
``YOLODataset`` (mosaic and the other training augmentations on), with the same number of workers:

* ``bare``: ``ultralytics.data.build.build_dataloader``, Ultralytics' own ``InfiniteDataLoader`` (fork, as PyTorch
  starts workers on Linux; ``prefetch_factor=4``; its workers live for the whole run);
* ``trainbox``: ``trainbox.yolo.loader.rebuild`` over that loader with the profile's options (``--profile``, ``fast``
  by default: spawn, persistent, its prefetch; ``SeededSamples`` and ``PositionedBatchSampler`` for exact resume),
  iterated as the trainer does, an epoch at a time from ``start_at``;
* the loader-level ablation, ``trainbox`` with one difference from bare switched back: ``trainbox+fork`` (workers
  start as bare's do), ``trainbox+prefetch4`` (bare's prefetch), ``trainbox-resume`` (no per-sample seeds and no
  positioned sampler: the plain dataset in Ultralytics' order).

Per run, in this process: ``first_batch_s`` (the iterator's creation to its first batch: worker start, the first
batch's loading) and the steady ``imgs_per_s`` over every epoch after the first (epoch boundaries included: a
persistent loader's order computation and worker hand-over belong to steady speed). Variants run interleaved, round
by round, in an order that alternates (ABBA), and each variant's ``ratio`` is its speed over bare's in the same
round: 1.0 is as fast as bare. The goal is ``trainbox`` at 0.98 or more. The load average is recorded before and after:
the machine this runs on is shared. Results: ``bench/results/loader.json`` and ``loader.md`` (or in ``--out``).
No pass or fail: what a test checks of this loader is what it loads and in which order (tests/yolo/test_position.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import psutil
from common import RESULTS, machine, span, summary, write_results

#: The loader-level variants, in the order they are reported.
VARIANTS = ("bare", "trainbox", "trainbox+fork", "trainbox+prefetch4", "trainbox-resume")
#: Issue's goal for trainbox's loader against bare's on the CPU.
GOAL = 0.98
#: Ultralytics' training prefetch (``build_dataloader``: 4 for training, 2 for validation).
BARE_PREFETCH = 4


@dataclasses.dataclass(frozen=True)
class Setup:
    data: Path
    imgsz: int
    batch: int
    workers: int
    epochs: int
    profile: str


def _dataset(setup: Setup) -> Any:
    """Ultralytics' training dataset for ``setup.data``, built as its DetectionTrainer builds it."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    cfg = get_cfg(overrides={"imgsz": setup.imgsz, "data": str(setup.data), "plots": False})
    data = check_det_dataset(str(setup.data))
    return build_yolo_dataset(cfg, data["train"], setup.batch, data, mode="train", rect=False, stride=32)


def bare_loader(dataset: Any, setup: Setup) -> Any:
    from ultralytics.data.build import build_dataloader

    return build_dataloader(dataset, setup.batch, setup.workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")


def trainbox_loader(dataset: Any, setup: Setup, variant: str) -> Any:
    """``rebuild`` over bare's loader with the profile's options, one of them switched back for an ablation variant."""
    from trainbox.yolo import forkserver, loader, profiles

    profile = profiles.load(setup.profile)
    context = None if variant == "trainbox+fork" else profile.multiprocessing_context
    if context == "forkserver":
        forkserver.start()  # as the trainer does, once it knows the start method
    prefetch = BARE_PREFETCH if variant == "trainbox+prefetch4" else profile.prefetch_factor
    return loader.rebuild(
        bare_loader(dataset, setup), workers=setup.workers, multiprocessing_context=context,
        persistent_workers=profile.persistent_workers, prefetch_factor=prefetch, network_log=None,
        train=variant != "trainbox-resume", seed=0, pin_memory=False,
    )  # fmt: skip


def _epochs(built: Any, epochs: int) -> Callable[[int], Any]:
    """One epoch's iterator of ``built``, as its trainer asks for it (trainbox's: from the epoch's start)."""
    from trainbox.yolo.position import Position

    def epoch(number: int) -> Any:
        if hasattr(built, "start_at") and built.positioned is not None:
            built.start_at(Position(number, 0))
        elif hasattr(built, "set_epoch"):
            built.set_epoch(number + 1)
        return iter(built)

    return epoch


def _cpu_s(built: Any) -> float:
    """CPU seconds used so far by this process and ``built``'s worker processes (user and system)."""
    processes = [psutil.Process()] + [psutil.Process(w.pid) for w in getattr(built.iterator, "_workers", [])]
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def measure(dataset: Any, setup: Setup, variant: str) -> Dict[str, float]:
    """One run of ``variant``: time to its first batch, then steady images per second after the first epoch, and the
    CPU time per image over those epochs (this process and the workers: on a shared machine the less noisy figure)."""
    built = bare_loader(dataset, setup) if variant == "bare" else trainbox_loader(dataset, setup, variant)
    epoch = _epochs(built, setup.epochs)
    images, started = 0, time.monotonic()
    first_batch_s: Optional[float] = None
    steady_from, cpu_from = 0.0, 0.0
    try:
        for number in range(setup.epochs):
            for batch in epoch(number):
                if first_batch_s is None:
                    first_batch_s = time.monotonic() - started
                if number:
                    images += len(batch["im_file"])
            if number == 0:
                steady_from, cpu_from = time.monotonic(), _cpu_s(built)
        cpu_s = _cpu_s(built) - cpu_from
    finally:
        built.close()
    steady_s = time.monotonic() - steady_from
    return {
        "first_batch_s": first_batch_s or 0.0,
        "imgs_per_s": images / steady_s,
        "cpu_ms_per_img": 1000 * cpu_s / images,
        "steady_s": steady_s,
    }


def _load() -> float:
    return os.getloadavg()[0]


def run(setup: Setup, chosen: List[str], rounds: int) -> Dict[str, Dict[str, List[float]]]:
    """Every variant once per round, alternating the order (ABBA); each one's speed over bare's of the same round."""
    dataset = _dataset(setup)
    columns: Dict[str, Dict[str, List[float]]] = {v: {} for v in chosen}
    for round_ in range(rounds):
        order = chosen if round_ % 2 == 0 else [chosen[0], *reversed(chosen[1:])]
        figures = {variant: {**measure(dataset, setup, variant), "load": _load()} for variant in order}
        for variant in chosen:
            figures[variant]["ratio"] = figures[variant]["imgs_per_s"] / figures["bare"]["imgs_per_s"]
            figures[variant]["cpu_ratio"] = figures["bare"]["cpu_ms_per_img"] / figures[variant]["cpu_ms_per_img"]
            for key, value in figures[variant].items():
                columns[variant].setdefault(key, []).append(value)
            print(
                f"round {round_ + 1}/{rounds} {variant}: {figures[variant]['imgs_per_s']:.1f} img/s "
                f"(x{figures[variant]['ratio']:.3f}), {figures[variant]['cpu_ms_per_img']:.2f} CPU-ms/img "
                f"(x{figures[variant]['cpu_ratio']:.3f}), first batch {figures[variant]['first_batch_s']:.2f} s, "
                f"load {figures[variant]['load']:.1f}",
                flush=True,
            )
    return columns


def markdown(result: Dict[str, Any], command: str) -> str:
    setup, table = result["setup"], result["variants"]
    taken = machine()
    lines = [
        "# The training DataLoader alone: trainbox against bare Ultralytics (no model)",
        "",
        f"{setup['train']} generated images at {setup['imgsz']} px, batch {setup['batch']}, {setup['workers']} workers, "
        f"{setup['epochs']} epochs per run (steady: every epoch after the first), {setup['rounds']} interleaved rounds; "
        f"profile `{setup['profile']}`. Load average (1 min) during the runs: {span(result['load'], digits=1)}.",
        "",
        f"Taken {taken['date']} on {taken['host']} ({taken['cpu']}, {taken['cores']} cores), Python {taken['python']}.",
        "",
        f"Command: `{command}`",
        "",
        "| variant | images/s (steady) | ratio to bare, same round | CPU ms per image | CPU ratio to bare | "
        "time to first batch s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in (v for v in VARIANTS if v in table):
        row = table[name]
        lines.append(
            f"| {name} | {span(row['imgs_per_s'], digits=1)} | {span(row['ratio'], digits=3)} | "
            f"{span(row['cpu_ms_per_img'])} | {span(row['cpu_ratio'], digits=3)} | {span(row['first_batch_s'], digits=2)} |"
        )
    if "trainbox" in table:
        ratio = table["trainbox"]["ratio"]["median"]
        verdict = "met" if ratio >= GOAL else "not met"
        lines += [
            "",
            f"Goal, trainbox's loader at {GOAL} of bare's speed or more (median of the rounds): {verdict} ({ratio:.3f}).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="for both loaders (default: this machine's 2 cores)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profile", default="fast")
    parser.add_argument("--variants", default="bare,trainbox", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--data", type=Path, default=None, help="a data.yaml instead of generated data")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    asked = set(args.variants.split(",")) | {"bare"}
    if asked - set(VARIANTS) or args.epochs < 2:
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}; --epochs: at least 2")
    chosen = [v for v in VARIANTS if v in asked]
    from trainbox.yolo import offline
    from trainbox.yolo.demo_data import write_demo_dataset

    with tempfile.TemporaryDirectory(prefix="trainbox-loader-bench-") as tmp:
        offline.prepare_environment(Path(tmp) / "ultralytics-config")  # as tests/yolo/conftest.py makes it
        data = args.data or write_demo_dataset(Path(tmp) / "data", train=args.train, val=4, imgsz=args.imgsz)
        setup = Setup(data, args.imgsz, args.batch, args.workers, args.epochs, args.profile)
        loads = [_load()]
        columns = run(setup, chosen, args.rounds)
        loads.append(_load())
    variants = {name: {key: summary(values) for key, values in column.items()} for name, column in columns.items()}
    shown = {key: getattr(args, key) for key in ("train", "imgsz", "batch", "workers", "epochs", "rounds", "profile")}
    loads += [value for column in columns.values() for value in column["load"]]
    result = {"setup": shown, "load": summary(loads), "variants": variants}
    flags = " ".join(f"--{key} {value}" for key, value in shown.items())
    md = markdown(result, f"python bench/loader.py {flags} --variants {','.join(chosen)}")
    print(md)
    print(write_results("loader", result, md, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
