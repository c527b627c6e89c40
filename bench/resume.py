"""Real programs resumed after a hang and after a kill during a checkpoint save, against bare runs with no fault.

    python bench/resume.py [--tries 20] [--bare 1] [--programs yolo,mnist,hf,lightning,nanogpt]

The programs are tests/real_programs.py's (Ultralytics' ``yolo train``, pytorch/examples' mnist, a Hugging Face
``Trainer`` script, a Lightning fit, nanoGPT's ``train.py``), run as they are, offline, under
``trainbox supervise`` with their faults injected from outside (tests/fixtures/uninstrumented). Per program:

* **bare**: the command alone, no supervisor, no fault (``--bare`` runs): its wall time;
* **hang**: supervised, hung after its first checkpoint (attempt 0): the detection time (the silence when the stall
  was called), the kill time, what the restart resumed from (trainbox's ``restart`` event) and from where the
  program itself says it went on (its attempt log), the work lost (in the program's own unit, from its output),
  and the wall time against the bare run's;
* **killed during a save** (``--tries`` runs): supervised, SIGKILLed while it writes its 1st, 2nd or 3rd
  checkpoint (in turn): a try passes when the run finishes and the restart resumed from the newest checkpoint the
  kill left whole (the program's own output says which), or started afresh when none was left.

Written to bench/results/resume.{json,md}, with the machine and the date.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from common import REPO, cli_env, events, write_results

from tests.real_programs import PROGRAMS_BY_NAME, Program, injected, supervise_args
from trainbox.rundir.layout import RunDir
from trainbox.yolo import offline

#: How many distinct saves the tries kill in turn (the 1st, 2nd, 3rd checkpoint write of a fresh attempt).
SAVES_KILLED = 3


def timed(command: List[str], env: Dict[str, str], cwd: Path) -> Dict[str, Any]:
    """Run ``command`` in ``cwd`` (made if need be) to its end; its exit status and wall seconds."""
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
    return {"code": done.returncode, "wall_s": round(time.monotonic() - started, 2)}


def bare(program: Program, work: Path) -> Dict[str, Any]:
    env = {**os.environ, **program.env}
    env.pop("TRAIN_FAULT", None)
    return timed(program.command(work), env, work)


def supervised(program: Program, work: Path, fault: Dict[str, str]) -> Dict[str, Any]:
    """One supervised run; its exit, wall time and events, and each attempt's log."""
    figures = timed(
        [sys.executable, "-m", "trainbox", *supervise_args(program, work)], cli_env(injected({**program.env, **fault})), work
    )
    run_dir = RunDir(work / "run")
    logs = list(itertools.takewhile(Path.is_file, (run_dir.attempt_log(number) for number in itertools.count())))
    figures["events"] = events(work / "run")
    figures["resumed"] = [program.resumed(path.read_text(errors="replace")) for path in logs]
    return figures


def hang_figures(program: Program, run: Dict[str, Any], bare_s: float) -> Dict[str, Any]:
    """What the lead's table needs of a hung run (see the module docstring)."""
    stall = next((e for e in run["events"] if e["event"] == "stall"), {})
    restart = next((e for e in run["events"] if e["event"] == "restart"), {})
    resumed_at = run["resumed"][1] if len(run["resumed"]) > 1 else None
    return {
        "code": run["code"],
        "hang": program.hang(),
        "detected_s": stall.get("silent_s"),
        "rule": stall.get("rule"),
        "kill_s": stall.get("kill_s"),
        "resumed_from": (restart.get("resumed") or {}).get("from"),
        "resumed_at": resumed_at,
        "lost": None if resumed_at is None else program.hung_by - resumed_at,
        "wall_s": run["wall_s"],
        "ratio": round(run["wall_s"] / bare_s, 2) if bare_s else None,
    }


def save_try(program: Program, saves: int, work: Path) -> Dict[str, Any]:
    """One kill during the (``saves``+1)-th checkpoint write: did the run resume from what was left whole?"""
    run = supervised(program, work, program.killed_saving(saves))
    expected = program.whole_after(saves)
    got = run["resumed"][1] if len(run["resumed"]) > 1 else "no restart"
    restart = next((e for e in run["events"] if e["event"] == "restart"), {})
    ok = run["code"] == 0 and got == expected
    return {
        "saves": saves,
        "ok": ok,
        "expected": expected,
        "resumed_at": got,
        "resumed": restart.get("resumed"),
        "wall_s": run["wall_s"],
    }


def measure(program: Program, tries: int, bare_runs: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"resume-{program.name}-") as tmp:
        root = Path(tmp)
        offline.prepare_environment(root / "ultralytics-config")  # yolo train reaches no network
        bares = [bare(program, root / f"bare-{i}") for i in range(bare_runs)]
        bare_s = statistics.median(run["wall_s"] for run in bares)
        hang = hang_figures(program, supervised(program, root / "hang", program.hang()), bare_s)
        saves = [save_try(program, i % SAVES_KILLED, root / f"save-{i}") for i in range(tries)]
    for at in saves:
        print(
            f"{program.name}: killed in save {at['saves'] + 1}: {'ok' if at['ok'] else 'FAILED'} {at['resumed_at']}", flush=True
        )
    return {"bare": bares, "bare_s": bare_s, "hang": hang, "saves": saves, "saves_ok": sum(at["ok"] for at in saves)}


def table(results: Dict[str, Dict[str, Any]], tries: int) -> str:
    lines = [
        "| program | hang injected | detected (s) | resumed from | lost work | wall, hung / bare (s) | killed saving: ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        program, hang = PROGRAMS_BY_NAME[name], result["hang"]
        fault = f"`{hang['hang']['TRAIN_FAULT']}` after `{hang['hang']['TRAIN_FAULT_TEXT']}`"
        where = Path(hang["resumed_from"]).relative_to(Path(hang["resumed_from"]).parents[1]) if hang["resumed_from"] else "-"
        lost = f"{hang['lost']} {program.unit}(s) (interval {program.interval})" if hang["lost"] is not None else "all"
        walls = f"{hang['wall_s']:.0f} / {result['bare_s']:.0f} ({hang['ratio']}x)"
        detected, saved = f"{hang['detected_s']} ({hang['rule']})", f"{result['saves_ok']}/{tries}"
        lines.append(f"| {name} | {fault} | {detected} | {where} | {lost} | {walls} | {saved} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20, help="kills during a save, per program")
    parser.add_argument("--bare", type=int, default=1, help="bare runs per program")
    parser.add_argument("--programs", default=",".join(PROGRAMS_BY_NAME), help="comma-separated")
    args = parser.parse_args(argv)
    results: Dict[str, Dict[str, Any]] = {}
    for name in args.programs.split(","):
        results[name] = measure(PROGRAMS_BY_NAME[name], args.tries, args.bare)
        path = write(results, args)  # after each program: a long bench that is stopped keeps what it measured
    print(f"written: {path.relative_to(REPO)}")
    return 0 if all(result["saves_ok"] == args.tries for result in results.values()) else 1


def write(results: Dict[str, Dict[str, Any]], args: argparse.Namespace) -> Path:
    load = os.getloadavg()[0]
    markdown = (
        f"# Real programs: resumed after a hang and after a kill during a save\n\n`python bench/resume.py --tries "
        f"{args.tries} --bare {args.bare}`; load average {load:.1f} at the end (other work shared the machine). "
        "The hang is the first fault of each run (attempt 0, after the program's first checkpoint); detected: the "
        "silence when the stall was called, and the rule. Lost work: from the checkpoint resumed from to where the "
        "hang came, in the program's own unit, read from its output. Wall: the supervised hung run to its end, against "
        "a bare run with no fault. Killed saving: tries that resumed from the newest checkpoint left whole (or started "
        f"afresh when none was), the 1st, 2nd and 3rd save killed in turn.\n\n{table(results, args.tries)}\n"
    )
    print(markdown, flush=True)
    return write_results("resume", {"tries": args.tries, "results": results}, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
