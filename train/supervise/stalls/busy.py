"""Whether a silent tree whose suspicion ran out is busy (a long evaluation, a save) or hung.

A learned or output-declared budget is a guess from a counter's rhythm (:mod:`trainbox.supervise.stalls.budgets`):
between two steps a real program also evaluates, saves a checkpoint or re-scans its data, silently and for longer.
So when such a budget runs out, :func:`assess` looks at what the tree does, from two things:

* **Signs of work** over the silence's last samples (:data:`~trainbox.diagnose.causes.RECENT_S`,
  :class:`~trainbox.diagnose.window.Window`): a process that wants at least
  :data:`~trainbox.diagnose.causes.BUSY_CORES` of CPU; reads and writes of at least
  :data:`~trainbox.diagnose.window.IDLE_IO_BYTES_PER_S` (a save: a file growing is the tree's written characters,
  on a local or a network disk); a GPU at :data:`~trainbox.diagnose.causes.GPU_BUSY_PCT` or more while the tree
  also works. None of them: the tree is not busy (idle, stopped, deadlocked, a thread holding the GIL off the CPU).
* **A wait that never returns**, from the stack of the tree's busiest process: :func:`trainbox.diagnose.causes.classify`
  names it (``gpu_wait``: the main thread in a device synchronise or copy, which CUDA's default synchronise spins a
  core in; ``stopped``; ``gil_held``; ``loader_deadlock``) and the stack did not move: two py-spy dumps
  :data:`FROZEN_GAP_S` apart show the same frames with the same local variables (:func:`frozen`). A healthy
  evaluation on a GPU waits in ``loss.item()`` most of the time too, but its loop variables change between dumps.
  Then the tree is not busy, whatever its CPU says.

Otherwise it is busy, with a guess of what it does for ``status`` (:func:`guess`: ``evaluation?`` or ``save?`` from
the names in its stack, else what the signs show). Without py-spy (or where it may not attach) there is no stack:
signs of work decide, and a GPU wait spinning a core is found by the plain stall budget instead of the learned one.

:func:`assess` and :func:`frozen` are pure (``tests/supervise/stalls/test_busy.py``, made-up samples and dumps);
:func:`look` takes the dumps.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from trainbox.diagnose import causes, incident
from trainbox.diagnose.window import IDLE_IO_BYTES_PER_S, Window
from trainbox.rundir.events import Cause

#: Seconds between the two dumps that tell a frozen stack from a moving one: a healthy loop turns many times a
#: second, and the supervisor's loop may stop for this long once per long silence.
FROZEN_GAP_S = 1.0
#: How long one dump may take (a small process dumps in about 0.1 s; a hung py-spy is given up: no stack).
DUMP_TIMEOUT_S = 3.0
#: What a stack that does not move means: a wait that never returns (the other causes are work, or unknown).
HANGS = frozenset({Cause.GPU_WAIT, Cause.STOPPED, Cause.GIL_HELD, Cause.LOADER_DEADLOCK, Cause.IDLE})
#: Frame names that say what a busy silence is (``status`` shows the guess with a question mark).
EVALUATING = re.compile(r"eval|valid|estimate_loss|test_step|predict", re.IGNORECASE)
SAVING = re.compile(r"save|checkpoint|serializ", re.IGNORECASE)


@dataclass(frozen=True)
class Activity:
    """What a silent tree did when its suspicion ran out."""

    #: Evidence of work, most telling first; () when the tree showed none.
    signs: Tuple[str, ...]
    #: What the stack said when it showed a wait that never returns (cause and evidence); None otherwise.
    hang: Optional[causes.Diagnosis] = None
    #: What the busy silence is, as far as can be told: ``evaluation?``, ``save?``, ``computing``, ``writing``.
    guess: str = ""

    @property
    def busy(self) -> bool:
        return bool(self.signs) and self.hang is None

    def to_dict(self) -> Dict[str, Any]:
        found = {"busy": self.busy, "guess": self.guess, "signs": list(self.signs)}
        if self.hang is not None:
            found["hang"] = self.hang.to_dict()
        return found


def signs(window: Window) -> Tuple[str, ...]:
    """The signs of work in the window's last samples."""
    last = window.last
    names = {p.pid: p.name for p in last.procs} if last is not None else {}
    demand = window.demand_cores(causes.RECENT_S)
    lines = [
        f"pid {pid} ({names.get(pid, '?')}) wants {100 * cores:.0f} % CPU"
        for pid, cores in sorted(demand.items(), key=lambda item: -item[1])
        if cores >= causes.BUSY_CORES
    ]
    io = sum(window.io_rates(causes.RECENT_S).values())
    if io >= IDLE_IO_BYTES_PER_S:
        lines.append(f"the tree reads and writes {io / (1 << 20):.1f} MiB/s")
    gpu = last.gpu if last is not None else None
    busiest = max((gpu or {}).get("utilisation_pct") or [0])
    if lines and busiest >= causes.GPU_BUSY_PCT:  # a GPU busy beside an idle tree is a kernel that does not end
        lines.append(f"GPU at {busiest} % utilisation")
    return tuple(lines)


def busiest(window: Window) -> Optional[int]:
    """The process that wants the most CPU lately (whose stack is dumped), else the one that did the most I/O."""
    for rates in (window.demand_cores(causes.RECENT_S), window.io_rates(causes.RECENT_S)):
        if rates and max(rates.values()) > 0:
            return max(rates, key=lambda pid: rates[pid])
    return None


def frozen(first: Optional[str], second: Optional[str]) -> bool:
    """Whether two ``py-spy dump --json --locals`` of one process show the same threads at the same frames with the
    same local variables (a wait that did not move); False when either is missing or not such a dump."""
    try:
        before, after = json.loads(first or ""), json.loads(second or "")
    except ValueError:
        return False
    if not isinstance(before, list) or not before:
        return False

    def frames(dump: Any) -> Any:
        return [(t.get("thread_id"), t.get("frames")) for t in dump if isinstance(t, dict)] if isinstance(dump, list) else None

    return frames(before) == frames(after)


def guess(stack: str, found: Tuple[str, ...]) -> str:
    """What the busy silence is: from the function names of its stack (not its files': ``eval.py`` may hold a train
    loop), else from its signs."""
    functions = " ".join(frame.function for thread in causes.parse_stacks(stack) for frame in thread.frames)
    if EVALUATING.search(functions):
        return "evaluation?"
    if SAVING.search(functions):
        return "save?"
    if any("MiB/s" in line for line in found):
        return "reading or writing"
    return "computing"


def assess(window: Window, pid: Optional[int], dumps: Tuple[Optional[str], Optional[str]]) -> Activity:
    """The tree's activity from its window and two dumps of process ``pid`` (see the module docstring)."""
    found = signs(window)
    text = incident.render_py_spy(pid, dumps[1]) if pid is not None and dumps[1] else None
    stacks = {pid: text} if pid is not None and text else {}
    if not found:
        return Activity(())
    if stacks and pid is not None and frozen(*dumps):
        diagnosis = causes.classify(window, stacks, pid)
        if diagnosis.cause in HANGS:
            return Activity(found, diagnosis, "")
    return Activity(found, None, guess(text or "", found))


def _dump(pid: int) -> Optional[str]:
    """One ``py-spy dump --json --locals`` of ``pid``; None without py-spy, or when it fails or is slow."""
    tool = incident.py_spy_path()
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, "dump", "--json", "--locals", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    return done.stdout if done.returncode == 0 else None


def look(window: Window, dump: Callable[[int], Optional[str]] = _dump, pause: Callable[[float], None] = time.sleep) -> Activity:
    """Assess the tree as it is now: two dumps of its busiest process :data:`FROZEN_GAP_S` apart (none when it shows
    no sign of work)."""
    if not signs(window):
        return Activity(())
    pid = busiest(window)
    if pid is None:
        return assess(window, None, (None, None))
    first = dump(pid)
    if first is not None:
        pause(FROZEN_GAP_S)
    return assess(window, pid, (first, dump(pid) if first is not None else None))
