"""The run directory: every path a run reads or writes, named once.

``RunDir(root)`` names the run's files (``run.events``, ``run.state``,
``run.last_checkpoint`` ...) and numbered ones (``run.incident(session, attempt)``,
``run.attempt_log(n)``, ``run.stack_dump(pid)``, ``run.rank_heartbeat(rank)``, each with its folder as
``.directory``); ``IncidentDir`` names the
files of one stall report. Each name is declared once, as an ``Entry`` with the
path as docs/contract.md writes it (``<session>``, ``<attempt>``, ``<n>``, ``<pid>`` and
``<rank>`` stand for numbers) and one line saying what it holds.

Incidents are never overwritten or deleted: attempts count from 0 again each
time a run directory is supervised, so a report is named by the supervisor's
*session* (its start, UTC, as the number ``YYYYMMDDhhmmss``; see
:meth:`RunDir.new_session`) and the attempt: ``incidents/20261123155507-0/``.
The names sort in the order the reports were written. ``RunDir.entries()`` lists them;
``tests/rundir/test_layout.py`` checks docs/contract.md's run-directory table against that
list both ways, so the table and the code cannot drift apart.

Runs are named here too (:func:`run_name`): ``runs/<command>-<YYYYmmdd-HHMMSS>``, new for each run, where
``<command>`` is :func:`command_name` of what runs (``python train.py``: ``train``; ``yolo train ...``: ``yolo``;
``trainbox run``/``demo``: ``run``/``demo``, names no other command gets; a script named in any alphabet keeps
its name, ``训练.py``: ``训练``), past ``env VAR=value`` and a runner's own options (:func:`program_start` is where
the program itself starts, for recognising it too). :func:`newest_named` finds the newest run of a command, for
``--resume``. A new run's name is taken by making its folder (:func:`trainbox.rundir.owner.choose`): two runs of
one command started in the same second get ``-2``, ``-3``.

Paths are only named here; they are opened, read, written and deleted through
:attr:`RunDir.files` (:mod:`trainbox.rundir.safe`), never directly.

Standard library only: the supervisor, the training child, its DataLoader
workers and the host-side ``invoke status`` all import it.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, List, Optional, Sequence, Tuple, Type, overload

from trainbox.rundir.safe import RunFiles

#: What a numbered entry's placeholders may be: ``<session>``, ``<attempt>``, ``<n>``, ``<pid>``, ``<rank>`` or ``<node>``.
PLACEHOLDERS = ("<session>", "<attempt>", "<n>", "<pid>", "<rank>", "<node>")
#: An incident report's folder name, ``<session>-<attempt>``: what a ``stall`` event's ``incident`` must end in.
INCIDENT_NAME = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
#: Names listed when looking for a free session number (a run has a few reports per day).
MAX_INCIDENTS_LISTED = 1_000_000
#: A job directory is listed for its node folders: far more nodes than any job here has, so a hostile folder of
#: millions of names costs a bounded listing.
MAX_NODES_LISTED = 100_000
#: Where runs are kept, under the folder trainbox is started from.
RUNS = Path("runs")
#: A run's start in its name (local time, as a person reads it; the names of one command sort by it).
RUN_STAMP = "%Y%m%d-%H%M%S"
#: The rest of a run's name after ``<command>-``: the start, and ``-<n>`` for a second run started within that second.
RUN_SUFFIX = re.compile(r"-([0-9]{8}-[0-9]{6})(?:-([0-9]{1,6}))?")
#: Programs that run another program: the command's name is that program's (``python -m x``, ``torchrun t.py``).
RUNNERS = re.compile(r"(python[0-9.]*|pypy[0-9.]*|torchrun|accelerate|deepspeed|uv|env|nohup|nice|time)(\.exe)?")
#: What ``--name`` may hold (a folder under runs/ that any tool can type).
NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
#: The names of trainbox's own runs (``trainbox run``, ``trainbox demo``): no supervised command is given one.
OWN_NAMES = ("run", "demo")
#: Wrappers before the program itself, passed over when naming and recognising a command (with their options).
WRAPPERS = re.compile(r"(env|nohup|nice|time)")
#: Runners' own options that take the next word as their value (``python -W ignore``, ``env -u VAR``).
VALUED_OPTIONS = {
    "python": ("-W", "-X", "--check-hash-based-pycs"),
    "env": ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"),
    "nice": ("-n", "--adjustment"),
    "time": ("-f", "--format", "-o", "--output"),
}
#: ``NAME=value`` before the program, as ``env`` takes it.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class Documented:
    """A path of a layout as the docs write it, and what it holds."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what

    @property
    def name(self) -> str:
        """The last part of the path (``midepoch.pt``), for code that only has its folder."""
        return PurePosixPath(self.path).name


class Entry(Documented):
    """A fixed path of a layout: on an instance it is ``root / path``."""

    @overload
    def __get__(self, layout: None, owner: Type[Any]) -> Entry: ...

    @overload
    def __get__(self, layout: _Layout, owner: Type[Any]) -> Path: ...

    def __get__(self, layout: Any, owner: Type[Any]) -> Any:
        return self if layout is None else layout.root / self.path.rstrip("/")


@dataclass(frozen=True)
class Numbering:
    """The paths of one numbered entry under ``root``: ``numbering(3)``, and the folder holding them.

    A pattern with several placeholders takes one number for each, in the order they appear.
    """

    root: Path
    pattern: str

    def __call__(self, *numbers: int) -> Path:
        placeholders = sorted((self.pattern.index(p), p) for p in PLACEHOLDERS if p in self.pattern)
        if len(numbers) != len(placeholders):
            raise TypeError(f"{self.pattern} takes {len(placeholders)} number(s), got {len(numbers)}")
        path = self.pattern
        for (_, placeholder), number in zip(placeholders, numbers):
            path = path.replace(placeholder, str(int(number)))
        return self.root / path.rstrip("/")

    @property
    def directory(self) -> Path:
        return self.root / self.pattern.rstrip("/").rsplit("/", 1)[0]

    def number_of(self, name: str) -> Optional[int]:
        """The number in ``name`` when it is one of these entries' names (``rank-3.json``: 3), else None.

        For a pattern with one placeholder in its last part (a listing of :attr:`directory` is read with it).
        """
        last = self.pattern.rstrip("/").rsplit("/", 1)[-1]
        shape = re.escape(last)
        for placeholder in PLACEHOLDERS:
            shape = shape.replace(re.escape(placeholder), "([0-9]{1,18})")
        found = re.fullmatch(shape, name)
        return int(found.group(1)) if found is not None and found.re.groups == 1 else None


class Numbered(Documented):
    """A path with one number in it (``logs/attempt-<n>.log``): on an instance, a ``Numbering``."""

    @overload
    def __get__(self, layout: None, owner: Type[Any]) -> Numbered: ...

    @overload
    def __get__(self, layout: _Layout, owner: Type[Any]) -> Numbering: ...

    def __get__(self, layout: Any, owner: Type[Any]) -> Any:
        return self if layout is None else Numbering(layout.root, self.path)


@dataclass(frozen=True)
class _Layout:
    root: Path

    @property
    def files(self) -> RunFiles:
        """The safe file operations of this directory (:mod:`trainbox.rundir.safe`): how its paths are used."""
        return RunFiles(self.root)

    @classmethod
    def entries(cls) -> List[Tuple[str, str]]:
        """(path as documented, what it holds) for every entry, in declaration order."""
        return [(e.path, e.what) for e in vars(cls).values() if isinstance(e, Documented)]


@dataclass(frozen=True)
class IncidentDir(_Layout):
    """``incidents/<session>-<attempt>/``: what a stalled run looked like (see :mod:`trainbox.diagnose.incident`)."""

    summary = Entry(
        "summary.json", "which budget ran out, how long the child was silent, how stacks were obtained, cause and evidence"
    )
    evidence = Entry("evidence.json", "the samples of the silent tree the cause was judged from")
    processes_json = Entry("processes.json", "the process tree with states, CPU times, threads")
    processes_txt = Entry("processes.txt", "the same tree, for reading")
    stack = Numbered("stacks/<pid>.txt", "all threads' Python stacks of one process of the tree")
    heartbeat = Entry("heartbeat.json", "the last beat before the stall")
    output_tail = Entry("output-tail.txt", "the end of the child's output")
    kernel = Entry("kernel.txt", "amdgpu/kfd/GPU kernel messages")
    gpu = Entry("gpu.txt", "rocm-smi or nvidia-smi output, when installed")


@dataclass(frozen=True)
class RunDir(_Layout):
    """One run's directory (``--run-dir``, else ``$TRAIN_RUN_DIR``, else a new ``runs/<command>-<YYYYmmdd-HHMMSS>``)."""

    events = Entry("events.jsonl", "the run's history, one JSON object per line")
    state = Entry("state.json", "the supervisor's current state (read by `health` and `invoke status`)")
    first_start = Entry(
        "first-start.json",
        "when the run first started (unix time, written once): a restart resumes only from checkpoints written since",
    )
    heartbeat = Entry("heartbeat.json", "the child's last beat")
    rank_heartbeat = Numbered(
        "heartbeats/rank-<rank>.json",
        "under torchrun: rank `<rank>`'s last beat (its global `RANK`), one file per rank of this node",
    )
    progress = Entry(
        "progress.jsonl", "the child's beats, sampled every few seconds and at each phase change (throughput, silences)"
    )
    report = Entry("report.html", "`trainbox report`: the run in pictures, one self-contained file (refreshed when the run ends)")
    stack_dump = Numbered("stacks/<pid>.txt", "a process's faulthandler stack dump, written on SIGUSR1")
    incident_dir = Numbered(
        "incidents/<session>-<attempt>/",
        "the report written for a stall, before anything was killed (its cause and evidence in `summary.json`); "
        "`<session>` is the supervisor's start (UTC, `YYYYMMDDhhmmss`), so no report is ever overwritten",
    )
    supervisor_hang = Numbered(
        "incidents/<session>-supervisor.txt",
        "the Python stacks of a hung supervisor and what `health --act` saw before it ended it (see "
        "[who watches the supervisor](#who-watches-the-supervisor))",
    )
    lock = Entry("supervisor.lock", "locked by the supervisor for its life (holds its pid): one supervisor per directory")
    checkpoint_request = Entry(
        "checkpoint.request",
        "written by the supervisor just before `--on-slow restart` restarts a slow attempt: a child that can checkpoint "
        "at once does (see [A run that became slow](#a-run-that-became-slow)); removed when the next attempt starts",
    )
    attempt_log = Numbered("logs/attempt-<n>.log", "the child's output, per attempt")
    rank_error = Numbered(
        "logs/attempt-<n>.torchrun-error.json",
        "under torchrun: the first failed rank's error (`TORCHELASTIC_ERROR_FILE`; written when its entry point is `@record`)",
    )
    container_log = Numbered(
        "logs/container-<n>.log", "the output of an earlier, stopped container of the run, saved when `invoke train` replaced it"
    )
    train = Entry("train/", "Ultralytics' run directory (its `project`/`name`)")
    train_args = Entry("train/args.yaml", "the arguments Ultralytics trained with")
    results = Entry("train/results.csv", "Ultralytics' per-epoch metrics")
    last_checkpoint = Entry(
        "train/weights/last.pt", "Ultralytics' epoch-end checkpoint, written atomically; every restart resumes from it"
    )
    best_checkpoint = Entry("train/weights/best.pt", "Ultralytics' best-fitness checkpoint")
    midepoch_checkpoint = Entry("train/weights/midepoch.pt", "the mid-epoch checkpoint, while an epoch is under way")
    ultralytics = Entry("ultralytics/", "Ultralytics' own config directory (settings, a local font)")
    network_log = Entry("network.log", "any network connection the training tried, refused (absent = none)")
    demo_data = Entry(
        "demo-data/", "`trainbox demo`'s synthetic dataset (`invoke train` and `docker compose up` without a dataset)"
    )
    container_exit = Entry(
        "container-exit.json",
        "in a trainbox container: the run's real exit status (see [Containers](#containers), restarts)",
    )

    def incident(self, session: int, attempt: int) -> IncidentDir:
        """The stall report of ``attempt`` of the supervisor session ``session`` (see :meth:`new_session`)."""
        return IncidentDir(self.incident_dir(session, attempt))

    def incident_named(self, where: str) -> Optional[IncidentDir]:
        """The report a ``stall`` event names (as the supervisor saw it: in a container ``/runs/...``), found here by
        its folder's name; None when the name is not a report's (``..``, ``/etc``)."""
        name = PurePosixPath(where).name
        return IncidentDir(self.incident_dir.directory / name) if INCIDENT_NAME.fullmatch(name) else None

    def new_session(self, started: float) -> int:
        """The session number of a supervisor started at ``started`` (unix seconds): UTC ``YYYYMMDDhhmmss``.

        One second later while reports of that number exist: only one supervisor
        runs at a time (:mod:`trainbox.rundir.lock`), but two short ones may start
        within the same second, and a report is never overwritten.
        """
        listed = self.files.list_dir(self.incident_dir.directory, MAX_INCIDENTS_LISTED).value or []
        taken = {name.split("-", 1)[0] for name in listed}
        while True:
            session = int(time.strftime("%Y%m%d%H%M%S", time.gmtime(started)))
            if str(session) not in taken:
                return session
            started += 1


@dataclass(frozen=True)
class JobDir(_Layout):
    """A job of several nodes (a Slurm job): one directory on the filesystem every node sees, one run directory per
    node in it, and what only the job as a whole knows (``runs/<command>-<jobid>/``)."""

    job = Entry("job.json", "the job as the scheduler started it: its id, its nodes, how often it was requeued")
    node = Numbered("node-<node>/", "node `<node>`'s run directory (`SLURM_NODEID`), laid out as the table above")
    incident = Entry(
        "incident.json",
        "the newest job-level stall: every silent rank of every node that reported, and the first one to go silent "
        "(the one the others wait for)",
    )
    report = Entry("report.html", "`trainbox report JOB`: every node in one table, each linking to its node's report")
    incident_part = Numbered(
        "incidents/<node>-<session>-<attempt>.json",
        "what node `<node>` saw of a stall of its attempt `<attempt>` (session as above): its ranks, each one's last "
        "step and whether it waits for its peers",
    )

    def nodes(self) -> List[int]:
        """The numbers of the node folders there are (folders reached without a link), in order."""
        listed = self.files.list_dir(self.root, MAX_NODES_LISTED).value or []
        numbers = ((self.node.number_of(name), name) for name in listed)
        return sorted(n for n, name in numbers if n is not None and self._folder(name))

    def _folder(self, name: str) -> bool:
        found = self.files.stat(self.root / name).value
        return found is not None and stat.S_ISDIR(found.st_mode)


def program_start(argv: Sequence[str]) -> int:
    """Where the program proper starts in ``argv``: past ``env VAR=value ...`` and the other wrappers of
    :data:`WRAPPERS` with their own options (``env PYTHONPATH=/x yolo train``: 2, ``nice -n 5 python t.py``: 3)."""
    at = 0
    while at < len(argv) and WRAPPERS.fullmatch(os.path.basename(argv[at])):
        wrapper = _runner(argv[at])
        at += 1
        while at < len(argv) and (argv[at].startswith("-") or (wrapper == "env" and ASSIGNMENT.match(argv[at]))):
            at += 2 if argv[at] in VALUED_OPTIONS.get(wrapper, ()) else 1
    return min(at, len(argv))


def _runner(word: str) -> str:
    """A runner's name as :data:`VALUED_OPTIONS` knows it: ``python3.11`` and ``pypy3`` are ``python``."""
    name = os.path.basename(word)
    name = name[: -len(".exe")] if name.endswith(".exe") else name
    return "python" if name.startswith(("python", "pypy")) else name


def command_name(argv: Sequence[str]) -> str:
    """The name a command's runs are called by: its program's, or the script or module a runner runs.

    ``python train.py`` and ``torchrun --nproc-per-node 2 train.py``: ``train``; ``python -m pkg.fit``: ``fit``;
    ``yolo train ...``: ``yolo``; a runner's own options (``-u``, ``-W ignore``, ``--nproc-per-node 2``) are passed
    over, ``env VAR=value`` too, a ``launch`` or ``run`` subcommand (``accelerate launch``, ``uv run``) too;
    ``python -c ...`` is ``python``. Never the name of trainbox's own runs (:data:`OWN_NAMES`).
    """
    words, runner = list(argv), ""
    while words and RUNNERS.fullmatch(os.path.basename(words[0])):
        runner = _runner(words.pop(0))
        while words and (words[0].startswith("-") or words[0] in ("launch", "run") or _assigns(runner, words[0])):
            option = words.pop(0)
            if option == "-m" and words:
                return _named(words[0].rsplit(".", 1)[-1])
            if option == "-c":
                return "python"
            valued = option in VALUED_OPTIONS.get(runner, ())
            long_valued = option.startswith("--") and "=" not in option and bool(words) and not words[0].startswith("-")
            if words and (valued or (long_valued and not words[0].endswith(".py"))):
                words.pop(0)  # the option's value (--nproc-per-node 2, -W ignore), unless it is the script
    return _named(os.path.basename(words[0]) if words else runner)  # a runner alone (``python``) is itself


def _assigns(runner: str, word: str) -> bool:
    return runner == "env" and ASSIGNMENT.match(word) is not None


def _named(word: str) -> str:
    """A program's file name as a folder name: its letters and digits in any script (``训练.py``: ``训练``), a short
    hash of it when none is left, and never one of :data:`OWN_NAMES` (``run.py``: ``run-cmd``)."""
    stem = os.path.splitext(word)[0]
    kept = "".join(c if c in "._-" or unicodedata.category(c)[0] in "LNM" else "_" for c in stem).strip("._-")[:64]
    if not kept:  # no letter or digit in it: a name of its own all the same
        return f"cmd-{hashlib.sha256(word.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    if kept in OWN_NAMES:
        return f"{kept}-cmd"
    return kept


def run_name(command: str, started: float, number: int = 1) -> str:
    """``<command>-<YYYYmmdd-HHMMSS>`` (local time) of a run started at ``started``; ``-2``, ``-3`` ... for the
    ``number``-th run of one command started within that second (:func:`trainbox.rundir.owner.choose`)."""
    name = f"{command}-{time.strftime(RUN_STAMP, time.localtime(started))}"
    return name if number <= 1 else f"{name}-{number}"


def newest_named(runs: Path, command: str, names: Sequence[str]) -> Optional[Path]:
    """The newest of ``names`` (a listing of ``runs``) that is a run of ``command`` by its name, else None."""
    found = []
    for name in names:
        rest = RUN_SUFFIX.fullmatch(name[len(command) :]) if name.startswith(command) else None
        if rest is not None:
            found.append((rest.group(1), int(rest.group(2) or 1), name))
    return runs / max(found)[2] if found else None
