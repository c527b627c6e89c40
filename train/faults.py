"""Fault injection: the one place every hang, crash and kill in the tests comes from.

A fault is armed through the environment and fires at a named *site* when
its conditions match the context the site reports::

    TRAIN_FAULT="KIND@SITE[,KEY=VALUE|KEY>=VALUE ...][;KIND@SITE...]"
    TRAIN_FAULT="sleep@worker,attempt=0,epoch>=2"

``attempt`` is always available (from ``TRAIN_ATTEMPT``), and under torchrun
``rank`` (from ``RANK``): ``sleep@step,rank=1`` hangs one rank. Code declares sites
with ``faults.point("site", epoch=..., batch=...)``; with no ``TRAIN_FAULT`` set
that is one dictionary lookup. The supervisor's own site is ``supervisor``
(each look at the heartbeat; ``epoch`` and ``step`` from the last beat, ``hangs``: how many
supervisors of the run hung in a row before this one), so that
``TRAIN_FAULT="wait@supervisor,hangs=0,epoch>=2"`` hangs only the first one.
The compile faults run for ``TRAIN_FAULT_SECONDS`` (default 20) and then let the child go on.

A program that has no ``point()`` of its own (``yolo train``, a plain tqdm loop: the uninstrumented commands
``trainbox supervise`` reads progress from) gets one site, ``output``: :func:`watch_output`, called at start-up by
``tests/fixtures/uninstrumented/sitecustomize.py`` (put that folder on ``PYTHONPATH``), makes every write of the
main thread to ``sys.stdout`` or ``sys.stderr`` the site, with ``lines``: the line ends (``\n``, and ``\r``, a
progress bar's redraw) the main thread has written so far. ``sleep@output,attempt=0,lines>=40`` hangs the main
thread just before it draws its 40th line or bar state, while its other threads go on printing.

Each hang runs in a function whose name says what it is, so tests can find
that name in the incident's stacks. ``python -m trainbox.faults`` is a small
beating child for supervisor tests (see ``main``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from trainbox.heartbeat import ATTEMPT_ENV

FAULT_ENV = "TRAIN_FAULT"
#: How long the compile faults work before they let the child go on.
SECONDS_ENV = "TRAIN_FAULT_SECONDS"


def _fault_seconds() -> float:
    return float(os.environ.get(SECONDS_ENV, "20"))


def hang_sleep() -> None:
    """Block forever in a sleep (a dead peer, a lost wake-up)."""
    while True:
        time.sleep(3600)


def hang_lock_deadlock() -> None:
    """Two threads take two locks in opposite order: a classic ABBA deadlock."""
    first, second = threading.Lock(), threading.Lock()
    ready = threading.Barrier(2)

    def other() -> None:
        with second:
            ready.wait()
            with first:
                pass

    threading.Thread(target=other, name="deadlock-peer", daemon=True).start()
    with first:
        ready.wait()
        with second:
            pass


def hang_spin() -> None:
    """Burn 100% of a core without making progress (a livelock, a busy compile)."""
    counter = 0
    while True:
        counter = (counter + 1) % 1_000_003


def hang_forked_worker() -> None:
    """What the forked child runs: it never finishes."""
    hang_sleep()


def hang_waiting_on_forked_worker() -> None:
    """Fork a worker that never finishes and wait for it (the DataLoader-after-fork hang)."""
    pid = os.fork()
    if pid == 0:
        try:
            hang_forked_worker()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def hang_in_wait() -> None:
    """Wait for a child that never exits: the supervisor's ``wait()`` on a trainer stuck in the GPU driver.

    The children are stopped (SIGSTOP stands in for the driver's D state, which SIGKILL does end), so the
    trainer makes no progress either; they die with the waiter (``PR_SET_PDEATHSIG``).
    """
    import psutil

    children = psutil.Process().children()
    for child in children:
        child.suspend()
    if not children:
        hang_sleep()
    os.waitpid(children[0].pid, 0)


def hang_ignoring_sigterm() -> None:
    """Ignore SIGTERM, then hang: only SIGKILL ends this process."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hang_sleep()


def hang_with_setsid_grandchild() -> None:
    """Start a grandchild in its own session (out of our process group), then hang."""
    subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
        start_new_session=True,
    )
    hang_sleep()


def hang_in_dataloader() -> None:
    """A real torch DataLoader whose two forked workers block in ``__getitem__``: the main thread waits on them."""
    import torch.utils.data

    class BlockingDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> int:
            hang_sleep()
            return index

    loader = torch.utils.data.DataLoader(BlockingDataset(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    for _ in loader:
        pass


#: A C file that keeps ``cc -O2`` busy for about a second per run: many functions with loops to unroll.
_C_SOURCE = "".join(
    f"int f{i}(int x) {{ int s = 0; for (int j = 0; j < 64; j++) s += (x * j) ^ (s >> {i % 7 + 1}); return s; }}\n"
    for i in range(400)
)


def compile_with_cc() -> None:
    """Run real compiler processes (``cc -O2`` on a generated file), one after another, for TRAIN_FAULT_SECONDS."""
    import tempfile

    deadline = time.monotonic() + _fault_seconds()
    with tempfile.TemporaryDirectory(prefix="trainbox-cc-") as work:
        source = Path(work) / "kernels.c"
        source.write_text(_C_SOURCE)
        while time.monotonic() < deadline:
            subprocess.run(["cc", "-O2", "-c", str(source), "-o", str(Path(work) / "kernels.o")], check=True)


def compile_into_inductor_cache() -> None:
    """Compile in-process (CPU work, no compiler process) and write a kernel file into TORCHINDUCTOR_CACHE_DIR every
    half second, as MIOpen through comgr does into its cache: the growing cache is the only outside sign."""
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + _fault_seconds()
    kernel = 0
    while time.monotonic() < deadline:
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            sum(i * i for i in range(1000))
        (cache / f"kernel-{os.getpid()}-{kernel}.so").write_bytes(os.urandom(4096))
        kernel += 1


def crash() -> None:
    """Exit with status 3, as a training script that hit an error would."""
    sys.stderr.write("trainbox fault: injected crash\n")
    sys.stderr.flush()
    os._exit(3)


def raise_error() -> None:
    """Raise, as a training script's bug would (under torchrun, ``@record`` writes it into the error file)."""
    raise RuntimeError("trainbox fault: injected exception")


def finish_during_incident() -> None:
    """Stop beating, then exit 0 as soon as the supervisor starts writing its incident report.

    The child that finishes while the report is being written (a slow last step
    that ends just after its budget ran out): a success, not a stall.
    """
    from trainbox.rundir.layout import RunDir

    incidents = RunDir(Path(os.environ["TRAIN_RUN_DIR"])).incident_dir.directory
    while not (incidents.is_dir() and any(incidents.iterdir())):
        time.sleep(0.01)
    os._exit(0)


def sigkill_self() -> None:
    """Die at once, as the OOM killer or a power cut would."""
    os.kill(os.getpid(), signal.SIGKILL)


KINDS: Dict[str, Callable[[], None]] = {
    "sleep": hang_sleep,
    "lock": hang_lock_deadlock,
    "spin": hang_spin,
    "fork": hang_waiting_on_forked_worker,
    "wait": hang_in_wait,
    "ignore-sigterm": hang_ignoring_sigterm,
    "setsid": hang_with_setsid_grandchild,
    "crash": crash,
    "raise": raise_error,
    "sigkill": sigkill_self,
    "finish-during-incident": finish_during_incident,
    "loader": hang_in_dataloader,
    "cc": compile_with_cc,
    "cache": compile_into_inductor_cache,
}


@dataclass(frozen=True)
class Fault:
    kind: str
    site: str
    conditions: Tuple[Tuple[str, str, int], ...]

    def matches(self, site: str, context: Dict[str, object]) -> bool:
        if site != self.site:
            return False
        for key, op, expected in self.conditions:
            value = context.get(key)
            if value is None:
                return False
            actual = int(value)  # type: ignore[call-overload]
            if (op == ">=" and actual < expected) or (op == "=" and actual != expected):
                return False
        return True


def parse(spec: str) -> List[Fault]:
    """Parse a ``TRAIN_FAULT`` value; raise ValueError naming the bad part."""
    found = []
    for entry in filter(None, (part.strip() for part in spec.split(";"))):
        head, *conds = entry.split(",")
        kind, sep, site = head.partition("@")
        if not sep or kind not in KINDS or not site:
            raise ValueError(f"bad fault {entry!r}: expected KIND@SITE with KIND in {sorted(KINDS)}")
        conditions = []
        for cond in conds:
            op = ">=" if ">=" in cond else "="
            key, _, value = cond.partition(op)
            if not key or not value.lstrip("-").isdigit():
                raise ValueError(f"bad fault condition {cond!r} in {entry!r}: expected KEY=INT or KEY>=INT")
            conditions.append((key.strip(), op, int(value)))
        found.append(Fault(kind, site.strip(), tuple(conditions)))
    return found


_armed: Optional[Tuple[str, List[Fault]]] = None


def armed() -> List[Fault]:
    global _armed
    spec = os.environ.get(FAULT_ENV, "")
    if _armed is None or _armed[0] != spec:
        _armed = (spec, parse(spec))
    return _armed[1]


def point(site: str, **context: object) -> None:
    """Fire the first armed fault whose site and conditions match here."""
    if not os.environ.get(FAULT_ENV):
        return
    context.setdefault("attempt", os.environ.get(ATTEMPT_ENV, "0"))
    context.setdefault("rank", os.environ.get("RANK"))
    for fault in armed():
        if fault.matches(site, context):
            KINDS[fault.kind]()


#: The fault site of a program's own output (see the module docstring).
OUTPUT_SITE = "output"


class _WatchedStream:
    """``sys.stdout`` or ``sys.stderr``, its main thread's writes made the ``output`` site (everything else passes)."""

    def __init__(self, stream: Any, written: List[int]) -> None:
        self._stream = stream
        self._written = written  # line ends the main thread wrote, to both streams: one shared counter

    def write(self, text: str) -> int:
        if threading.current_thread() is threading.main_thread():
            point(OUTPUT_SITE, lines=self._written[0])
            self._written[0] += text.count("\n") + text.count("\r")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def watch_output() -> bool:
    """Make the main thread's output the ``output`` fault site, when an armed fault names it; whether it did.

    Only in a supervised child (``TRAIN_ATTEMPT`` set): the supervisor, started with the same environment, must
    never hang on its own messages.
    """
    if ATTEMPT_ENV not in os.environ or not any(fault.site == OUTPUT_SITE for fault in armed()):
        return False
    written = [0]
    sys.stdout = _WatchedStream(sys.stdout, written)
    sys.stderr = _WatchedStream(sys.stderr, written)
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """A child that beats ``--steps`` times, every ``--interval`` s, with fault site ``step``.

    ``--phase-timeout`` declares a phase (``--slow-phase``, default ``slow``) of
    that budget before step ``--slow-step`` (fault site ``slow``) and then stays
    silent for ``--slow-seconds``. ``--chatter N``
    prints N more bytes per step (a chatty trainer that fills its output pipe).
    """
    from trainbox import heartbeat

    parser = argparse.ArgumentParser(prog="python -m trainbox.faults")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--slow-step", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--phase-timeout", type=float, default=None)
    parser.add_argument("--slow-phase", default="slow")
    parser.add_argument("--silent-start", type=float, default=0.0, help="seconds before the first beat")
    parser.add_argument("--chatter", type=int, default=0, help="bytes of extra output per step")
    args = parser.parse_args(argv)
    time.sleep(args.silent_start)
    point("start")
    for step in range(args.steps):
        if step == args.slow_step:
            heartbeat.beat(args.slow_phase, step=step, timeout=args.phase_timeout, force=True)
            point("slow", step=step)
            time.sleep(args.slow_seconds)
        heartbeat.beat("train", step=step, timeout=None, force=True)
        print(f"step {step}", flush=True)
        if args.chatter:
            print("." * args.chatter, flush=True)
        point("step", step=step)
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
