"""Fault injection: the one place every hang, crash and kill in the tests comes from.

A fault is armed through the environment and fires at a named *site* when
its conditions match the context the site reports::

    TRAIN_FAULT="KIND@SITE[,KEY=VALUE|KEY>=VALUE|KEY<VALUE ...][;KIND@SITE...]"
    TRAIN_FAULT="sleep@worker,attempt=0,epoch>=2"

A condition ``chance=P`` fires with probability P percent at each matching call, so
``sleep@step,chance=2`` hangs about one step in fifty: the random, intermittent hang. P may be a
decimal (``chance=0.25``: one step in 400), so a rate per second needs no slower steps.
The draw is a hash of ``TRAIN_FAULT_SEED`` (default 0), the site and its context, so a
run is repeatable: the same seed hangs at the same steps of the same attempts.

``attempt`` is always available (from ``TRAIN_ATTEMPT``), and under torchrun
``rank`` (from ``RANK``): ``sleep@step,rank=1`` hangs one rank, and in a Slurm job ``node``
(from ``SLURM_NODEID``): ``sleep@step,node=1`` hangs the ranks of the job's second node. Code declares sites
with ``faults.point("site", epoch=..., batch=...)``; with no ``TRAIN_FAULT`` set
that is one dictionary lookup. The supervisor's own site is ``supervisor``
(each look at the heartbeat; ``epoch`` and ``step`` from the last beat, ``hangs``: how many
supervisors of the run hung in a row before this one), so that
``TRAIN_FAULT="wait@supervisor,hangs=0,epoch>=2"`` hangs only the first one.
The compile faults run for ``TRAIN_FAULT_SECONDS`` (default 20) and then let the child go on.

Two faults slow a run down instead of stopping it (fail-slow, :mod:`trainbox.supervise.pace.watch`): ``slow``
stretches ``TRAIN_FAULT_FACTOR`` times (default 3) what its site says its work took (context ``took``, seconds:
``slow@getitem`` makes each item of a DataLoader's ``__getitem__`` that much slower, in each worker), or else the
time since its previous hit in this process (``slow@step``: steps that took 0.1 s take 0.3 s, whatever the step
rate), and ``leak`` keeps ``TRAIN_FAULT_MB`` more MiB (default 32) of memory at each hit, touched so that
it is resident, which a memory limit turns into a slowdown (``leak@step,step>=100,step<120``: 640 MiB).

A program that has no ``point()`` of its own (``yolo train``, a plain tqdm loop: the uninstrumented commands
``trainbox supervise`` reads progress from) gets one site, ``output``: :func:`watch_output`, called at start-up by
``tests/fixtures/uninstrumented/sitecustomize.py`` (put that folder on ``PYTHONPATH``), makes every write of the
main thread to ``sys.stdout`` or ``sys.stderr`` the site, with ``lines``: the line ends (``\n``, and ``\r``, a
progress bar's redraw) the main thread has written so far. ``sleep@output,attempt=0,lines>=40`` hangs the main
thread just before it draws its 40th line or bar state, while its other threads go on printing. A bar that draws
when it has had time to (Ultralytics' own, every 0.1 s at most) draws more states on a slow machine than on a fast
one, so a count of lines falls in a different place on each: ``seen``, the writes so far that contained
``TRAIN_FAULT_TEXT``, places the hang by what was printed (``TRAIN_FAULT_TEXT="1/2  "`` with
``sleep@output,seen>=1``: the first write after the first one that showed epoch 1 of 2).

A program's checkpoints get one more site, ``checkpoint``: :func:`watch_checkpoints` (called by the same
sitecustomize) makes every ``torch.save`` and every ``Path.write_bytes`` of the program the site, with ``saves``: the
checkpoint writes so far in this process. Only writes whose target's path contains ``TRAIN_FAULT_CHECKPOINT`` count
(every write when it is unset; a ``torch.save`` into a buffer, as Lightning's and Ultralytics' saves begin, has the
path ``""``). A write to a file fires the site with half of its bytes on disk, so that ``sigkill@checkpoint,saves>=1``
leaves the second checkpoint half written, as a kill during the save does; a ``torch.save`` into a buffer fires it
when the buffer is full, before the program writes it anywhere.

Each hang runs in a function whose name says what it is, so tests can find
that name in the incident's stacks. ``python -m trainbox.faults`` is a small
beating child for supervisor tests (see ``main``).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import io
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from trainbox.heartbeat import ATTEMPT_ENV

FAULT_ENV = "TRAIN_FAULT"
#: Seeds the ``chance=P`` draws (see the module docstring).
SEED_ENV = "TRAIN_FAULT_SEED"
#: The condition that is a probability in percent, not a value of the context.
CHANCE = "chance"
#: How long the compile faults work before they let the child go on.
SECONDS_ENV = "TRAIN_FAULT_SECONDS"
#: How many times as long the ``slow`` fault makes the time between two hits of its site.
FACTOR_ENV = "TRAIN_FAULT_FACTOR"
#: MiB the ``leak`` fault keeps at each hit.
LEAK_MB_ENV = "TRAIN_FAULT_MB"
#: The text the ``output`` site's ``seen`` counts the writes of (see the module docstring).
TEXT_ENV = "TRAIN_FAULT_TEXT"


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


def hang_on_stopped_worker() -> None:
    """Fork a worker that stops itself (SIGSTOP: a debugger, a job-control stop, a ``kill -STOP``) and wait for it."""
    pid = os.fork()
    if pid == 0:
        try:
            os.kill(os.getpid(), signal.SIGSTOP)
            hang_forked_worker()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def hold_the_gil_in_c() -> None:
    """Call C's ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL (a deadlock inside an extension)."""
    import ctypes

    ctypes.PyDLL(None).sleep(100000)


def hang_holding_the_gil() -> None:
    """A thread calls C while holding the GIL (:func:`hold_the_gil_in_c`), and the main thread, which needs the GIL
    for its next bytecode, waits for it for good."""
    holder = threading.Thread(target=hold_the_gil_in_c, name="gil-holder", daemon=True)
    holder.start()
    while True:  # the main thread's next turn never comes
        time.sleep(0.01)


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


def hang_native_spin() -> None:
    """Burn a core in native code that let go of the GIL (torch's matrix product, one thread): no progress."""
    import torch

    torch.set_num_threads(1)
    matrix = torch.randn(400, 400)
    while True:
        torch.mm(matrix, matrix)


#: The file :func:`hang_in_slow_read` reads (a FIFO another program trickles into: a slow network filesystem).
READ_ENV = "TRAIN_FAULT_READ"


def hang_in_slow_read() -> None:
    """Read ``$TRAIN_FAULT_READ`` to its end, as a dataset reads an image from a slow disk (it trickles in)."""
    Path(os.environ[READ_ENV]).read_bytes()  # not the run directory: the test's slow "disk"


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
        source.write_text(_C_SOURCE)  # not the run directory: a temporary folder
        while time.monotonic() < deadline:
            subprocess.run(["cc", "-O2", "-c", str(source), "-o", str(Path(work) / "kernels.o")], check=True)


def compile_into_inductor_cache() -> None:
    """Compile in-process (CPU work, no compiler process) and write a kernel file into TORCHINDUCTOR_CACHE_DIR every
    half second, as MIOpen through comgr does into its cache: the growing cache is the only outside sign."""
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)  # not the run directory: a kernel cache
    deadline = time.monotonic() + _fault_seconds()
    kernel = 0
    while time.monotonic() < deadline:
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            sum(i * i for i in range(1000))
        (cache / f"kernel-{os.getpid()}-{kernel}.so").write_bytes(os.urandom(4096))  # not the run directory: a kernel cache
        kernel += 1


#: When the ``slow`` fault's last hit in this process ended (monotonic seconds), None before its first.
_last_slow: List[float] = []
#: The memory the ``leak`` fault keeps.
_leaked: List[bytearray] = []


#: The context of the fault firing now (what its site reported).
_firing: Dict[str, object] = {}


def slow_down() -> None:
    """Stretch what the site's work took (its ``took``), or else the time since this fault's last hit in this
    process, to TRAIN_FAULT_FACTOR times as long."""
    now = time.monotonic()
    took = _firing.get("took")
    span = float(took) if isinstance(took, (int, float)) else (now - _last_slow[0] if _last_slow else 0.0)
    time.sleep(max(0.0, (float(os.environ.get(FACTOR_ENV, "3")) - 1.0) * span))
    _last_slow[:] = [time.monotonic()]


def leak_memory() -> None:
    """Keep TRAIN_FAULT_MB more MiB, every page touched (resident, not just reserved)."""
    block = bytearray(int(float(os.environ.get(LEAK_MB_ENV, "32")) * 2**20))
    for at in range(0, len(block), 4096):
        block[at] = 1
    _leaked.append(block)


def crash() -> None:
    """Exit with status 3, as a training script that hit an error would."""
    stream = sys.__stderr__ or sys.stderr  # not the output site's wrapper: its write would fire this crash again
    stream.write("trainbox fault: injected crash\n")
    stream.flush()
    os._exit(3)


def raise_error() -> None:
    """Raise, as a training script's bug would (under torchrun, ``@record`` writes it into the error file)."""
    raise RuntimeError("trainbox fault: injected exception")


def raise_os_error() -> None:
    """Raise another error than ``raise`` does (a different crash at the same place: a shard that cannot be read)."""
    raise OSError("trainbox fault: injected OSError")


def connect_refused() -> None:
    """Connect to a port nobody listens on: a real ``ConnectionRefusedError``, as an upload to a server that is down
    raises (a transient error: trainbox.supervise.crashes)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: a connection to it is refused
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def finish_during_incident() -> None:
    """Stop beating, then exit 0 as soon as the supervisor starts writing its incident report.

    The child that finishes while the report is being written (a slow last step
    that ends just after its budget ran out): a success, not a stall.
    """
    from trainbox.rundir.layout import RunDir

    run = RunDir(Path(os.environ["TRAIN_RUN_DIR"]))
    while not run.files.list_dir(run.incident_dir.directory, 1).value:
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
    "stopped": hang_on_stopped_worker,
    "gil": hang_holding_the_gil,
    "wait": hang_in_wait,
    "ignore-sigterm": hang_ignoring_sigterm,
    "setsid": hang_with_setsid_grandchild,
    "crash": crash,
    "raise": raise_error,
    "oserror": raise_os_error,
    "refused": connect_refused,
    "sigkill": sigkill_self,
    "finish-during-incident": finish_during_incident,
    "loader": hang_in_dataloader,
    "native": hang_native_spin,
    "slowread": hang_in_slow_read,
    "cc": compile_with_cc,
    "cache": compile_into_inductor_cache,
    "slow": slow_down,
    "leak": leak_memory,
}
#: Kinds whose hang runs torch code. ``main``'s child imports torch before its first beat when one is armed: on a
#: loaded 2-core machine the import is seconds of Python, and a stall found in it would be a busy Python import, not
#: the hang the fault names (the classifier's accuracy, bench/stall_accuracy.py, called a native spin busy_python so).
TORCH_KINDS = frozenset({"native", "loader"})


@dataclass(frozen=True)
class Fault:
    kind: str
    site: str
    conditions: Tuple[Tuple[str, str, float], ...]

    def matches(self, site: str, context: Dict[str, object]) -> bool:
        if site != self.site:
            return False
        for key, op, expected in self.conditions:
            if key == CHANCE:
                if not _drawn(expected, site, context):
                    return False
                continue
            value = context.get(key)
            if value is None:
                return False
            actual = int(value)  # type: ignore[call-overload]
            if (op == ">=" and actual < expected) or (op == "<" and actual >= expected) or (op == "=" and actual != expected):
                return False
        return True


def _drawn(percent: float, site: str, context: Dict[str, object]) -> bool:
    """True with probability ``percent`` %, the same for the same seed, site and context (a repeatable draw)."""
    seed = os.environ.get(SEED_ENV, "0")
    text = "|".join([seed, site, *(f"{key}={context[key]}" for key in sorted(context))])
    return random.Random(text).random() * 100 < percent


def _percent(value: str, entry: str) -> float:
    """A ``chance=P`` value: a percentage from 0 to 100, a decimal allowed."""
    try:
        percent = float(value)
    except ValueError:
        percent = -1.0
    if not 0 <= percent <= 100:  # also refuses nan
        raise ValueError(f"bad fault condition chance={value} in {entry!r}: expected a percentage from 0 to 100")
    return percent


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
            op = next(op for op in (">=", "<", "=") if op in cond or op == "=")
            key, _, value = cond.partition(op)
            if key.strip() == CHANCE and op == "=":
                conditions.append((CHANCE, op, _percent(value, entry)))
                continue
            if not key or not value.lstrip("-").isdigit():
                raise ValueError(f"bad fault condition {cond!r} in {entry!r}: expected KEY=INT, KEY>=INT or KEY<INT")
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
    context.setdefault("node", os.environ.get("SLURM_NODEID"))
    for fault in armed():
        if fault.matches(site, context):
            _firing.clear()
            _firing.update(context)
            KINDS[fault.kind]()


#: The fault site of a program's own output (see the module docstring).
OUTPUT_SITE = "output"


@dataclass
class _Written:
    """What the main thread wrote so far, to both streams: the ``output`` site's context."""

    wanted: str = ""  # TRAIN_FAULT_TEXT, read once at start-up ("": nothing is seen)
    lines: int = 0  # line ends, a bar's \r included
    seen: int = 0  # writes that contained ``wanted``

    def add(self, text: str) -> None:
        self.lines += text.count("\n") + text.count("\r")
        if self.wanted and self.wanted in text:
            self.seen += 1


class _WatchedStream:
    """``sys.stdout`` or ``sys.stderr``, its main thread's writes made the ``output`` site (everything else passes)."""

    def __init__(self, stream: Any, written: _Written) -> None:
        self._stream = stream
        self._written = written  # one for both streams

    def write(self, text: str) -> int:
        if threading.current_thread() is threading.main_thread():
            point(OUTPUT_SITE, lines=self._written.lines, seen=self._written.seen)
            self._written.add(text)
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
    written = _Written(wanted=os.environ.get(TEXT_ENV, ""))
    sys.stdout = _WatchedStream(sys.stdout, written)
    sys.stderr = _WatchedStream(sys.stderr, written)
    return True


#: The fault site of a program's checkpoint writes (see the module docstring).
CHECKPOINT_SITE = "checkpoint"
#: The text a checkpoint write's target path must contain to be the ``checkpoint`` site ("" or unset: every write).
CHECKPOINT_ENV = "TRAIN_FAULT_CHECKPOINT"


@dataclass
class _Saves:
    """The checkpoint writes of this process that count (their path contains ``wanted``): the site's context."""

    wanted: str = ""
    saves: int = 0

    def fire(self, path: str, half_written: Callable[[], None] = lambda: None) -> None:
        """``half_written()`` (it puts half the bytes on disk), then the site, for a write that counts."""
        if self.wanted not in path:
            return
        half_written()
        count, self.saves = self.saves, self.saves + 1
        point(CHECKPOINT_SITE, saves=count)


def _written_in_halves(path: Path, data: bytes, saves: _Saves) -> None:
    """Write ``data`` to ``path`` as a checkpoint is written, the site firing with half of it on disk."""
    with open(path, "wb") as handle:  # not the run directory: the program's own checkpoint
        half = len(data) // 2

        def half_written() -> None:
            handle.write(data[:half])
            handle.flush()  # on disk for another process (the supervisor) to read, killed or not

        saves.fire(str(path), half_written)
        handle.seek(0)  # nothing fired (or a fault that lets go): all of it, once
        handle.write(data)


def _watched_save(real_save: Callable[..., None], saves: _Saves) -> Callable[..., None]:
    """``torch.save`` that is the ``checkpoint`` site: to a path in halves, to a buffer once it is full."""

    def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(f, (str, os.PathLike)):
            real_save(obj, f, *args, **kwargs)
            saves.fire("")
            return
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        _written_in_halves(Path(f), buffer.getvalue(), saves)

    return save


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Replaces ``torch.save`` once the program imports torch (importing it here would slow every program down)."""

    def __init__(self, saves: _Saves) -> None:
        self.saves = saves

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and not for the find_spec below
        spec = importlib.util.find_spec("torch")
        loader = spec.loader if spec is not None else None
        if loader is None:
            return spec
        real_exec, saves = loader.exec_module, self.saves

        def exec_module(module: Any) -> None:
            real_exec(module)
            module.save = _watched_save(module.save, saves)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def watch_checkpoints() -> bool:
    """Make the program's checkpoint writes the ``checkpoint`` site, when an armed fault names it; whether it did.

    As :func:`watch_output`, only in a supervised child.
    """
    if ATTEMPT_ENV not in os.environ or not any(fault.site == CHECKPOINT_SITE for fault in armed()):
        return False
    saves = _Saves(wanted=os.environ.get(CHECKPOINT_ENV, ""))
    real_write_bytes = Path.write_bytes

    def write_bytes(self: Path, data: Any) -> int:
        if saves.wanted not in str(self):
            return real_write_bytes(self, data)
        _written_in_halves(self, bytes(data), saves)
        return len(data)

    Path.write_bytes = write_bytes  # type: ignore[method-assign]
    if "torch" in sys.modules:
        sys.modules["torch"].save = _watched_save(sys.modules["torch"].save, saves)
    else:
        sys.meta_path.insert(0, _AfterTorchImport(saves))
    return True


class StepWork:
    """What one step of ``main``'s child does besides beating, as its fail-slow and checkpoint options ask (see ``main``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import random

        self.args = args
        self.random = random.Random(args.seed)
        self.pages: Optional[memoryview] = None
        self.batches: Optional[Iterator[object]] = None
        if args.dataset_mb:
            self.pages = _mapped_dataset(args.dataset_mb)
        if args.loader_workers is not None:
            self.batches = iter(_loader(args.steps, args.loader_workers, args.item_s))

    def run(self) -> None:
        if self.batches is not None:
            next(self.batches)
        if self.args.work:
            until = time.process_time() + self.args.work
            while time.process_time() < until:  # CPU seconds: a step that other processes' CPU slows down
                pass
        if self.pages is not None:
            sum(self.pages[at] for at in range(0, len(self.pages), DATASET_STRIDE))

    def first_step(self) -> int:
        """With ``--checkpoint FILE``: the step saved there by an earlier attempt (the next one to run), else 0."""
        path = self.args.checkpoint
        try:
            return int(path.read_text()) if path is not None else 0  # not the run directory: the child's --checkpoint
        except (OSError, ValueError):
            return 0

    def save_if_due(self, step: int) -> None:
        """With ``--checkpoint FILE``: after every ``--save-every``-th step, and when the supervisor asks for a
        checkpoint, save the next step and say so (a beat with ``checkpoint_ts``)."""
        from trainbox import heartbeat
        from trainbox.atomic import write_text_atomic

        path, every = self.args.checkpoint, self.args.save_every
        if path is None:
            return
        if (every > 0 and (step + 1) % every == 0) or heartbeat.checkpoint_requested():
            write_text_atomic(path, str(step + 1), fsync=False)  # not the run directory: the child's --checkpoint
            if not self.args.untold:
                heartbeat.checkpointed()

    def pause(self) -> float:
        """The sleep after a step: ``--interval``, spread over +-``--jitter`` of it."""
        return self.args.interval * (1.0 + self.random.uniform(-self.args.jitter, self.args.jitter))


#: Bytes between two reads of the mapped dataset: a page of it evicted is read back with its readahead window (128 KiB
#: by default) at the first touch, so the whole file is read in, at a sixteenth of a touch per page's CPU.
DATASET_STRIDE = 64 * 1024


def _mapped_dataset(megabytes: int) -> memoryview:
    """A file of ``megabytes`` MiB in the run directory, written by this process (so a memory cgroup it runs in
    holds its page cache), memory-mapped as a training set often is."""
    import mmap

    path = Path(os.environ.get("TRAIN_RUN_DIR", ".")) / f"fault-dataset-{megabytes}.bin"
    if not path.exists() or path.stat().st_size != megabytes * 2**20:  # not the run directory: the fault's scratch file
        with open(path, "wb") as handle:  # not the run directory: the fault's scratch file
            for _ in range(megabytes):
                handle.write(os.urandom(2**20))
    with open(path, "rb") as handle:  # not the run directory: the fault's scratch file
        return memoryview(mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ))


#: Samples in one batch of ``main``'s DataLoader.
LOADER_BATCH = 4


def _loader(steps: int, workers: int, item_s: float) -> Iterable[object]:
    """A torch DataLoader of ``steps`` batches whose ``__getitem__`` takes ``item_s`` s (fault site ``getitem``)."""
    import torch.utils.data

    class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return steps * LOADER_BATCH

        def __getitem__(self, index: int) -> int:
            started = time.monotonic()
            time.sleep(item_s)
            point("getitem", index=index, took=time.monotonic() - started)
            return index

    return torch.utils.data.DataLoader(Items(), batch_size=LOADER_BATCH, num_workers=workers, persistent_workers=workers > 0)


def _arguments(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainbox.faults")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--slow-step", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--phase-timeout", type=float, default=None)
    parser.add_argument("--slow-phase", default="slow")
    parser.add_argument("--silent-start", type=float, default=0.0, help="seconds before the first beat")
    parser.add_argument("--chatter", type=int, default=0, help="bytes of extra output per step")
    parser.add_argument("--jitter", type=float, default=0.0, help="spread of each interval, a share of it (0.3: +-30 %%)")
    parser.add_argument("--seed", type=int, default=0, help="of the jitter")
    parser.add_argument("--work", type=float, default=0.0, help="CPU seconds burnt per step")
    parser.add_argument("--dataset-mb", type=int, default=0, help="MiB of a memory-mapped file read per step")
    parser.add_argument("--loader-workers", type=int, default=None, help="take each step's batch from a DataLoader")
    parser.add_argument("--item-s", type=float, default=0.01, help="seconds the DataLoader's __getitem__ takes")
    parser.add_argument("--checkpoint", type=Path, default=None, help="resume from and save to this file")
    parser.add_argument("--save-every", type=int, default=0, help="steps between two checkpoints (0: only when asked)")
    parser.add_argument("--epoch-steps", type=int, default=0, help="steps per epoch: beats carry the epoch (0: none)")
    parser.add_argument("--untold", action="store_true", help="beats carry neither total_steps nor checkpoint_ts")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """A child that beats ``--steps`` times, every ``--interval`` s, with fault site ``step``.

    ``--phase-timeout`` declares a phase (``--slow-phase``, default ``slow``) of
    that budget before step ``--slow-step`` (fault site ``slow``) and then stays
    silent for ``--slow-seconds``. ``--chatter N``
    prints N more bytes per step (a chatty trainer that fills its output pipe).
    Every beat carries ``total_steps`` (``--steps``).

    For the fail-slow tests (:class:`StepWork`): ``--jitter J`` spreads each
    interval uniformly over +-J of it (seeded by ``--seed``); ``--work S`` burns
    S seconds of CPU per step; ``--dataset-mb N`` reads all of a memory-mapped
    N MiB file per step (one byte every DATASET_STRIDE: little CPU, and the whole
    file when it must come back from disk); ``--loader-workers N`` takes each step's
    batch from a torch DataLoader with N workers (0: in this process) whose
    ``__getitem__`` takes ``--item-s`` seconds (fault site ``getitem``, context ``index`` and ``took``).
    ``--checkpoint FILE`` makes it resumable: it starts from the step saved there, and saves (then beats
    ``checkpoint_ts``) every ``--save-every`` steps and whenever the supervisor asks for a checkpoint
    (:func:`trainbox.heartbeat.checkpoint_requested`). ``--epoch-steps N`` puts ``epoch`` (step // N) in the beats;
    ``--untold`` leaves ``total_steps`` and ``checkpoint_ts`` out of them (a child that does not say how long its
    run is or when it saved, as most do not).
    """
    from trainbox import heartbeat

    args = _arguments(argv)
    if any(fault.kind in TORCH_KINDS for fault in armed()):
        import torch  # noqa: F401  (see TORCH_KINDS)
    time.sleep(args.silent_start)
    point("start")
    work = StepWork(args)
    for step in range(work.first_step(), args.steps):
        if step == args.slow_step:
            heartbeat.beat(args.slow_phase, step=step, timeout=args.phase_timeout, force=True)
            point("slow", step=step)
            time.sleep(args.slow_seconds)
        work.run()
        told = {} if args.untold else {"total_steps": args.steps}
        epoch = {"epoch": step // args.epoch_steps} if args.epoch_steps > 0 else {}
        heartbeat.beat("train", step=step, timeout=None, force=True, **told, **epoch)
        print(f"step {step}", flush=True)
        if args.chatter:
            print("." * args.chatter, flush=True)
        point("step", step=step)
        work.save_if_due(step)
        time.sleep(work.pause())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
