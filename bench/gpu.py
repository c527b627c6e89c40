"""On one GPU (or the CPU): trainbox's profiles against bare Ultralytics on the same data, split into its parts.

    python bench/gpu.py --device 0 --rounds 2               # every variant and the ablation, interleaved with bare
    python bench/gpu.py --device cpu --train 96 --val 8 --imgsz 64 --batch 8 --epochs 2 --rounds 1 --bare-every 3
    python bench/gpu.py --device cpu --quick [--out DIR]     # what CI runs: tiny data, every variant once

Variants, round by round on one generated dataset (``trainbox.yolo.demo_data``, written in parallel shards), with a bare run
first and again before every ``--bare-every`` (4) others, so that each variant is compared with a bare run of the
same call taken minutes before it:

* ``bare``: ``YOLO("yolov8n.yaml").train(...)`` in a plain process with Ultralytics' defaults (``workers=8``,
  ``amp=True``), offline as trainbox trains (``common.BARE``). Its AMP check tries to download ``yolo26n.pt``; the
  network guard refuses that (``network_refusals``) and Ultralytics then trains with AMP on, as it does offline.
* ``fast``, ``balanced``, ``safe``, ``fast-compile``: ``python -m trainbox run --profile NAME`` (supervisor, profile
  trainer, heartbeats, atomic checkpoints, AMP and workers decided for the device: the run's ``device`` event).
* ``bare-supervised``: the bare run under ``python -m trainbox supervise``: Ultralytics' own loader (fork, its
  prefetch and workers), watched only from outside (the candidate top rung).
* The ablation, ``fast/...``: ``fast`` with one of its differences from bare switched back: ``fork`` (workers forked
  from the training process, as bare's), ``prefetch4`` (Ultralytics' prefetch), ``val-workers`` (validation with
  twice the training workers, as Ultralytics'), ``threads`` (torch's intra-op threads capped at
  ``min(8, cores - 1)``, as Ultralytics'), ``no-exact-resume`` (no per-sample seeds, no positioned sampler),
  ``plain-checkpoints`` (Ultralytics' own save: no staging, no fsync), ``no-heartbeat`` (no heartbeat writes),
  ``no-midepoch`` (no mid-epoch checkpoints), ``no-supervisor`` (the training process run directly). Not in it,
  and run only when asked: ``fast/spawn``, fast as it was before its workers started from a forkserver. Profile
  settings go in through a copy of the profiles (``TRAIN_PROFILES_DIR``), the rest through
  ``bench/marks/sitecustomize.py`` (``TRAIN_BENCH_ABLATE``).

Per run, from marks that ``bench/marks/sitecustomize.py`` records in the training process, the same way for bare
and for trainbox (``bench/phases.py``): time to the first batch, by phase (supervisor, imports, device probe and AMP
check, dataset scan, set-up, worker start, first step); steady images per second in the middle of every epoch and
the share of it the main thread waited on the DataLoader; the fixed cost per epoch (validation, checkpoint save,
the rest of the epoch boundary) in seconds. Also GPU utilisation in those steady stretches (``nvidia-smi``, once a
second), peak memory (GPU: ``nvidia-smi``; CPU: the run's process tree), the supervisor's own CPU time as a share of
the run's wall time, and the old figures: seconds per epoch from ``results.csv`` (after the first epoch, validation
and saves included) and ``speed``, bare's seconds per epoch over the variant's. ``steady_ratio`` is the variant's
steady images per second over that of the bare run before it: 1.0 is as fast as bare. Goals: ``fast`` at 0.98 or more,
a fixed cost per epoch within 1 s of bare's and a first batch within 5 s of bare's (3 s on the CPU). ``--time-limit``
stops starting runs past that many seconds and writes what finished: the default command makes 34 runs of about
40 s on an H200 (300 batches of 16 at 640 px an epoch, 2 epochs), about 25 minutes, so within the device tool's
10-minute calls give it ``--time-limit 540`` (a round runs bare, fast, balanced, safe and bare-supervised first,
then the ablation) or split it with ``--variants``. Results: ``bench/results/NAME.json`` and
``NAME.md``, NAME from ``--name`` (default ``gpu-ablation``, on the CPU ``gpu-ablation-cpu``, ``gpu-quick`` with
``--quick``). The H100 and H200 figures of the old bench stay in ``gpu.md`` and ``gpu-h200.md``.
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
from typing import Any, Dict, List, Optional, Tuple

import phases
import psutil
import yaml
from common import REPO, RESULTS, RunDir, bare_command, cli_env, epoch_seconds, events, machine, span, summary, write_results

from trainbox.yolo.demo_data import write_demo_dataset

VARIANTS = ("bare", "fast", "fast-compile", "balanced", "safe", "bare-supervised")
#: Ablation variants: fast with one difference from bare switched back: profile settings, or the sitecustomize's.
ABLATION: Dict[str, Dict[str, Any]] = {
    "fast/fork": {"profile": {"multiprocessing_context": None}},
    "fast/prefetch4": {"profile": {"prefetch_factor": 4}},
    "fast/val-workers": {"ablate": "val-workers"},
    "fast/threads": {"profile": {"cpu_threads": "bare"}},
    "fast/no-exact-resume": {"ablate": "no-exact-resume"},
    "fast/plain-checkpoints": {"ablate": "plain-checkpoints"},
    "fast/no-heartbeat": {"ablate": "no-heartbeat"},
    "fast/no-midepoch": {"profile": {"midepoch_checkpoint_s": 0}},
    "fast/no-supervisor": {},
}
#: Not an ablation: fast as it was before its workers started from a forkserver (spawn), to compare with.
BEFORE = {"fast/spawn": {"profile": {"multiprocessing_context": "spawn"}}}

ALL = VARIANTS + tuple(ABLATION) + tuple(BEFORE)
#: What runs unless --variants says otherwise: fast-compile's compile (2 minutes before its first batch on an H200)
#: is measured on its own.
DEFAULT = tuple(v for v in ALL if v not in ("fast-compile", *BEFORE))
#: Variants that torch.compile. With --quick on the CPU they run with TORCH_COMPILE_DISABLE=1 (compile calls run
#: eagerly): Inductor's C++ compile of yolov8n takes minutes on 2 cores, and --quick checks the bench, not compile.
COMPILED = ("fast-compile",)
#: --quick: the least that still has a steady state (2 epochs) and a few batches per epoch.
QUICK = {"train": 16, "val": 4, "imgsz": 64, "batch": 8, "epochs": 2, "rounds": 1}
#: Seconds between looks at a run's memory and the GPU's (nvidia-smi every GPU_POLL_S: it costs tens of ms).
POLL_S = 0.05
GPU_POLL_S = 1.0
MIB = 1024 * 1024
#: fast's steady speed relative to bare Ultralytics that the goal asks for, on a GPU.
GOAL = 0.98
#: Where the marks' sitecustomize lives: first on every run's PYTHONPATH.
MARKS_DIR = Path(__file__).resolve().parent / "marks"
DIFFERENCES = (
    "What differs between bare and `fast` besides the supervisor (the ablation switches each back): workers start "
    "from a preloaded forkserver (spawn before), not by fork; prefetch 2 batches per worker, not 4; validation uses "
    "as many workers as training, not twice as many; torch uses every core for intra-op threads, not "
    "min(8, cores - 1); every sample is seeded from (seed, epoch, index) and the epoch's order computed in the "
    "training process (exact resume); checkpoints are staged, fsynced and renamed; heartbeats; a mid-epoch "
    "checkpoint every 300 s; the supervisor's sampling."
)


@dataclasses.dataclass
class Watched:
    """What a watcher thread saw of one run while it ran."""

    peak_mib: float = 0.0
    supervisor_cpu_s: float = 0.0
    gpu_busy: List[Tuple[float, float]] = dataclasses.field(default_factory=list)


def _tree(root: psutil.Process) -> List[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def gpu_query(index: str) -> Optional[Tuple[float, float]]:
    """(memory in use in MiB, utilisation in %) of GPU ``index``, as nvidia-smi reports them; None without it.

    The whole GPU, not per process: process ids inside a container's PID namespace do not match nvidia-smi's. The
    run's memory is the peak minus what was in use before it started (the bench machine runs nothing else).
    """
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "-i", index, "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=10)
    try:
        memory, busy = (float(part) for part in done.stdout.strip().split(","))
    except ValueError:
        return None
    return memory, busy


def watch(proc: subprocess.Popen, gpu: Optional[str], seen: Watched, done: threading.Event) -> None:
    """Until ``done``: peak memory, GPU utilisation samples, the root process's own CPU time."""
    root = psutil.Process(proc.pid)
    baseline = (gpu_query(gpu) or (0.0, 0.0))[0] if gpu else 0.0
    next_gpu = 0.0
    while not done.is_set():
        now = time.monotonic()
        if gpu and now >= next_gpu:
            next_gpu = now + GPU_POLL_S
            found = gpu_query(gpu)
            if found is not None:
                seen.peak_mib = max(seen.peak_mib, found[0] - baseline)
                seen.gpu_busy.append((time.time(), found[1]))
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


def profiles_dir(variant: str, directory: Path) -> Optional[Path]:
    """A copy of the profiles with ``fast`` changed as an ablation variant asks; None when it changes none."""
    changes = {**ABLATION, **BEFORE}.get(variant, {}).get("profile")
    if not changes:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    for path in (REPO / "env" / "profiles").glob("*.yaml"):
        shutil.copy(path, directory / path.name)
    fast = yaml.safe_load((directory / "fast.yaml").read_text())
    for key, value in changes.items():
        # Ultralytics' own thread count: min(8, cores - 1) (BaseTrainer.__init__), at least 1.
        fast[key] = max(1, min(8, (os.cpu_count() or 2) - 1)) if value == "bare" else value
    (directory / "fast.yaml").write_text(yaml.safe_dump(fast))
    return directory


def command(variant: str, run_dir: Path, train_args: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """The command line of one run of ``variant``, and what it adds to the environment."""
    run = RunDir(run_dir)
    env = {"PYTHONPATH": str(MARKS_DIR), "TRAIN_BENCH_MARKS": str(run_dir / "marks.jsonl")}
    if "ablate" in ABLATION.get(variant, {}):
        env["TRAIN_BENCH_ABLATE"] = ABLATION[variant]["ablate"]
    profiles = profiles_dir(variant, run_dir.parent / f"profiles-{run_dir.name}")
    if profiles is not None:
        env["TRAIN_PROFILES_DIR"] = str(profiles)
    trainbox = [sys.executable, "-m", "trainbox"]
    if variant == "bare":
        return bare_command(run_dir, train_args), dict(env, TRAIN_HEARTBEAT_FILE=str(run.heartbeat))
    if variant == "bare-supervised":
        return [*trainbox, "supervise", "--run-dir", str(run_dir), "--quiet", "--", *bare_command(run_dir, train_args)], env
    if variant == "fast/no-supervisor":
        argv = [sys.executable, "-m", "trainbox.yolo", "--profile", "fast", "--run-dir", str(run_dir), *train_args]
        return argv, dict(env, TRAIN_HEARTBEAT_FILE=str(run.heartbeat))
    profile = variant.split("/")[0]
    return [*trainbox, "run", "--profile", profile, "--run-dir", str(run_dir), "--quiet", *train_args], env


def launch(
    argv: List[str], env: Dict[str, str], run_dir: Path, gpu: Optional[str], timeout: float
) -> Tuple[Watched, float, float]:
    """Run ``argv`` to its end under a watcher; (what it saw, when it was launched, its wall time)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    seen, done = Watched(), threading.Event()
    launched, started = time.time(), time.monotonic()
    with open(run_dir / "bench-output.log", "wb") as output:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=watch, args=(proc, gpu, seen, done), daemon=True)
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
        raise SystemExit(f"{argv[:6]}: exit {code} after {wall:.0f} s; output ends:\n{tail}")
    return seen, launched, wall


def run_variant(
    variant: str, run_dir: Path, train_args: List[str], gpu: Optional[str], timeout: float, compile_off: bool = False
) -> Dict[str, Any]:
    """One run of ``variant``; its figures. ``compile_off``: torch.compile runs eagerly (``TORCH_COMPILE_DISABLE``)."""
    argv, env = command(variant, run_dir, train_args)
    if compile_off:
        env["TORCH_COMPILE_DISABLE"] = "1"
    seen, launched, wall = launch(argv, cli_env(env), run_dir, gpu, timeout)
    run = RunDir(run_dir)
    record = phases.read(run_dir / "marks.jsonl")
    batch = int(next(pair for pair in train_args if pair.startswith("batch=")).split("=")[1])
    first = phases.first_batch(record, launched)
    steady = phases.steady(record, batch)
    refusals = run.network_log.read_text().count(" pid=") if run.network_log.exists() else 0
    result: Dict[str, Any] = {
        "epoch_s": epoch_seconds(run_dir),
        "first_batch_s": first.pop("total"),
        "phase": first,
        **{key: value for key, value in steady.items() if value is not None},
        "fixed": phases.fixed_costs(record, steady["batch_s"]),
        "peak_mib": round(seen.peak_mib, 1),
        "wall_s": round(wall, 2),
        "network_refusals": refusals,
    }
    busy = phases.gpu_busy(record, seen.gpu_busy)
    if busy is not None:
        result["gpu_busy_pct"] = busy
    if compile_off:
        result["compile_off"] = True
    if variant not in ("bare", "fast/no-supervisor"):
        result["supervisor_cpu_share"] = seen.supervisor_cpu_s / wall
    if variant != "bare" and variant != "bare-supervised":
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


def _cell(row: Dict[str, Any], key: str, scale: float = 1.0, digits: int = 2) -> str:
    return span(row[key], scale=scale, digits=digits) if key in row else "—"


PHASES = ("supervisor", "imports", "probe", "scan", "setup", "workers", "first_step")
FIXED = ("val", "save", "boundary")


def _main_rows(result: Dict[str, Any]) -> List[str]:
    table, on_gpu = result["variants"], result["memory"] == "GPU"
    lines = [
        "| variant | amp | workers | steady img/s | steady vs bare | loader wait | GPU busy % | fixed s/epoch "
        "(val / save / boundary) | first batch s | s/epoch (results.csv) | speed vs bare (old) | "
        f"peak {result['memory']} MiB | supervisor CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in (v for v in ALL if v in table):
        row = table[name]
        decided = row.get("device") or {}
        bare_amp, bare_workers = (
            ("True (its check skipped offline)", "8") if on_gpu else ("False (CPU)", "0 (Ultralytics' on the CPU)")
        )
        own = name.startswith("bare")
        amp = decided.get("amp", bare_amp if own else "not recorded")  # no device event without heartbeats or supervisor
        workers = decided.get("workers", bare_workers if own else "not recorded")
        fixed = " / ".join(_cell(row, f"fixed_{key}", digits=2) for key in FIXED)
        shown = f"{name} (compile off: --quick on the CPU)" if row["compile_off"] else name
        lines.append(
            f"| {shown} | {amp} | {workers} | {_cell(row, 'imgs_per_s', digits=1)} | "
            f"{_cell(row, 'steady_ratio', digits=3)} | {_cell(row, 'loader_wait_share', 100, 1)} % | "
            f"{_cell(row, 'gpu_busy_pct', digits=0)} | {_cell(row, 'fixed_total')} ({fixed}) | "
            f"{_cell(row, 'first_batch_s', digits=1)} | {_cell(row, 'epoch_s')} | {_cell(row, 'speed', digits=3)} | "
            f"{_cell(row, 'peak_mib', digits=0)} | {_cell(row, 'supervisor_cpu_share', 100, 2)} % |"
        )
    return lines


def _phase_rows(table: Dict[str, Any]) -> List[str]:
    lines = [
        "| variant | first batch s | " + " | ".join(PHASES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in PHASES) + " |",
    ]
    for name in (v for v in ALL if v in table):
        row = table[name]
        cells = " | ".join(_cell(row, f"phase_{key}", digits=2) for key in PHASES)
        lines.append(f"| {name} | {_cell(row, 'first_batch_s', digits=1)} | {cells} |")
    return lines


def _share(gain: float, gap: float) -> str:
    """``gain`` as a share of ``gap``; none where fast is not behind bare (nothing to share out)."""
    return f"{100 * gain / gap:.0f} %" if gap > 1e-9 else "—"


def _ablation_rows(table: Dict[str, Any]) -> List[str]:
    """Each ablation variant's gain over fast, as a share of fast's gap to bare (steady speed, first batch, fixed
    cost), every figure taken against the bare run before it."""
    fast = table.get("fast", {})
    if "steady_ratio" not in fast or not any(v in table for v in ABLATION):
        return []
    gaps = {
        "steady_ratio": 1.0 - fast["steady_ratio"]["median"],
        "first_batch_over_bare_s": fast["first_batch_over_bare_s"]["median"],
        "fixed_over_bare_s": fast.get("fixed_over_bare_s", {}).get("median", 0.0),
    }
    lines = [
        f"Ablation: `fast` with one difference switched back to bare's. Gaps of `fast` to bare: steady speed "
        f"{gaps['steady_ratio']:+.3f} (1 - its ratio), first batch {gaps['first_batch_over_bare_s']:+.1f} s, fixed "
        f"cost {gaps['fixed_over_bare_s']:+.2f} s per epoch. A share is the variant's gain over `fast` as a part of that "
        "gap (negative: switching it back cost; over 100 %: it did better than bare; none where `fast` is not behind "
        "bare).",
        "",
        "| switched back | steady vs bare | share of the speed gap | first batch over bare s | share of the "
        "first-batch gap | fixed cost over bare s/epoch | share of the fixed-cost gap |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in (v for v in ABLATION if v in table and "steady_ratio" in table[v]):
        row = table[name]
        shares = []
        for key, sign in (("steady_ratio", 1.0), ("first_batch_over_bare_s", -1.0), ("fixed_over_bare_s", -1.0)):
            if key in row and key in fast:
                shares.append(_share(sign * (row[key]["median"] - fast[key]["median"]), gaps[key]))
            else:
                shares.append("—")
        lines.append(
            f"| {name.split('/', 1)[1]} | {span(row['steady_ratio'], digits=3)} | {shares[0]} | "
            f"{_cell(row, 'first_batch_over_bare_s', digits=1)} | {shares[1]} | {_cell(row, 'fixed_over_bare_s')} | {shares[2]} |"
        )
    return lines


def markdown(result: Dict[str, Any], command: str) -> str:
    table = result["variants"]
    decided_by = next((v for v in ALL if v in table and table[v].get("device")), "fast")
    device = table.get(decided_by, {}).get("device") or {}
    setup, taken = result["setup"], machine()
    lines = [
        f"# {device.get('description', 'device')}: trainbox against bare Ultralytics, split into its parts",
        "",
        f"yolov8n, {setup['train']} train / {setup['val']} val images at {setup['imgsz']} px, batch {setup['batch']}, "
        f"{setup['epochs']} epochs, {setup['rounds']} interleaved round(s), a bare run before every "
        f"{setup.get('bare_every') or 'round'} others; torch "
        f"{result['versions']['torch']}, Ultralytics {result['versions']['ultralytics']}. Load average (1 min) "
        f"during the runs: {span(result['load'], digits=1)}. Each figure is the median [min–max] over the rounds.",
        "",
        f"Taken {taken['date']} on {taken['host']} ({taken['cpu']}, {taken['cores']} cores), Python {taken['python']}.",
        "",
        f"Command: `{command}`",
        "",
        *_main_rows(result),
        "",
        "Time to first batch by phase, seconds:",
        "",
        *_phase_rows(table),
    ]
    ablation = _ablation_rows(table)
    if ablation:
        lines += ["", *ablation]
    if "fast" in table and "steady_ratio" in table["fast"]:
        fast = table["fast"]["steady_ratio"]["median"]
        if result["memory"] == "GPU":
            lines += [
                "",
                f"Goal, `fast` at {GOAL} of bare's steady speed or more: {'met' if fast >= GOAL else 'not met'} ({fast:.3f}).",
            ]
        else:
            lines += [
                "",
                f"On the CPU `fast` trains at {fast:.3f} of bare's steady speed. Bare loads its data in the training "
                "process there (Ultralytics sets workers=0 on the CPU) and `fast` in 4 workers, so this is no test of "
                f"the goal ({GOAL} of bare's speed), which is for a GPU; bench/loader.py compares the loaders alone.",
            ]
    lines += ["", DIFFERENCES]
    if device:
        lines += [
            "",
            f"trainbox decided for `{decided_by}`: amp={device.get('amp')} "
            f"({device.get('amp_check') or device.get('amp_reason')}); "
            f"workers: {device.get('workers_reason')}; pin_memory={device.get('pin_memory')}.",
        ]
    return "\n".join(lines) + "\n"


def _flatten(figures: Dict[str, Any]) -> Dict[str, Any]:
    """``phase`` and ``fixed`` sub-figures as ``phase_<name>`` and ``fixed_<name>``; None values dropped."""
    flat = {key: value for key, value in figures.items() if key not in ("phase", "fixed")}
    for group in ("phase", "fixed"):
        flat.update({f"{group}_{key}": value for key, value in (figures.get(group) or {}).items() if value is not None})
    return flat


def order(chosen: List[str], bare_every: int) -> List[str]:
    """One round's runs: bare first, and again before every ``bare_every`` other variants (0: once)."""
    others = [variant for variant in chosen if variant != "bare"]
    step = bare_every or len(others) or 1
    runs: List[str] = []
    for start in range(0, max(len(others), 1), step):
        runs += ["bare", *others[start : start + step]]
    return runs


def rounds(
    args: argparse.Namespace, chosen: List[str], gpu: Optional[str], directory: Path, data: Path
) -> Dict[str, Dict[str, List[Any]]]:
    """Every chosen variant once per round, each after a bare run of its own (``--bare-every``), compared with the
    latest bare run; stops starting runs past ``--time-limit``."""
    train_args = [f"data={data}", f"epochs={args.epochs}", f"imgsz={args.imgsz}", f"batch={args.batch}",
                  f"device={args.device}", "plots=False"]  # fmt: skip
    rows: Dict[str, Dict[str, List[Any]]] = {v: {} for v in chosen}
    begun = time.monotonic()
    for round_ in range(args.rounds):
        bare: Dict[str, Any] = {}
        for number, variant in enumerate(order(chosen, args.bare_every)):
            if args.time_limit and time.monotonic() - begun > args.time_limit:
                print(f"--time-limit {args.time_limit:.0f} s reached: {variant} of round {round_ + 1} not run", flush=True)
                return rows
            compile_off = variant in COMPILED and args.quick and gpu is None
            slug = f"{variant.replace('/', '-')}-{round_}-{number}"
            figures = _flatten(run_variant(variant, directory / slug, train_args, gpu, args.timeout, compile_off))
            bare = figures if variant == "bare" else bare
            figures["speed"] = bare["epoch_s"] / figures["epoch_s"]
            if "imgs_per_s" in figures and "imgs_per_s" in bare:
                figures["steady_ratio"] = figures["imgs_per_s"] / bare["imgs_per_s"]
            figures["first_batch_over_bare_s"] = figures["first_batch_s"] - bare["first_batch_s"]
            if "fixed_total" in figures and "fixed_total" in bare:
                figures["fixed_over_bare_s"] = figures["fixed_total"] - bare["fixed_total"]
            figures["load"] = os.getloadavg()[0]
            for key, value in figures.items():
                rows[variant].setdefault(key, []).append(value)
            print(
                f"round {round_ + 1}/{args.rounds} {variant}: {figures.get('imgs_per_s', 0):.1f} img/s steady "
                f"(x{figures.get('steady_ratio', 0):.3f}), {figures['epoch_s']:.2f} s/epoch, first batch "
                f"{figures['first_batch_s']:.1f} s, load {figures['load']:.1f}",
                flush=True,
            )
    return rows


def _summaries(rows: Dict[str, Dict[str, List[Any]]]) -> Dict[str, Dict[str, Any]]:
    variants: Dict[str, Dict[str, Any]] = {}
    listed = ("device", "network_refusals", "compile_off")
    for variant, columns in rows.items():
        if not columns:
            continue
        kept = {key: summary(values) for key, values in columns.items() if key not in listed}
        variants[variant] = dict(kept, network_refusals=sum(columns["network_refusals"]), compile_off="compile_off" in columns)
        if "device" in columns:
            variants[variant]["device"] = columns["device"][0]
    return variants


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="0", help="Ultralytics' device= (a GPU index, or cpu)")
    parser.add_argument("--quick", action="store_true", help="tiny data, every variant once: " + json.dumps(QUICK))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train", type=int, default=4800, help="images (default: 300 batches of 16 an epoch)")
    parser.add_argument("--val", type=int, default=128)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data", type=Path, default=None, help="a data.yaml to train on instead of generated data")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go (default bench/results)")
    parser.add_argument("--name", default=None, help="the results' file name (default: see the module docstring)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--time-limit", type=float, default=0, help="start no run past this many seconds (0: none)")
    parser.add_argument("--bare-every", type=int, default=4, help="a bare run before every N other variants (0: once a round)")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT),
        help=f"comma-separated of {', '.join(ALL)}; bare always runs (default: all but fast-compile)",
    )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the steady state is after the first)")
    gpu = None if args.device == "cpu" else args.device
    asked = set(args.variants.split(",")) | {"bare"}
    if asked - set(ALL):
        parser.error(f"--variants: unknown {', '.join(sorted(asked - set(ALL)))}; known: {', '.join(ALL)}")
    chosen = [v for v in ALL if v in asked]
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="trainbox-gpu-bench-") as tmp:
        data = args.data or demo_data(Path(tmp) / "data", args.train, args.val, args.imgsz, min(16, os.cpu_count() or 1))
        rows = rounds(args, chosen, gpu, Path(tmp), data)
    variants = _summaries(rows)
    loads += [value for column in rows.values() for value in column.get("load", [])]
    setup = {key: getattr(args, key) for key in ("train", "val", "imgsz", "batch", "epochs", "rounds", "device", "bare_every")}
    result = {"setup": setup, "versions": _versions(), "memory": "GPU" if gpu else "host RSS", "variants": variants,
              "load": summary(loads)}  # fmt: skip
    subset = "" if tuple(chosen) == DEFAULT else f" --variants {','.join(chosen)}"
    every = f" --bare-every {args.bare_every}" if args.bare_every != 4 else ""
    sizes = "".join(f" --{key} {getattr(args, key)}" for key in ("rounds", "train", "val", "imgsz", "batch", "epochs"))
    quick = " --quick" + (f" --rounds {args.rounds}" if args.rounds != 1 else "")
    flags = f"--device {args.device}{subset}" + (quick if args.quick else sizes) + every
    md = markdown(result, f"python bench/gpu.py {flags}")
    print(md)
    name = args.name or ("gpu-quick" if args.quick else "gpu-ablation" if gpu else "gpu-ablation-cpu")
    print(write_results(name, result, md, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
