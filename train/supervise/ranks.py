"""A job's heartbeats as the supervisor follows them: one file, or one per torchrun rank.

Without torchrun the child beats into ``heartbeat.json`` and the job is silent
as long as that file. Under torchrun each rank beats into
``heartbeats/rank-<rank>.json`` (:mod:`trainbox.heartbeat`) and the job is as
far along as its slowest rank: every rank has its own silence and its own
budget (from its own last beat, :class:`trainbox.supervise.stalls.budgets.BudgetPolicy`), and
the rank with the least budget left decides. One rank silent past its budget
is a stall even while the others beat.

Which ranks this node runs: every beat names its ``rank``, ``local_rank`` and
``local_world_size``, and torchrun numbers a node's ranks consecutively, so the
first beat of any rank tells the supervisor all of them (``rank - local_rank``
onwards). The ones that have not beaten yet are silent since the attempt began
(or since the node's ranks were last seen restarting), on the startup budget.

A rank file whose process has ended is stale: the rank finished (rank 0 may
validate alone after the others are done), or torchrun is restarting the node's
workers (it restarts all of them after a failure, and a re-rendezvous may
renumber them, c10d ranking the nodes afresh). An ended rank is left out while
another rank of the node lives; while none lives the node is starting again,
on the startup budget from the moment the last one was seen gone.
``heartbeat.json`` (the Ultralytics launcher, which starts torchrun itself)
counts only until the first rank beats.

:data:`TORCHRUN_DEFAULTS` is the environment a supervised torchrun needs to
rejoin a multi-node rendezvous after its supervisor restarted it.

:func:`failure` reads what torchrun says about a failed rank: its error file
(``TORCHELASTIC_ERROR_FILE``, which the supervisor points at
``logs/attempt-<n>.torchrun-error.json``) and its "Root Cause" summary.

Every file is read and deleted through :mod:`trainbox.rundir.safe` and every beat comes typed
(:func:`trainbox.rundir.records.read_beat`): :func:`clear` deletes only the names beats are written under (a
``heartbeats`` link is refused, never followed and emptied; a folder in it is left alone), a FIFO in place of a
beat is no beat (opening it would have blocked the supervisor for good), a beat that claims more than
:data:`trainbox.rundir.records.MAX_LOCAL_RANKS` ranks on its node names none, and at most
:data:`trainbox.rundir.records.MAX_RANK_FILES` rank files are read (issue 33 items 2, 4, 5 and 6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import psutil

from trainbox import heartbeat
from trainbox.rundir.layout import RunDir
from trainbox.rundir.records import Schema, exit_code, files_of, rank_files, read_beat, read_record, text
from trainbox.rundir.safe import Refusal, names
from trainbox.supervise.stalls.budgets import Budget, BudgetPolicy, counting

#: Where torchrun (torch.distributed.elastic) writes the first failed rank's error, when its entry point is ``@record``.
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"

#: What the supervisor's child gets unless the user's environment says otherwise. torchrun's c10d
#: rendezvous shares its TCP store with the ranks by default, and then an agent that was rank 0 of
#: the last round and stays rank 0 never publishes the next round's master address: a node that the
#: supervisor restarted and that rejoins waits for it until the rendezvous times out (60 s) and both
#: torchruns fail (torch 2.x, ``DynamicRendezvousHandler.next_rendezvous``). Without the sharing,
#: rank 0 publishes it in every round.
TORCHRUN_DEFAULTS = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
#: The names the beats are written under (and their temporary files): all that :func:`clear` deletes.
HEARTBEAT_FILES = names(RunDir.heartbeat.name)
RANK_FILES = names(RunDir.rank_heartbeat.name)


@dataclass
class Track:
    """One beating process: its last beat that made progress, and when (monotonic seconds)."""

    progress: float
    key: Optional[str] = None
    beat: Optional[Dict[str, Any]] = None
    pid: Any = None
    #: Whether ``beat`` moved a counter that is still counting (a learned budget judges only the silence after one).
    counting: bool = False


@dataclass(frozen=True)
class Progress:
    """A beat that made progress, the same process's beat before it (None: its first), the silence it ended,
    and the budget that was in force for that silence (before the policy learned from it)."""

    record: Dict[str, Any]
    previous: Optional[Dict[str, Any]]
    silent_s: float
    budget: Budget


@dataclass(frozen=True)
class Standing:
    """How far one rank (``None``: the single process) is into its budget."""

    rank: Optional[int]
    budget: Budget
    silent_s: float
    beat: Optional[Dict[str, Any]]

    @property
    def left_s(self) -> float:
        return self.budget.seconds - self.silent_s

    def described(self) -> Dict[str, Any]:
        budget = {"budget": self.budget.name, "budget_s": self.budget.seconds}
        return {"silent_s": round(self.silent_s, 3), **budget, "last_beat": self.beat}


def clear(run: RunDir) -> Optional[str]:
    """Remove the last attempt's heartbeat files: a new attempt starts silent. One line for what was left alone
    or refused (a folder among the rank files, a ``heartbeats`` link), else None."""
    files = run.files
    files.remove(run.heartbeat, HEARTBEAT_FILES)
    cleared = files.clear(run.rank_heartbeat.directory, RANK_FILES)
    directory = run.rank_heartbeat.directory
    if cleared.refused is not None and cleared.refused is not Refusal.MISSING:
        return f"{cleared.refused.line(directory)}: rank beats are not read there"
    if cleared.left:
        left = ", ".join(f"{name} ({refusal.value})" for name, refusal in cleared.left.items())
        return f"{directory}: left alone: {left}" + (f" and {cleared.more_left} more" if cleared.more_left else "")
    return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _number(record: Optional[Dict[str, Any]], key: str) -> Optional[int]:
    """``record[key]`` when it is a whole number (a file that says otherwise is garbage, not a rank's beat)."""
    value = (record or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _rank_of(record: Optional[Dict[str, Any]]) -> Optional[int]:
    return _number(record, "rank")


def _node_of(record: Dict[str, Any], rank: int) -> Optional[Tuple[int, int]]:
    """(first rank, how many) of the node that ``record``'s rank runs on, when the beat says."""
    local, count = _number(record, "local_rank"), _number(record, "local_world_size")
    return (rank - local, count) if local is not None and count and local <= rank else None


@dataclass
class JobBeats:
    """Every heartbeat file of one attempt, read together (see the module docstring)."""

    run: RunDir
    policy: BudgetPolicy
    started: float
    single: Track = field(init=False)
    ranks: Dict[int, Track] = field(default_factory=dict)
    #: Rank processes (pids) seen ended: their files are stale.
    gone: Set[int] = field(default_factory=set)
    #: Ranks whose process ended and that no new process has beaten for yet.
    ended: Set[int] = field(default_factory=set)
    #: Since when ranks that have not beaten are silent: the attempt's start, or the last rank seen gone.
    waiting_since: float = field(init=False)
    #: This node's ranks, (first rank, how many), from the newest beat.
    node: Optional[Tuple[int, int]] = None

    def __post_init__(self) -> None:
        self.single = Track(progress=self.started)
        self.waiting_since = self.started

    @property
    def torchrun(self) -> bool:
        """Whether any rank has beaten in this attempt."""
        return self.node is not None

    def poll(self, now: float) -> List[Progress]:
        """Read every heartbeat file; return the beats that made progress (the launcher's first, then by rank).

        Each rank's silence before its progress also teaches the policy that rank's rhythm (learned budgets).
        """
        progressed = [p for p in [self._advance(self.single, read_beat(self.run.files, self.run.heartbeat), now)] if p]
        files = self.run.files
        for number in rank_files(self.run):
            record = read_beat(files, self.run.rank_heartbeat(number))
            rank = _rank_of(record)
            pid = record.get("pid") if record is not None else None
            if record is None or rank is None or not isinstance(pid, int) or pid in self.gone:
                continue  # not a rank's beat, or a stale one
            if not _alive(pid):
                self.gone.add(pid)
                self.ended.add(rank)
                self.ranks.pop(rank, None)
                self.waiting_since = now
                continue
            self.ended.discard(rank)
            track = self.ranks.setdefault(rank, Track(progress=self.waiting_since))
            progress = self._advance(track, record, now)
            if progress is not None:
                progressed.append(progress)
                self.node = _node_of(record, rank) or self.node or (rank, 1)
        return progressed

    def _advance(self, track: Track, record: Optional[Dict[str, Any]], now: float) -> Optional[Progress]:
        """Take ``record`` into ``track``; its Progress when it is one (new content, or a new process)."""
        key = heartbeat.progress_key(record)
        pid = (record or {}).get("pid")
        if record is None or key is None or (key == track.key and pid == track.pid):
            return None
        return self._take(track, record, now)

    def heard(self, record: Dict[str, Any], at: float) -> Progress:
        """Progress the child's output showed at ``at`` (a counter that advanced, read by
        :mod:`trainbox.supervise.output.source` while no heartbeat file is written): the one process's beat."""
        return self._take(self.single, record, max(at, self.single.progress))

    def _take(self, track: Track, record: Dict[str, Any], now: float) -> Progress:
        """``record`` is ``track``'s progress at ``now``: the silence it ended teaches the policy its rhythm."""
        progress = Progress(record, track.beat, now - track.progress, self._budget(track))
        self.policy.observe(track.beat, progress.silent_s, record)
        track.counting = counting(track.beat, record)
        track.key, track.beat, track.pid, track.progress = heartbeat.progress_key(record), record, record.get("pid"), now
        return progress

    def _budget(self, track: Track) -> Budget:
        return self.policy.current(track.beat, track.counting)

    def standings(self, now: float) -> List[Standing]:
        """Every rank this node runs (without torchrun: the one process), each with its budget and silence."""
        if not self.torchrun:
            return [Standing(None, self._budget(self.single), now - self.single.progress, self.single.beat)]
        first, count = self.node or (0, 0)
        standings = []
        for rank in sorted(set(self.ranks) | set(range(first, first + count))):
            track = self.ranks.get(rank)
            if track is not None:
                standings.append(Standing(rank, self._budget(track), now - track.progress, track.beat))
            elif not (rank in self.ended and self.ranks):  # an ended rank counts only while the node restarts
                standings.append(Standing(rank, self.policy.current(None), now - self.waiting_since, None))
        return standings

    def lagging(self, now: float) -> Standing:
        """The rank with the least budget left: the job's progress is its slowest rank's."""
        return min(self.standings(now), key=lambda standing: standing.left_s)

    def report(self, now: float) -> Dict[str, Any]:
        """For a stall's report and event: ``silent_ranks`` and each rank's last beat (nothing without torchrun)."""
        if not self.torchrun:
            return {}
        standings = self.standings(now)
        return {
            "silent_ranks": [s.rank for s in standings if s.left_s < 0],
            "ranks": {str(s.rank): s.described() for s in standings},
        }


_ERROR_MESSAGE = Schema({"message": text, "errorCode": exit_code})


def _message(value: Any) -> Any:
    return text(value) if isinstance(value, str) else _ERROR_MESSAGE(value)


#: torchrun's error file: ``{"message": {"message": ..., "errorCode": ...}}`` (``@record``), or a message as text.
TORCHRUN_ERROR = Schema({"message": _message})
#: An error file holds one exception with its traceback.
MAX_ERROR_FILE_BYTES = 1 << 20
#: One entry of torchrun's "Root Cause (first observed failure)" summary, as torch.distributed.elastic prints it.
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(-?\d+) \(local_rank: (-?\d+)\)\s*exitcode\s*:\s*(-?\d+)", re.S)


#: A line of a rank's output as torchrun prefixes it: ``[rank1]: RuntimeError: ...``.
_RANK_LINE = re.compile(r"^\[rank(\d+)\]: (.*)$")


def rank_traceback(output_tail: str) -> Optional[Tuple[int, str]]:
    """The first rank whose traceback the output shows, and the traceback's last line (its exception); None if none."""
    last_lines: Dict[int, Optional[str]] = {}  # rank -> its traceback's last unindented line; ranks in order seen
    for line in output_tail.splitlines():
        match = _RANK_LINE.match(line)
        if not match:
            continue
        rank, said = int(match.group(1)), match.group(2)
        if said.startswith("Traceback (most recent call last)"):
            last_lines.setdefault(rank, None)
        elif rank in last_lines and said and not said[0].isspace():
            last_lines[rank] = said
    return next(((rank, said) for rank, said in last_lines.items() if said), None)


def failure(error_file: Path, output_tail: str) -> Optional[Dict[str, Any]]:
    """Which rank failed first and how: from torchrun's summary in the output and its error file; None if neither.

    ``exitcode`` is negative for a signal (``-9``: SIGKILL). ``error`` is the
    rank's exception as ``@record`` wrote it (None when its entry point has no ``@record``).

    torchrun prints its summary and copies the failed rank's error file into its own once it has read them all; when it
    fails first itself (seen under load: it read a rank's error file that the rank, ended by torchrun, had only begun to
    write, and raised JSONDecodeError), its error file holds its own exception and there is no summary. The rank and
    its exception then come from the rank's traceback in the output, which torchrun prefixes with ``[rankN]:``.
    """
    found: Dict[str, Any] = {}
    match = _ROOT_CAUSE.search(output_tail)
    if match:
        found.update(rank=int(match.group(1)), local_rank=int(match.group(2)), exitcode=int(match.group(3)))
    else:
        traced = rank_traceback(output_tail)
        if traced:
            return {"rank": traced[0], "error": traced[1]}
    files, name = files_of(error_file)
    record, _ = read_record(files, name, MAX_ERROR_FILE_BYTES, TORCHRUN_ERROR)
    message = (record or {}).get("message")
    if isinstance(message, dict):
        found["error"] = message.get("message")
        if message.get("errorCode") is not None and "exitcode" not in found:
            found["exitcode"] = message["errorCode"]
    elif isinstance(message, str):
        found["error"] = message
    if not found:
        return None
    found.setdefault("error", None)
    return found
