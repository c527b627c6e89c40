"""Incident reports: what a stalled run looked like, captured before anything is killed.

``RUN_DIR/incidents/<session>-<attempt>/`` (named by :class:`trainbox.rundir.layout.RunDir`) holds:

* ``summary.json``: which budget ran out, how long the child was silent, the
  last beat, and how each process's stack was obtained; under torchrun also
  ``silent_ranks`` and each rank's silence, budget and last beat (:mod:`trainbox.supervise.ranks`),
  whose ``pid`` names that rank's stack file; and the stall's ``cause``
  with the ``evidence`` that decided it (:mod:`trainbox.diagnose.causes`);
* ``evidence.json``: the samples of the silent tree the cause was judged from
  (:mod:`trainbox.diagnose.evidence`);
* ``processes.json`` and ``processes.txt``: the tree with states, CPU times, threads;
* ``stacks/<pid>.txt``: all threads' Python stacks of every process, from
  py-spy where ptrace is allowed, else from the faulthandler dump of processes
  that registered one (see :func:`trainbox.heartbeat.install_stack_dump`);
* ``heartbeat.json`` (the last beat, or the last counter read from the output), ``output-tail.txt`` (the
  output's last display lines as a terminal shows them: a progress bar's last state), ``kernel.txt``
  (amdgpu/kfd/DRM messages, GPU resets and hung tasks, from :mod:`trainbox.system.gpu_state`), ``gpu.txt``
  (rocm-smi or nvidia-smi, when present).

The directory is assembled under a temporary name and renamed when complete;
an existing report is never replaced. When the report cannot be written (a
full disk) the partial one is removed and the ``OSError`` raised: the
supervisor records that and carries on killing and restarting.
"""

from __future__ import annotations

import errno
import json
import math
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import psutil

from trainbox import heartbeat
from trainbox.atomic import fsync_path
from trainbox.rundir.layout import IncidentDir, Numbering
from trainbox.system import gpu_state, proctree

PY_SPY_TIMEOUT_S = 20.0
FAULTHANDLER_WAIT_S = 2.0
#: py-spy dumps at most this many processes at once.
PY_SPY_PARALLEL = 8

#: Classifies a stall from its stacks (pid -> text) and kernel messages; returns fields for summary.json.
Diagnose = Callable[[Mapping[int, str], str], Dict[str, Any]]


def _py_spy() -> Optional[str]:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None


def _stack_by_py_spy(pid: int) -> Tuple[Optional[str], str]:
    tool = _py_spy()
    if tool is None:
        return None, "py-spy not installed"
    try:
        done = subprocess.run(
            [tool, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy timed out after {PY_SPY_TIMEOUT_S:.0f} s"
    if done.returncode == 0 and "Thread" in done.stdout:
        return done.stdout, "py-spy"
    reason = (done.stderr.strip().splitlines() or ["no output"])[0]
    return None, f"py-spy failed: {reason}"


def _stacks_by_faulthandler(pids: Sequence[int], dumps: Optional[Numbering]) -> Dict[int, Tuple[Optional[str], str]]:
    """Ask every process that has a SIGUSR1 handler to dump its stacks into its file (``dumps(pid)``)."""
    results: Dict[int, Tuple[Optional[str], str]] = {}
    if dumps is None:
        return {pid: (None, "no faulthandler dump directory") for pid in pids}
    mask = 1 << (heartbeat.STACK_DUMP_SIGNAL - 1)
    asked: Dict[int, int] = {}
    for pid in pids:
        if not proctree.caught_signals(pid) & mask:
            results[pid] = (None, "no stack-dump handler registered (SIGUSR1 would kill it)")
            continue
        path = dumps(pid)
        asked[pid] = path.stat().st_size if path.exists() else 0
        try:
            psutil.Process(pid).send_signal(heartbeat.STACK_DUMP_SIGNAL)
        except psutil.Error as exc:
            results[pid] = (None, f"could not signal: {exc}")
            asked.pop(pid)
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, offset in list(asked.items()):
            path = dumps(pid)
            if path.exists() and path.stat().st_size > offset:
                time.sleep(0.1)
                with path.open() as handle:
                    handle.seek(offset)
                    results[pid] = (handle.read(), "faulthandler")
                asked.pop(pid)
    for pid in asked:
        results[pid] = (None, "faulthandler dump did not arrive")
    return results


def collect_stacks(pids: Sequence[int], dumps: Optional[Numbering]) -> Dict[int, Tuple[Optional[str], str]]:
    """Stacks per pid: py-spy in parallel first, the faulthandler dump for the rest."""
    with ThreadPoolExecutor(max_workers=max(1, min(PY_SPY_PARALLEL, len(pids)))) as pool:
        results = dict(zip(pids, pool.map(_stack_by_py_spy, pids)))
    missing = [pid for pid, (text, _) in results.items() if text is None]
    if missing:
        fallback = _stacks_by_faulthandler(missing, dumps)
        for pid, (text, how) in fallback.items():
            if text is not None:
                results[pid] = (text, how)
            else:
                results[pid] = (None, f"{results[pid][1]}; {how}")
    return results


def time_limit(processes: int) -> float:
    """The longest :func:`write_incident` may take for a tree of ``processes``: py-spy's rounds, the
    faulthandler wait, the GPU tools, and 10 s for the rest (the supervisor declares it to ``health``)."""
    return (
        math.ceil(max(processes, 1) / PY_SPY_PARALLEL) * PY_SPY_TIMEOUT_S + FAULTHANDLER_WAIT_S + gpu_state.READ_TIMEOUT_S + 10.0
    )


def _tree_text(rows: List[Dict[str, Any]]) -> str:
    by_parent: Dict[int, List[Dict[str, Any]]] = {}
    pids = {row["pid"] for row in rows}
    for row in rows:
        by_parent.setdefault(row["ppid"], []).append(row)
    lines: List[str] = []

    def show(row: Dict[str, Any], depth: int) -> None:
        lines.append(
            f"{'  ' * depth}{row['pid']:>7} {row['status']:<9} cpu {row['cpu_user_s']:>8.2f}u "
            f"{row['cpu_system_s']:>7.2f}s thr {row['threads']:>3} pgid {row['pgid']} sid {row['sid']}  "
            + " ".join(row["cmdline"])[:200]
        )
        for child in by_parent.get(row["pid"], []):
            show(child, depth + 1)

    for row in rows:
        if row["ppid"] not in pids:
            show(row, 0)
    return "\n".join(lines) + "\n"


def write_incident(
    directory: Path,
    *,
    tree: proctree.ProcessTree,
    reason: Dict[str, Any],
    last_beat: Optional[Dict[str, Any]],
    output_tail: str,
    dumps: Optional[Numbering],
    samples: Sequence[Dict[str, Any]] = (),
    diagnose: Optional[Diagnose] = None,
) -> Dict[str, Any]:
    """Write the report for one stall into ``directory``; return its summary (also in summary.json).

    ``dumps`` names the faulthandler dump of each pid (``RunDir.stack_dump``).
    ``samples`` go to evidence.json; ``diagnose`` is called once with the stacks
    just collected (nothing is dumped twice) and its fields join the summary.
    """
    started = time.monotonic()
    directory = Path(directory)
    staging = IncidentDir(directory.with_name(f".{directory.name}.partial"))
    shutil.rmtree(staging.root, ignore_errors=True)
    try:
        summary = _assemble(staging, tree, reason, last_beat, output_tail, dumps, started, samples, diagnose)
        # rename() replaces an empty directory silently: a report that exists is refused instead.
        if directory.exists():
            raise FileExistsError(errno.EEXIST, "an incident report of this name exists", str(directory))
        staging.root.rename(directory)
        fsync_path(directory.parent)
    except BaseException:
        shutil.rmtree(staging.root, ignore_errors=True)
        raise
    return summary


def _assemble(
    staging: IncidentDir,
    tree: proctree.ProcessTree,
    reason: Dict[str, Any],
    last_beat: Optional[Dict[str, Any]],
    output_tail: str,
    dumps: Optional[Numbering],
    started: float,
    samples: Sequence[Dict[str, Any]],
    diagnose: Optional[Diagnose],
) -> Dict[str, Any]:
    """Write every file of the report into ``staging``; return the summary."""
    staging.stack.directory.mkdir(parents=True)
    procs = tree.scan()
    rows = proctree.describe(procs)
    stacks = collect_stacks([row["pid"] for row in rows], dumps)
    how: Dict[str, str] = {}
    for pid, (text, method) in stacks.items():
        how[str(pid)] = method
        body = text if text is not None else f"no stack: {method}\n"
        staging.stack(pid).write_text(body)

    staging.processes_json.write_text(json.dumps(rows, indent=2))
    staging.processes_txt.write_text(_tree_text(rows))
    staging.heartbeat.write_text(json.dumps(last_beat, indent=2, sort_keys=True))
    staging.output_tail.write_text(output_tail)
    gpu = gpu_state.read()
    staging.kernel.write_text(gpu.kernel)
    staging.gpu.write_text(gpu.smi)
    staging.evidence.write_text(json.dumps(list(samples), indent=1, sort_keys=True, default=str))

    summary = dict(reason)
    if diagnose is not None:
        summary.update(diagnose({pid: text for pid, (text, _) in stacks.items() if text is not None}, gpu.kernel))
    summary.update(
        processes=len(rows),
        stacks=how,
        write_s=round(time.monotonic() - started, 3),
        bytes=sum(f.stat().st_size for f in staging.root.rglob("*") if f.is_file()),
    )
    staging.summary.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return summary
