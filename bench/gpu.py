"""On one GPU: trainbox's profiles against bare Ultralytics with its defaults, on the same data.

    python bench/gpu.py [--device 0] [--rounds 2] [--train 2048] [--val 256] [--imgsz 640] [--batch 64] [--epochs 4]
                        [--data DIR] [--out DIR]
    python bench/gpu.py --device cpu --quick [--out DIR]     # what CI runs: tiny data, every variant once

Variants, interleaved round by round on one generated dataset (``trainbox.yolo.demo_data``, written in parallel shards):

* ``bare``: ``YOLO("yolov8n.yaml").train(...)`` in a plain process with Ultralytics' defaults (``workers=8``,
  ``amp=True``), offline as trainbox trains (``common.BARE``). Its AMP check tries to download ``yolo26n.pt``; the
  network guard refuses that (``network_refusals``) and Ultralytics then trains with AMP on, as it does offline.
* ``fast``, ``fast-compile``, ``balanced``, ``safe``: ``python -m trainbox run --profile NAME`` (supervisor, profile
  trainer, heartbeats, atomic checkpoints, AMP and workers decided for the device: the run's ``device`` event).

Per run: steady seconds per epoch (Ultralytics' ``results.csv``: cumulative time at each epoch's end, after the first
epoch, validation and checkpoint saves included); time to the first batch (launch to the first heartbeat after a
trained batch: imports, dataset scan, model build, worker start, kernel selection or compilation); peak memory (on a GPU
what ``nvidia-smi`` reports for the run's processes, on the CPU the resident memory of its process tree); for trainbox
the supervisor's own CPU time as a share of the run's wall time (its overhead: it polls, it does not touch the training).
``speed`` is bare's seconds per epoch over the variant's, in the same round: 1.0 is as fast as bare, above is faster.
Goal: ``fast`` at 0.97 or more. Results: ``bench/results/gpu.json`` and ``gpu.md`` (``gpu-quick.*`` with ``--quick``),
or in ``--out``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil
from common import REPO, RESULTS, RunDir, bare_command, cli_env, epoch_seconds, events, span, summary, write_results

from trainbox.yolo.demo_data import write_demo_dataset

VARIANTS = ("bare", "fast", "fast-compile", "balanced", "safe")
#: Variants that torch.compile. With --quick on the CPU they run with TORCH_COMPILE_DISABLE=1 (compile calls run
#: eagerly): Inductor's C++ compile of yolov8n takes minutes on 2 cores, and --quick checks the bench, not compile.
COMPILED = ("fast-compile",)
#: --quick: the least that still has a steady state (2 epochs) and a few batches per epoch.
QUICK = {"train": 16, "val": 4, "imgsz": 64, "batch": 8, "epochs": 2, "rounds": 1}
#: Seconds between looks at a run's heartbeat and memory (nvidia-smi every GPU_POLL_S: it costs tens of ms).
POLL_S = 0.05
GPU_POLL_S = 1.0
MIB = 1024 * 1024
#: trainbox fast's speed relative to bare Ultralytics that issue 16 asks for, on a GPU.
GOAL = 0.97
DIFFERENCES = (
    "What differs between bare and `fast` besides the supervisor (each a suspect where `fast` is slower): workers "
    "start with spawn, not fork; prefetch 2 batches per worker, not 4; validation uses as many workers as training, "
    "not twice as many; torch uses every core for intra-op threads, not all but one (on a busy CPU this alone "
    "costs a factor of 2 or more); every sample is seeded from (seed, epoch, index) and the epoch's order "
    "computed in the training process (exact resume); checkpoints are staged, fsynced and renamed; heartbeats "
    "and a mid-epoch checkpoint every 300 s. `safe` and `balanced` differ more: 0 and 2 workers, and `balanced` "
    "starts its workers again for every epoch and validation pass."
)


@dataclasses.dataclass
class Watched:
    """What a watcher thread saw of one run while it ran."""

    first_batch_s: Optional[float] = None
    peak_mib: float = 0.0
    supervisor_cpu_s: float = 0.0


def _tree(root: psutil.Process) -> List[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def gpu_used_mib(index: str) -> Optional[float]:
    """Memory in use on GPU ``index``, as nvidia-smi reports it; None where there is no nvidia-smi.

    The whole GPU, not per process: process ids inside a container's PID namespace do not match nvidia-smi's. The
    run's share is the peak minus what was in use before it started (the bench machine runs nothing else).
    """
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "-i", index, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=10)
    try:
        return float(done.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def watch(
    proc: subprocess.Popen, heartbeat: Path, gpu: Optional[str], started: float, seen: Watched, done: threading.Event
) -> None:
    """Until ``done``: the first beat after a trained batch, peak memory, the root process's own CPU time."""
    root = psutil.Process(proc.pid)
    baseline = (gpu_used_mib(gpu) or 0.0) if gpu else 0.0
    next_gpu = 0.0
    while not done.is_set():
        now = time.monotonic()
        if seen.first_batch_s is None:
            try:
                beat = json.loads(heartbeat.read_text())
            except (OSError, ValueError):
                beat = {}
            if isinstance(beat, dict) and (beat.get("batch") or 0) >= 1:
                seen.first_batch_s = now - started
        if gpu and now >= next_gpu:
            next_gpu = now + GPU_POLL_S
            seen.peak_mib = max(seen.peak_mib, (gpu_used_mib(gpu) or baseline) - baseline)
        elif not gpu:
            resident = 0
            for process in _tree(root):
                try:
                    resident += process.memory_info().rss
                except psutil.Error:
                    continue
            seen.peak_mib = max(seen.peak_mib, resident / MIB)
        try:
            times = root.cpu_times()
            seen.supervisor_cpu_s = times.user + times.system  # the root itself, not its children
        except psutil.Error:
            pass
        done.wait(POLL_S)


def run_variant(
    variant: str, run_dir: Path, train_args: List[str], gpu: Optional[str], timeout: float, compile_off: bool = False
) -> Dict[str, Any]:
    """One run of ``variant``; its figures. ``compile_off``: torch.compile runs eagerly (``TORCH_COMPILE_DISABLE``)."""
    run = RunDir(run_dir)
    env = cli_env({"TORCH_COMPILE_DISABLE": "1"} if compile_off else {})  # an import root already set is kept
    if variant == "bare":
        argv = bare_command(run_dir, train_args)
        env["TRAIN_HEARTBEAT_FILE"] = str(run.heartbeat)
    else:
        argv = [sys.executable, "-m", "trainbox", "run", "--profile", variant, "--run-dir", str(run_dir), "--quiet", *train_args]
    run_dir.mkdir(parents=True, exist_ok=True)
    seen, done = Watched(), threading.Event()
    started = time.monotonic()
    with open(run_dir / "bench-output.log", "wb") as output:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=watch, args=(proc, run.heartbeat, gpu, started, seen, done), daemon=True)
        watcher.start()
        try:
            code = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            done.set()
            watcher.join()
    wall = time.monotonic() - started
    if code != 0:
        tail = (run_dir / "bench-output.log").read_text(errors="replace")[-2000:]
        raise SystemExit(f"{variant}: exit {code} after {wall:.0f} s; output ends:\n{tail}")
    if seen.first_batch_s is None:
        raise SystemExit(f"{variant}: no heartbeat after a trained batch was seen in {run.heartbeat}")
    refusals = run.network_log.read_text().count(" pid=") if run.network_log.exists() else 0
    result: Dict[str, Any] = {
        "epoch_s": epoch_seconds(run_dir),
        "first_batch_s": seen.first_batch_s,
        "peak_mib": round(seen.peak_mib, 1),
        "wall_s": round(wall, 2),
        "network_refusals": refusals,
    }
    if compile_off:
        result["compile_off"] = True
    if variant != "bare":
        result["supervisor_cpu_share"] = seen.supervisor_cpu_s / wall
        result["device"] = next((e for e in events(run_dir) if e["event"] == "device"), None)
    return result


def _write_shard(args: tuple) -> Path:
    directory, train, val, imgsz, seed = args
    return write_demo_dataset(directory, train=train, val=val, imgsz=imgsz, seed=seed)


def demo_data(directory: Path, train: int, val: int, imgsz: int, shards: int) -> Path:
    """``train`` + ``val`` demo images in one dataset, written by ``shards`` processes (seeds 0..shards-1)."""
    counts = [(train // shards + (i < train % shards), max(1, val // shards)) for i in range(shards)]
    jobs = [(directory / f"shard{i}", t, v, imgsz, i) for i, (t, v) in enumerate(counts) if t]
    with concurrent.futures.ProcessPoolExecutor(len(jobs)) as pool:
        list(pool.map(_write_shard, jobs))
    for split in ("train", "val"):
        for kind in ("images", "labels"):
            target = directory / kind / split
            target.mkdir(parents=True, exist_ok=True)
            for job in jobs:
                for path in (job[0] / kind / split).iterdir():
                    path.rename(target / f"{job[0].name}_{path.name}")
    (jobs[0][0] / "data.yaml").rename(directory / "data.yaml")
    for job in jobs:
        shutil.rmtree(job[0])
    return directory / "data.yaml"


def _versions() -> Dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("torch", "ultralytics")}


def markdown(result: Dict[str, Any], command: str) -> str:
    table = result["variants"]
    decided_by = next((v for v in VARIANTS if v in table and table[v].get("device")), "fast")
    device = table.get(decided_by, {}).get("device") or {}
    setup = result["setup"]
    lines = [
        f"# {device.get('description', 'device')}: trainbox profiles against bare Ultralytics",
        "",
        f"yolov8n, {setup['train']} train / {setup['val']} val images at {setup['imgsz']} px, batch {setup['batch']}, "
        f"{setup['epochs']} epochs, {setup['rounds']} interleaved round(s); torch {result['versions']['torch']}, "
        f"Ultralytics {result['versions']['ultralytics']}.",
        "",
        f"Command: `{command}`",
        "",
        "| variant | amp | workers | s per epoch (steady) | speed vs bare | time to first batch s | "
        f"peak {result['memory']} MiB | supervisor CPU share |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in (v for v in VARIANTS if v in table):
        row = table[name]
        decided = row.get("device") or {}
        on_gpu = result["memory"] == "GPU"
        amp = decided.get("amp", "True (its check skipped offline)" if on_gpu else "False (CPU)")
        workers = decided.get("workers", "8" if on_gpu else "0 (Ultralytics' choice on the CPU)")
        share = span(row["supervisor_cpu_share"], scale=100, digits=2) + " %" if "supervisor_cpu_share" in row else "—"
        shown = f"{name} (compile off: --quick on the CPU)" if row["compile_off"] else name
        lines.append(
            f"| {shown} | {amp} | {workers} | {span(row['epoch_s'])} | {span(row['speed'], digits=3)} | "
            f"{span(row['first_batch_s'], digits=1)} | {span(row['peak_mib'], digits=0)} | {share} |"
        )
    if "fast" in table:
        fast = table["fast"]["speed"]["median"]
        if result["memory"] == "GPU":
            verdict = "met" if fast >= GOAL else "not met"
            lines += ["", f"Goal, `fast` at {GOAL} of bare's speed or more: {verdict} ({fast:.3f})."]
        else:
            lines += ["", f"On the CPU `fast` is at {fast:.3f} of bare's speed; the goal ({GOAL} or more) is for a GPU."]
    lines += ["", DIFFERENCES]
    if device:
        lines += [
            "",
            f"trainbox decided for `{decided_by}`: amp={device.get('amp')} "
            f"({device.get('amp_check') or device.get('amp_reason')}); "
            f"workers: {device.get('workers_reason')}; pin_memory={device.get('pin_memory')}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="0", help="Ultralytics' device= (a GPU index, or cpu)")
    parser.add_argument("--quick", action="store_true", help="tiny data, every variant once: " + json.dumps(QUICK))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train", type=int, default=2048)
    parser.add_argument("--val", type=int, default=256)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--data", type=Path, default=None, help="a data.yaml to train on instead of generated data")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where gpu.json and gpu.md go (default bench/results)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="which to run, comma-separated; bare always runs (speed is relative to it)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the steady state is after the first)")
    gpu = None if args.device == "cpu" else args.device
    asked = set(args.variants.split(",")) | {"bare"}
    if asked - set(VARIANTS):
        parser.error(f"--variants: unknown {', '.join(sorted(asked - set(VARIANTS)))}; known: {', '.join(VARIANTS)}")
    chosen = [v for v in VARIANTS if v in asked]
    rows: Dict[str, Dict[str, List[Any]]] = {v: {} for v in chosen}
    with tempfile.TemporaryDirectory(prefix="trainbox-gpu-bench-") as tmp:
        data = args.data or demo_data(Path(tmp) / "data", args.train, args.val, args.imgsz, min(16, os.cpu_count() or 1))
        train_args = [f"data={data}", f"epochs={args.epochs}", f"imgsz={args.imgsz}", f"batch={args.batch}",
                      f"device={args.device}", "plots=False"]  # fmt: skip
        for round_ in range(args.rounds):
            bare_epoch_s = None
            for variant in chosen:
                compile_off = variant in COMPILED and args.quick and gpu is None
                figures = run_variant(variant, Path(tmp) / f"{variant}-{round_}", train_args, gpu, args.timeout, compile_off)
                bare_epoch_s = bare_epoch_s or figures["epoch_s"]
                figures["speed"] = bare_epoch_s / figures["epoch_s"]
                for key, value in figures.items():
                    rows[variant].setdefault(key, []).append(value)
                print(
                    f"round {round_ + 1}/{args.rounds} {variant}: {figures['epoch_s']:.2f} s/epoch "
                    f"(speed {figures['speed']:.3f}), first batch {figures['first_batch_s']:.1f} s",
                    flush=True,
                )
    variants: Dict[str, Dict[str, Any]] = {}
    for variant, columns in rows.items():
        listed = ("device", "network_refusals", "compile_off")
        kept = {key: summary(values) for key, values in columns.items() if key not in listed}
        variants[variant] = dict(kept, network_refusals=sum(columns["network_refusals"]), compile_off="compile_off" in columns)
        if "device" in columns:
            variants[variant]["device"] = columns["device"][0]
    setup = {key: getattr(args, key) for key in ("train", "val", "imgsz", "batch", "epochs", "rounds", "device")}
    result = {"setup": setup, "versions": _versions(), "memory": "GPU" if gpu else "host RSS", "variants": variants}
    subset = "" if len(chosen) == len(VARIANTS) else f" --variants {','.join(chosen)}"
    flags = f"--device {args.device}{subset}" + (" --quick" if args.quick else f" --rounds {args.rounds} --train {args.train} "
             f"--val {args.val} --imgsz {args.imgsz} --batch {args.batch} --epochs {args.epochs}")  # fmt: skip
    md = markdown(result, f"python bench/gpu.py {flags}")
    print(md)
    print(write_results("gpu-quick" if args.quick else "gpu", result, md, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
