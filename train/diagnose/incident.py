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
  that registered one (see :func:`trainbox.heartbeat.install_stack_dump`). py-spy is asked for its JSON dump,
  written out in its own text form (:func:`render_py_spy`) with one thing its text leaves out: ``idle+gil`` for a
  thread that holds the GIL while off the CPU (a C call that kept it: every other thread waits on it);
* ``heartbeat.json`` (the last beat, or the last counter read from the output), ``output-tail.txt`` (the
  output's last display lines as a terminal shows them: a progress bar's last state), ``kernel.txt``
  (amdgpu/kfd/DRM messages, GPU resets and hung tasks, from :mod:`trainbox.system.gpu_state`), ``gpu.txt``
  (rocm-smi or nvidia-smi, when present).

The directory is assembled under a temporary name and renamed when complete;
an existing report is never replaced. Everything is written through
:mod:`trainbox.rundir.safe`, and the temporary name is random
(``incidents/.<name>.<random>.partial``): a predictable one would let the child
plant a link there first. When the report cannot be written (a full disk, or
something in the way that is refused) the partial one is left unnamed and an
``OSError`` raised: the supervisor records that and carries on killing and
restarting. Stack dumps are read back the same way, at most
:data:`MAX_DUMP_BYTES` of each (a dump that is a FIFO or a link is no dump).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import re
import secrets
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import psutil

from trainbox import heartbeat
from trainbox.rundir.layout import IncidentDir, RunDir
from trainbox.rundir.safe import PathLike, Refusal, RunFiles, names
from trainbox.system import gpu_state, proctree

PY_SPY_TIMEOUT_S = 20.0
FAULTHANDLER_WAIT_S = 2.0
#: py-spy dumps at most this many processes at once.
PY_SPY_PARALLEL = 8
#: The most of one faulthandler dump that is read (hundreds of threads' stacks are under 1 MiB).
MAX_DUMP_BYTES = 4 << 20
#: The random part of a report's temporary folder name (see the module's docstring).
STAGING_RANDOM_BYTES = 8

#: Classifies a stall from its stacks (pid -> text) and kernel messages; returns fields for summary.json.
Diagnose = Callable[[Mapping[int, str], str], Dict[str, Any]]


def py_spy_path() -> Optional[str]:
    """Where py-spy is: on the PATH, else beside this Python; None when it is not installed."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None  # not the run directory: py-spy beside Python


def render_py_spy(pid: int, dump: str) -> Optional[str]:
    """``py-spy dump --json`` as py-spy's text dump (``Thread <tid> (<status>): "<name>"``, then ``function
    (file:line)`` innermost first), the status ``active``/``idle`` with ``+gil`` for the thread that holds the GIL,
    whether it runs or not (py-spy's text marks only a running one); None when ``dump`` is not such a dump."""
    try:
        threads = json.loads(dump)
    except ValueError:
        return None
    if not isinstance(threads, list):
        return None
    lines = [f"Process {pid}: threads from py-spy dump --json"]
    for thread in threads:
        frames = thread.get("frames") or [] if isinstance(thread, dict) else None
        if not isinstance(frames, list) or not all(isinstance(frame, dict) for frame in frames):
            return None  # another py-spy's format: the faulthandler dump stands in
        status = ("active" if thread.get("active") else "idle") + ("+gil" if thread.get("owns_gil") else "")
        ident = thread.get("os_thread_id") or thread.get("thread_id")
        # A thread's name is the program's to choose: one line, so that it can never read as a thread of its own.
        name = f': "{_one_line(thread["thread_name"])}"' if thread.get("thread_name") else ""
        lines.append(f"Thread {ident} ({status}){name}")
        for frame in frames:
            where = frame.get("short_filename") or frame.get("filename")
            lines.append(f"    {_one_line(frame.get('name'))} ({_one_line(where)}:{frame.get('line')})")
    return "\n".join(lines) + "\n"


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _stack_by_py_spy(pid: int, timeout: float = PY_SPY_TIMEOUT_S) -> Tuple[Optional[str], str]:
    tool = py_spy_path()
    if tool is None:
        return None, "py-spy not installed"
    try:
        done = subprocess.run(
            [tool, "dump", "--json", "--pid", str(pid)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy timed out after {timeout:.0f} s"
    text = render_py_spy(pid, done.stdout) if done.returncode == 0 else None
    if text is not None and "Thread" in text:
        return text, "py-spy"
    reason = (done.stderr.strip().splitlines() or ["no output"])[0]
    return None, f"py-spy failed: {reason}"


def py_spy_stack(pid: int, timeout: float) -> Optional[str]:
    """One py-spy dump of ``pid``'s threads, None when py-spy is missing, not allowed, slow or failing: for sampling a
    running process (:mod:`trainbox.diagnose.conditions`), where a missing sample only leaves a share unknown."""
    return _stack_by_py_spy(pid, timeout)[0]


def read_new_dump(files: RunFiles, path: PathLike, offset: int) -> Optional[str]:
    """What a faulthandler dump got past ``offset`` (its size before SIGUSR1), once it has; None while nothing came
    or when the file is refused. Waits 0.1 s once something came: the handler writes thread by thread."""
    found = files.stat(path).value
    if found is None or found.st_size <= offset:
        return None
    time.sleep(0.1)
    got = files.read_span(path, offset, MAX_DUMP_BYTES)
    return None if got.value is None else got.value.decode("utf-8", "replace")


def _stacks_by_faulthandler(pids: Sequence[int], run: Optional[RunDir]) -> Dict[int, Tuple[Optional[str], str]]:
    """Ask every process that has a SIGUSR1 handler to dump its stacks into its file (``run.stack_dump(pid)``)."""
    results: Dict[int, Tuple[Optional[str], str]] = {}
    if run is None:
        return {pid: (None, "no faulthandler dump directory") for pid in pids}
    mask = 1 << (heartbeat.STACK_DUMP_SIGNAL - 1)
    asked: Dict[int, int] = {}
    for pid in pids:
        if not proctree.caught_signals(pid) & mask:
            results[pid] = (None, "no stack-dump handler registered (SIGUSR1 would kill it)")
            continue
        before = run.files.stat(run.stack_dump(pid)).value
        asked[pid] = before.st_size if before is not None else 0
        try:
            psutil.Process(pid).send_signal(heartbeat.STACK_DUMP_SIGNAL)
        except psutil.Error as exc:
            results[pid] = (None, f"could not signal: {exc}")
            asked.pop(pid)
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, offset in list(asked.items()):
            dump = read_new_dump(run.files, run.stack_dump(pid), offset)
            if dump is not None:
                results[pid] = (dump, "faulthandler")
                asked.pop(pid)
    for pid in asked:
        results[pid] = (None, "faulthandler dump did not arrive")
    return results


def collect_stacks(pids: Sequence[int], run: Optional[RunDir]) -> Dict[int, Tuple[Optional[str], str]]:
    """Stacks per pid: py-spy in parallel first, the faulthandler dump (in ``run``'s ``stacks/``) for the rest."""
    with ThreadPoolExecutor(max_workers=max(1, min(PY_SPY_PARALLEL, len(pids)))) as pool:
        results = dict(zip(pids, pool.map(_stack_by_py_spy, pids)))
    missing = [pid for pid, (text, _) in results.items() if text is None]
    if missing:
        fallback = _stacks_by_faulthandler(missing, run)
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


def _refused(refusal: Optional[Refusal], path: Path) -> None:
    """A refusal while writing the report, raised as the OSError the supervisor records (the report is lost)."""
    if refusal is not None:
        raise OSError(errno.EPERM, refusal.line(path), str(path))


def write_incident(
    run: RunDir,
    directory: Path,
    *,
    tree: proctree.ProcessTree,
    reason: Dict[str, Any],
    last_beat: Optional[Dict[str, Any]],
    output_tail: str,
    samples: Sequence[Dict[str, Any]] = (),
    diagnose: Optional[Diagnose] = None,
) -> Dict[str, Any]:
    """Write the report for one stall into ``directory`` (in ``run``); return its summary (also in summary.json).

    ``samples`` go to evidence.json; ``diagnose`` is called once with the stacks
    just collected (nothing is dumped twice) and its fields join the summary.
    """
    started = time.monotonic()
    directory = Path(directory)
    staging = IncidentDir(directory.with_name(f".{directory.name}.{secrets.token_hex(STAGING_RANDOM_BYTES)}.partial"))
    try:
        summary = _assemble(run, staging, tree, reason, last_beat, output_tail, started, samples, diagnose)
        refusal = run.files.rename(staging.root, directory)  # never replaces: a report that exists is EXISTS
        if refusal is Refusal.EXISTS:
            raise FileExistsError(errno.EEXIST, "an incident report of this name exists", str(directory))
        _refused(refusal, directory)
    except BaseException:
        _discard(run.files, staging)
        raise
    return summary


#: What a report's staging folder may hold, and the folder's own names: all that :func:`_discard` deletes.
_REPORT_FILES = names(*(path for path, _ in IncidentDir.entries() if "/" not in path))
_STACK_FILES = names(IncidentDir.stack.name)


def _discard(files: RunFiles, staging: IncidentDir) -> None:
    """Remove what a failed report wrote (its own names only; nothing through a link); best-effort."""
    with contextlib.suppress(OSError):
        files.clear(staging.stack.directory, _STACK_FILES)
        files.remove_folder(staging.stack.directory, names(staging.stack.directory.name))
        files.clear(staging.root, _REPORT_FILES)
        files.remove_folder(staging.root, re.compile(re.escape(staging.root.name)))


def _put(files: RunFiles, path: Path, data: bytes) -> int:
    """Write one file of the report (synced with the summary and the rename); its size."""
    _refused(files.replace(path, data, fsync=False), path)
    return len(data)


def _assemble(
    run: RunDir,
    staging: IncidentDir,
    tree: proctree.ProcessTree,
    reason: Dict[str, Any],
    last_beat: Optional[Dict[str, Any]],
    output_tail: str,
    started: float,
    samples: Sequence[Dict[str, Any]],
    diagnose: Optional[Diagnose],
) -> Dict[str, Any]:
    """Write every file of the report into ``staging``; return the summary."""
    files = run.files
    _refused(files.make_dirs(staging.stack.directory), staging.root)
    procs = tree.scan()
    rows = proctree.describe(procs)
    stacks = collect_stacks([row["pid"] for row in rows], run)
    how: Dict[str, str] = {}
    size = 0
    for pid, (text, method) in stacks.items():
        how[str(pid)] = method
        size += _put(files, staging.stack(pid), (text if text is not None else f"no stack: {method}\n").encode(errors="replace"))
    gpu = gpu_state.read()
    written = {
        staging.processes_json: json.dumps(rows, indent=2),
        staging.processes_txt: _tree_text(rows),
        staging.heartbeat: json.dumps(last_beat, indent=2, sort_keys=True),
        staging.kernel: gpu.kernel,
        staging.gpu: gpu.smi,
        staging.evidence: json.dumps(list(samples), indent=1, sort_keys=True, default=str),
        staging.output_tail: output_tail,
    }
    size += sum(_put(files, path, text.encode(errors="replace")) for path, text in written.items())

    summary = dict(reason)
    if diagnose is not None:
        summary.update(diagnose({pid: text for pid, (text, _) in stacks.items() if text is not None}, gpu.kernel))
    summary.update(processes=len(rows), stacks=how, write_s=round(time.monotonic() - started, 3), bytes=size)
    encoded = json.dumps(summary, indent=2, sort_keys=True, default=str).encode(errors="replace")
    _refused(files.replace(staging.summary, encoded, fsync=True), staging.summary)
    return summary
