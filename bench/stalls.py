"""Stall handling per hang kind: detection lateness, report, kill, time to the resumed first beat; and
cause-aware stalls side by side with the clock alone (today).

    python bench/stalls.py [--repeat 3] [--budget 5] [--yolo-repeat 1] [--rank-repeat 1] [--cause-repeat 1]
                           [--idle-timeout 120] [--uninstrumented-repeat 0] [--accuracy 20]
                           [--busy-silences 3] [--busy-name busy-silences]

Each run supervises the beating child of ``trainbox.faults`` with a hang armed for
attempt 0; attempt 1 runs to completion. From the events: how late after the
budget ran out the stall was noticed, how long the incident report took and
its size, how long the kill took, and the time from "tree gone" to the first
beat of the resumed attempt (this includes the restart backoff, reported too).

``--rank-repeat``: a torchrun job, 2 ranks of examples/plain_pytorch.py (DDP,
gloo, CPU), whose rank 1 hangs in epoch 1: budget -> the whole job gone
(agent and both ranks), and job gone -> the first resumed step of every rank
(the latest of the ranks' first beats with a step, each rank's own timestamp,
read from its heartbeat file while the run goes on). Written to
``stalls-ranks``; the rest to ``stalls``.

``--uninstrumented-repeat``: commands that never call ``beat()``, supervised by the counters their output shows
(a plain tqdm loop, tests/fixtures/output/programs/tqdm_loop.py, and Ultralytics' own ``yolo train``, offline as
``trainbox run`` makes it), each hung by trainbox.faults' ``output`` site (tests/fixtures/uninstrumented): from the
last counter read (the hang, to within one redraw) to the stall being called, as the supervisor measured it, and
how late after the budget that was. Written to ``stalls-uninstrumented``.

Cause-aware (``causes()``), each measured, never computed, except where "today" would mean waiting out a 1200 s
budget (its figure is then the budget, which the first table shows is met within a fraction of a second):

* a deadlock before the first beat and a frozen validation pass under ``safe``'s budgets (startup and
  validation 1200 s): seconds from the hang to the tree being gone, by idleness (``--idle-timeout``);
* a compile (real ``cc -O2`` processes; in-process work growing TORCHINDUCTOR_CACHE_DIR) three stall budgets
  long: kills with ``--compile-cap 0`` (today: no extension) and with the default cap;
* the classifier's cause for every scenario run here and for the recorded gpu_wait/io_wait evidence
  (tests/fixtures/causes), against the cause each one is;
* the sampler's CPU per sample (``Sample.cost_s`` of every sample in the incidents' evidence.json) and what
  that is per second of silence (one sample every ``SAMPLE_EVERY_S``).

``--accuracy N`` (:mod:`stall_accuracy`): the classifier's accuracy, every cause scenario run N times under the
real supervisor, per cause and macro, with the share called ``unknown``; written to ``stall-accuracy``.

``--busy-silences N`` (:mod:`busy_silences`): healthy long silences (a busy evaluation or save, in the middle of a
bar and after it) and hangs in the middle of a bar, N times each: the false-stall rate beside the time each hang
was found; written to ``busy-silences`` (``--busy-name``: another name, for another checkout's figures).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from common import REPO, cli_env, events, span, summary, train_cli, write_results

from trainbox import heartbeat
from trainbox.diagnose.causes import classify
from trainbox.diagnose.evidence import SAMPLE_EVERY_S
from trainbox.diagnose.window import Window
from trainbox.rundir.layout import IncidentDir, RunDir
from trainbox.yolo import offline

KINDS = ["sleep", "lock", "spin", "fork", "ignore-sigterm", "setsid"]
#: The cause each hang is (the classifier's accuracy is judged against these).
EXPECTED = {
    "sleep": "idle",
    "lock": "idle",
    "spin": "busy_python",
    "fork": "idle",
    "ignore-sigterm": "idle",
    "setsid": "idle",
    "worker deadlock (fast)": "loader_deadlock",
    "hang after validation": "idle",
}
#: Ultralytics hangs: (profile, fault, startup budget) under `python -m trainbox run` on demo data.
YOLO_KINDS = {
    "worker deadlock (fast)": ("fast", "sleep@worker,attempt=0,train=1,epoch>=2", 120),
    "hang after validation": ("safe", "sleep@val_end,attempt=0,epoch=1", 120),
    "first batch never comes": ("safe", "sleep@worker,attempt=0,train=1,epoch=1", 30),
}
#: The dataset the uninstrumented figures were measured on (32 + 8 images, demo-data's counts then, at 64 px; the demo's
#: own grew to 64 + 16 so that it learns: docs/getting-started.md, The demo).
MEASURED_DATA = ("--train", "32", "--val", "8", "--imgsz", "64")
BACKOFF_S = 0.5
GRACE_S = 2.0
#: Uninstrumented commands and where they hang: (command, the fault's environment, budgets; None: ``--budget``). The
#: tqdm loop's 21st line end is step 20's draw; Ultralytics' hang is placed by the text of its first epoch's bar
#: (tests/yolo/test_uninstrumented.py says why).
#: ``yolo train`` has stretches without a counter (stripping the optimizer, fusing the model for its final
#: validation: over 10 s on 2 busy cores), so its stall budget is long and its idle hang is found by the idle rule.
UNINSTRUMENTED = {
    "tqdm loop, hung at step 20": ("tqdm", {"TRAIN_FAULT": "sleep@output,attempt=0,lines>=21"}, ["--startup-timeout", "30"]),
    "yolo train, hung in epoch 1": (
        "yolo",
        {"TRAIN_FAULT": "sleep@output,attempt=0,seen>=1", "TRAIN_FAULT_TEXT": "1/2  "},
        ["--startup-timeout", "120", "--stall-timeout", "60", "--idle-timeout", "10"],
    ),
}
#: The injector's folder (its sitecustomize arms the output site in any Python program started with it on PYTHONPATH).
INJECTOR = REPO / "tests" / "fixtures" / "uninstrumented"
#: The torchrun job: 2 DDP ranks of the example, 4 batches per rank and epoch; rank 1 hangs in epoch 1.
RANKS = 2
RANK_JOB = [str(REPO / "examples" / "plain_pytorch.py"), "--samples", "64", "--batch", "8", "--workers", "0", "--epochs", "2"]
RANK_FAULT = "sleep@step,rank=1,epoch=1,attempt=0"


def measure(kind: str, budget: float) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        code = train_cli(
            [
                "supervise",
                "--run-dir",
                str(run_dir),
                "--startup-timeout",
                "30",
                "--stall-timeout",
                str(budget),
                "--grace",
                str(GRACE_S),
                "--backoff",
                str(BACKOFF_S),
                "--quiet",
                "--",
                sys.executable,
                "-m",
                "trainbox.faults",
                "--steps",
                "20",
                "--interval",
                "0.1",
            ],
            {"TRAIN_FAULT": f"{kind}@step,step=5,attempt=0"},
        )
        history = events(run_dir)
    figures = stall_figures(kind, code, history)
    CAUSES.setdefault(kind, []).append(next(e for e in history if e["event"] == "stall")["cause"])
    return {k: v for k, v in figures.items() if k not in ("budget_s", "kill_to_first_batch_s")}


#: Causes the stalls of each scenario were given, in run order.
CAUSES: Dict[str, List[str]] = {}


def measure_yolo(profile: str, fault: str, startup: int, data: Path) -> Tuple[Dict[str, float], str]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        code = train_cli(
            ["run", "--profile", profile, "--run-dir", str(run_dir), "--stall-timeout", "10", "--startup-timeout",
             str(startup), "--backoff", "0.5", "--quiet", f"data={data}", "epochs=2", "imgsz=64", "batch=8", "plots=False"],
            {"TRAIN_FAULT": fault},
        )  # fmt: skip
        history = events(run_dir)
    figures = stall_figures(fault, code, history)
    figures.pop("incident_bytes")
    return figures, next(e for e in history if e["event"] == "stall")["cause"]


def uninstrumented_command(kind: str, work: Path) -> List[str]:
    if kind == "tqdm":
        loop = REPO / "tests" / "fixtures" / "output" / "programs" / "tqdm_loop.py"
        return [sys.executable, str(loop), "--epochs", "1", "--steps", "40", "--delay", "0.1"]
    data = work / "data"
    train_cli(["demo-data", str(data), *MEASURED_DATA], {})
    yolo = str(Path(sys.executable).parent / "yolo")
    train = ["model=yolov8n.yaml", f"data={data / 'data.yaml'}", "epochs=2", "imgsz=64", "batch=8", "device=cpu"]
    return [yolo, "train", *train, "workers=0", "plots=False", "amp=False", f"project={work}", "name=train", "exist_ok=True"]


def measure_uninstrumented(label: str, budget: float) -> Dict[str, float]:
    kind, fault, budgets = UNINSTRUMENTED[label]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        offline.prepare_environment(work / "ultralytics-config")  # as `trainbox run` makes it, for `yolo train`
        run_dir = work / "run"
        args = ["supervise", "--run-dir", str(run_dir), "--stall-timeout", str(budget), *budgets]
        args += ["--grace", str(GRACE_S), "--backoff", str(BACKOFF_S)]
        env = {**fault, "PYTHONPATH": str(INJECTOR)}
        code = train_cli([*args, "--quiet", "--", *uninstrumented_command(kind, work)], env)
        history = events(run_dir)
    figures = stall_figures(label, code, history)
    stall = next(e for e in history if e["event"] == "stall")
    if not (stall.get("last_beat") or {}).get("pattern"):
        raise SystemExit(f"{label}: the stall was not judged by a counter read from the output: {stall}")
    figures["hang_to_found_s"] = stall["silent_s"]
    figures["found_to_gone_s"] = stall["incident_s"] + stall["kill_s"]
    figures.pop("incident_bytes")
    RULES.setdefault(label, []).append(stall["rule"])
    return figures


#: The rule that called each uninstrumented stall (budget, idle), in run order.
RULES: Dict[str, List[str]] = {}


def report_uninstrumented(repeat: int, budget: float) -> None:
    load_before = os.getloadavg()
    runs: Dict[str, List[Dict[str, float]]] = {label: [] for label in UNINSTRUMENTED}
    for round_ in range(repeat):
        for label in UNINSTRUMENTED:  # interleaved
            runs[label].append(measure_uninstrumented(label, budget))
            print(f"round {round_ + 1}/{repeat} {label}: {runs[label][-1]}", flush=True)
    load = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    table = {label: {m: summary([r[m] for r in rows]) for m in rows[0]} for label, rows in runs.items()}
    metrics = ("hang_to_found_s", "found_to_gone_s", "kill_to_first_beat_s")
    lines = [
        f"# Stalls of commands that never call beat() ({repeat} run(s) each, grace {GRACE_S:g} s, backoff {BACKOFF_S} s)",
        "",
        f"Command: `python bench/stalls.py --repeat 0 --yolo-repeat 0 --cause-repeat 0 --rank-repeat 0 "
        f"--uninstrumented-repeat {repeat} --budget {budget:g}`. Progress is the counter read from the output (no "
        "heartbeat file); the hang is trainbox.faults' `output` site. Medians, [min–max]. Load average (1, 5, 15 min) "
        f"before {load[:3]}, after {load[3:]}.",
        "",
        "| command | budgets | rule | last counter read (the hang) → stall called s | budget → called s "
        "| called → tree gone s | gone → first counter of the restarted attempt s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in table.items():
        given = UNINSTRUMENTED[label][2]
        budgets = " ".join(given) if "--stall-timeout" in given else f"--stall-timeout {budget:g}"
        rules = ", ".join(sorted(set(RULES[label])))
        late = span(row["detect_late_s"]) if rules == "budget" else "— (idle rule)"
        cells = [span(row[metrics[0]]), late, *(span(row[m]) for m in metrics[1:])]
        lines.append(f"| {label} | `{budgets}` | {rules} | " + " | ".join(cells) + " |")
    data = {"grace_s": GRACE_S, "backoff_s": BACKOFF_S, "load_average": load, "commands": table}
    path = write_results("stalls-uninstrumented", data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"results: {path}")


def measure_ranks(budget: float) -> Dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), *RANK_JOB]
        budgets = ["--startup-timeout", "120", "--stall-timeout", str(budget)]
        args = ["supervise", "--run-dir", str(run_dir), *budgets, "--grace", str(GRACE_S), "--backoff", str(BACKOFF_S), "--quiet"]
        args += ["--", *torchrun]
        code, first_steps = supervise_watching_ranks(args)
        history = events(run_dir)
    figures = stall_figures("2 ranks", code, history)
    stall = next(e for e in history if e["event"] == "stall")
    if len(first_steps) != RANKS:
        raise SystemExit(f"2 ranks: resumed steps seen for ranks {sorted(first_steps)} only")
    figures["kill_to_every_rank_step_s"] = max(first_steps.values()) - stall["killed_ts"]
    figures.pop("incident_bytes")
    return figures


def supervise_watching_ranks(args: List[str]) -> Tuple[int, Dict[int, float]]:
    """Run the CLI; return its status and, per rank, when it beat its first step after the restart (its own ``ts``)."""
    run = RunDir(Path(args[args.index("--run-dir") + 1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainbox", *args],
        env=cli_env({"TRAIN_FAULT": RANK_FAULT}),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first: Dict[int, float] = {}
    restarted: Optional[float] = None
    while proc.poll() is None:
        if restarted is None:
            restarted = next((e["ts"] for e in events(run.root) if e["event"] == "restart"), None)
        elif run.rank_heartbeat.directory.is_dir():
            for path in run.rank_heartbeat.directory.iterdir():
                beat = heartbeat.read(path) or {}
                if "step" in beat and beat.get("ts", 0) > restarted:
                    first.setdefault(int(beat["rank"]), float(beat["ts"]))
        time.sleep(0.02)  # a rank's first beat of the attempt stays in its file for at least a second (the throttle)
    return proc.returncode, first


def stall_figures(label: str, code: int, history: List[Dict[str, Any]]) -> Dict[str, float]:
    """From a run's events: how late the stall was noticed, report and kill times, time to the resumed run."""
    if code != 0:
        raise SystemExit(f"{label}: supervisor exited {code}: {history}")
    stall = next(e for e in history if e["event"] == "stall")
    resumed = next(e for e in history if e["event"] == "exit")
    late = stall["silent_s"] - stall["budget_s"]
    return {
        "budget_s": stall["budget_s"],
        "detect_late_s": late,
        "incident_s": stall["incident_s"],
        "incident_bytes": stall["incident_bytes"],
        "kill_s": stall["kill_s"],
        "stall_to_kill_s": late + stall["incident_s"] + stall["kill_s"],
        "kill_to_first_beat_s": resumed["first_beat_ts"] - stall["killed_ts"],
        "kill_to_first_batch_s": (resumed["first_step_ts"] or resumed["first_beat_ts"]) - stall["killed_ts"],
    }


#: safe's budgets (env/profiles/safe.yaml): the first batch and a validation pass may each stay silent 1200 s.
SAFE_BUDGETS = ["--startup-timeout", "1200", "--stall-timeout", "300"]
SAFE_VAL_S = 1200


def supervised(
    fault: str, options: List[str], child: Tuple[str, ...] = (), env: Optional[Dict[str, str]] = None
) -> Tuple[List[Dict[str, Any]], List[float]]:
    """Supervise the faults child with ``fault`` armed; (events, sampler cost of every sample in the incidents)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = ["supervise", "--run-dir", str(run_dir), *options, "--grace", str(GRACE_S), "--backoff", str(BACKOFF_S)]
        argv = [sys.executable, "-m", "trainbox.faults", "--steps", "20", "--interval", "0.1", *child]
        code = train_cli([*args, "--quiet", "--", *argv], {"TRAIN_FAULT": fault, **(env or {})})
        history = events(run_dir)
        costs = [
            sample["cost_s"]
            for e in history
            if e["event"] == "stall" and e.get("incident")
            for sample in json.loads(IncidentDir(Path(e["incident"])).evidence.read_text())
        ]
    if code != 0:
        raise SystemExit(f"{fault}: supervisor exited {code}: {history}")
    return history, costs


def _stalls(history: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [e for e in history if e["event"] == "stall"]


def hang_to_gone_s(stall: Dict[str, Any]) -> float:
    """From the last progress (the hang) to the tree being gone: the silence, the report, the kill."""
    return float(stall["silent_s"] + stall["incident_s"] + stall["kill_s"])


def recorded_causes() -> Dict[str, Tuple[str, str]]:
    """The classifier on the recorded gpu_wait/io_wait evidence: name -> (expected, found)."""
    found = {}
    for fixture in sorted((REPO / "tests" / "fixtures" / "causes").iterdir()):
        if not (fixture / "expected.json").exists():
            continue
        expected = json.loads((fixture / "expected.json").read_text())
        recorded = IncidentDir(fixture)  # laid out as an incident report
        window = Window.from_json(json.loads(recorded.evidence.read_text()))
        stacks = {int(path.stem): path.read_text() for path in recorded.stack.directory.glob("*.txt")}
        diagnosis = classify(window, stacks, expected["main_pid"], recorded.kernel.read_text())
        found[f"recorded: {fixture.name}"] = (expected["cause"], diagnosis.cause.value)
    return found


def causes(idle_timeout: float, budget: float, repeat: int) -> Tuple[List[str], Dict[str, Any]]:
    """The cause-aware figures (see the module docstring): markdown lines and the data."""
    idle = ["--idle-timeout", f"{idle_timeout:g}"]
    costs: List[float] = []
    hangs: Dict[str, List[float]] = {"startup deadlock": [], "validation freeze": []}
    kills: Dict[str, Dict[str, List[int]]] = {}
    val = ("--slow-step", "5", "--slow-seconds", "0", "--phase-timeout", str(SAFE_VAL_S), "--slow-phase", "val")
    compile_s = str(3 * budget)
    for round_ in range(repeat):
        for label, fault, child in (
            ("startup deadlock", "lock@start,attempt=0", ()),
            ("validation freeze", "sleep@slow,attempt=0", val),
        ):
            history, cost = supervised(fault, SAFE_BUDGETS + idle, child)
            costs += cost
            hangs[label].append(hang_to_gone_s(_stalls(history)[0]))
            CAUSES.setdefault(label, []).append(_stalls(history)[0]["cause"])
        with tempfile.TemporaryDirectory() as cache:
            for label, fault in (("compile: cc -O2 processes", "cc"), ("compile: in-process, growing Inductor cache", "cache")):
                env = {"TRAIN_FAULT_SECONDS": compile_s, "TORCHINDUCTOR_CACHE_DIR": cache}
                row = kills.setdefault(label, {"today": [], "cause-aware": []})
                for mode, cap in (("today", ["--compile-cap", "0"]), ("cause-aware", [])):
                    history, cost = supervised(f"{fault}@step,step=5,attempt=0", ["--stall-timeout", str(budget), *cap], env=env)
                    costs += cost
                    row[mode].append(len(_stalls(history)))
        history, cost = supervised(
            "cc@step,step=5,attempt=0",
            ["--stall-timeout", str(budget), "--compile-cap", str(4 * budget)],
            env={"TRAIN_FAULT_SECONDS": "100000"},
        )
        costs += cost
        CAUSES.setdefault("compile that never ends", []).append(_stalls(history)[0]["cause"])
        history, cost = supervised("loader@step,step=5,attempt=0", ["--stall-timeout", "120", *idle])
        costs += cost
        CAUSES.setdefault("DataLoader, forked workers blocked", []).append(_stalls(history)[0]["cause"])
        print(f"cause-aware round {round_ + 1}/{repeat}: {hangs} {kills} {CAUSES}", flush=True)
    expected = dict(
        EXPECTED,
        **{
            "startup deadlock": "idle",
            "validation freeze": "idle",
            "compile that never ends": "kernel_compile",
            "DataLoader, forked workers blocked": "loader_deadlock",
        },
    )
    scored = [(label, expected[label], cause) for label, found in CAUSES.items() if label in expected for cause in found]
    scored += [(label, want, got) for label, (want, got) in recorded_causes().items()]
    right = sum(want == got for _, want, got in scored)
    cost_ms = 1000 * statistics.median(costs)
    lines = [
        "",
        f"Cause-aware stalls vs the clock alone (today), {repeat} run(s) each, --idle-timeout {idle_timeout:g}:",
        "",
        "| scenario | today | cause-aware | goal |",
        "| --- | --- | --- | --- |",
    ]
    for label, runs in hangs.items():
        lines.append(
            f"| {label} under safe's budgets: hang → tree gone, s | {SAFE_VAL_S} (the budget) | "
            f"{span(summary(runs), digits=1)} | ≤ idle-timeout + 10 = {idle_timeout + 10:g} |"
        )
    for label, row in kills.items():
        lines.append(
            f"| {label}, {compile_s} s > stall budget {budget:g} s: kills | {sum(row['today'])} in {len(row['today'])} run(s) | "
            f"{sum(row['cause-aware'])} in {len(row['cause-aware'])} run(s) | 0 |"
        )
    wrong = [f"{label}: {got} (is {want})" for label, want, got in scored if want != got]
    lines += [
        f"| classifier: right causes over {len(scored)} stalls of {len({s[0] for s in scored})} scenarios "
        f"(incl. recorded gpu_wait/io_wait) | — | {right}/{len(scored)} | all |",
        f"| sampler: CPU per sample (median of {len(costs)}) / share of a core while silent | — | "
        f"{cost_ms:.1f} ms / {cost_ms / 1000 / SAMPLE_EVERY_S:.2%} | overhead unchanged |",
    ]
    if wrong:
        lines += ["", "Misclassified: " + "; ".join(wrong) + "."]
    data = {
        "idle_timeout_s": idle_timeout,
        "hang_to_gone_s": {k: summary(v) for k, v in hangs.items()},
        "compile_kills": kills,
        "causes": CAUSES,
        "scored": scored,
        "accuracy": f"{right}/{len(scored)}",
        "sample_cost_ms": summary([1000 * c for c in costs]),
    }
    return lines, data


def _cell_of(row: Dict[str, Any], metric: str, scale: float = 1.0) -> str:
    return span(row[metric], scale)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument("--yolo-repeat", type=int, default=1, help="runs of each Ultralytics hang (0: none)")
    parser.add_argument("--rank-repeat", type=int, default=1, help="runs of the 2-rank torchrun hang (0: none)")
    parser.add_argument("--cause-repeat", type=int, default=1, help="runs of each cause-aware scenario (0: none)")
    parser.add_argument("--idle-timeout", type=float, default=120.0, help="--idle-timeout of the cause-aware runs")
    parser.add_argument("--uninstrumented-repeat", type=int, default=0, help="runs of each uninstrumented hang (0: none)")
    parser.add_argument("--accuracy", type=int, default=0, help="runs of every cause scenario for the classifier's accuracy")
    parser.add_argument("--busy-silences", type=int, default=0, help="runs of each healthy long silence and mid-bar hang")
    parser.add_argument("--busy-name", default="busy-silences", help="results name of --busy-silences")
    args = parser.parse_args()
    if args.busy_silences:
        import busy_silences

        busy_silences.main(args.busy_silences, args.busy_name)
    if args.accuracy:
        import stall_accuracy

        stall_accuracy.main(args.accuracy, recorded_causes())
    if args.uninstrumented_repeat:
        report_uninstrumented(args.uninstrumented_repeat, args.budget)
    if args.rank_repeat:
        report_ranks(args.rank_repeat, args.budget)
    samples: Dict[str, List[Dict[str, float]]] = {k: [] for k in KINDS}
    for round_ in range(args.repeat):
        for kind in KINDS:  # interleaved: one of each kind per round
            samples[kind].append(measure(kind, args.budget))
            print(f"round {round_ + 1}/{args.repeat} {kind}: {samples[kind][-1]}", flush=True)
    table: Dict[str, Any] = {
        kind: {metric: summary([s[metric] for s in runs]) for metric in runs[0]} for kind, runs in samples.items() if runs
    }
    lines = [
        f"# Stall handling (budget {args.budget:.0f} s, grace {GRACE_S:.0f} s, backoff {BACKOFF_S} s, {args.repeat} runs each)",
        "",
        f"Command: `python bench/stalls.py --repeat {args.repeat} --budget {args.budget:g} --yolo-repeat {args.yolo_repeat} "
        "--cause-repeat 0 --rank-repeat 0`. Medians, [min–max].",
        "",
        "| hang | budget→noticed s | report s | report KiB | kill s | budget→tree gone s | gone→first resumed beat s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, row in table.items():
        cell = functools.partial(_cell_of, row)
        lines.append(
            f"| {kind} | {cell('detect_late_s')} | {cell('incident_s')} | {cell('incident_bytes', 1 / 1024)} | "
            f"{cell('kill_s')} | {cell('stall_to_kill_s')} | {cell('kill_to_first_beat_s')} |"
        )
    yolo: Dict[str, List[Dict[str, float]]] = {k: [] for k in YOLO_KINDS}
    if args.yolo_repeat:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "data"
            train_cli(["demo-data", str(data), *MEASURED_DATA], {})
            for _ in range(args.yolo_repeat):
                for kind, (profile, fault, startup) in YOLO_KINDS.items():
                    figures, cause = measure_yolo(profile, fault, startup, data / "data.yaml")
                    yolo[kind].append(figures)
                    CAUSES.setdefault(kind, []).append(cause)
                    print(f"{kind}: {yolo[kind][-1]}, cause {cause}", flush=True)
        lines += [
            "",
            f"Ultralytics (`python -m trainbox run`, yolov8n on demo data, CPU, {args.yolo_repeat} run(s) each):",
            "",
            "| hang | budget s | budget→noticed s | report s | kill s | gone→first resumed beat s | gone→first resumed batch s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        metrics = ("detect_late_s", "incident_s", "kill_s", "kill_to_first_beat_s", "kill_to_first_batch_s")
        for kind, runs in yolo.items():
            row = {metric: summary([r[metric] for r in runs]) for metric in runs[0]}
            table[kind] = row
            lines.append(f"| {kind} | {row['budget_s']['median']:.0f} | " + " | ".join(span(row[m]) for m in metrics) + " |")
    if args.repeat or args.yolo_repeat:
        results = {"budget_s": args.budget, "grace_s": GRACE_S, "backoff_s": BACKOFF_S, "kinds": table}
        text = "\n".join(lines) + "\n"
        print(text)
        print(f"results: {write_results('stalls', results, text)}")
    if args.cause_repeat:  # its own results file: the clock-alone figures above need not be run again with it
        more, data = causes(args.idle_timeout, args.budget, args.cause_repeat)
        command = (
            f"Command: `python bench/stalls.py --repeat 0 --yolo-repeat 0 --cause-repeat {args.cause_repeat} --rank-repeat 0 "
            f"--budget {args.budget:g} --idle-timeout {args.idle_timeout:g}`. Medians, [min–max]."
        )
        text = "\n".join(["# Cause-aware stalls", "", command, *more]) + "\n"
        print(text)
        print(f"results: {write_results('stall-causes', data, text)}")
    return 0


def report_ranks(repeat: int, budget: float) -> None:
    runs = []
    for round_ in range(repeat):
        runs.append(measure_ranks(budget))
        print(f"round {round_ + 1}/{repeat} 2 ranks: {runs[-1]}", flush=True)
    row = {metric: summary([r[metric] for r in runs]) for metric in runs[0]}
    metrics = ("detect_late_s", "incident_s", "kill_s", "stall_to_kill_s", "kill_to_first_beat_s", "kill_to_every_rank_step_s")
    lines = [
        f"# Stall of one torchrun rank ({RANKS} ranks, budget {budget:g} s, grace {GRACE_S:g} s, backoff {BACKOFF_S} s, "
        f"{repeat} run(s))",
        "",
        "Command: `python bench/stalls.py --repeat 0 --yolo-repeat 0 --cause-repeat 0 "
        f"--rank-repeat {repeat} --budget {budget:g}`. "
        "`examples/plain_pytorch.py` "
        f"under `torchrun --nproc-per-node {RANKS}` (DDP, gloo, CPU), fault `{RANK_FAULT}`. Medians, [min–max].",
        "",
        "| budget→noticed s | report s | kill s | budget→job gone s | gone→first resumed beat s "
        "| gone→first resumed step, every rank s |",
        "| --- | --- | --- | --- | --- | --- |",
        "| " + " | ".join(span(row[m]) for m in metrics) + " |",
    ]
    data = {"budget_s": budget, "grace_s": GRACE_S, "backoff_s": BACKOFF_S, "ranks": RANKS, "figures": row}
    path = write_results("stalls-ranks", data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"results: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
