"""A job-level stall: which rank, on which node, went silent first, from what every node saw.

A job of several nodes has one supervisor per node, each watching its own ranks (:mod:`trainbox.supervise.ranks`).
When one rank hangs, every rank of the job goes silent within a step: the others wait for it at the next
all-reduce. So every node's supervisor calls a stall, each writes its own incident report with its own ranks'
stacks, and none of them alone can say which rank the others wait for when it is on another node. This module
puts the nodes' reports together on the filesystem they share (:class:`trainbox.rundir.layout.JobDir`):

* **Each node writes its part** (:meth:`JobIncidents.heard`, a listener on the node's record, told of its ``stall``
  event): for every rank process in its incident's ``processes.json`` (torchrun's ``RANK`` in its environment),
  whether its stack waits for its peers (:mod:`trainbox.diagnose.collective`), what it was doing, its last step
  and when it last made progress. A part is written once, atomically, under a name of its own: nodes never write
  the same file.
* **The job's verdict is made again from every part of the same stall** (:func:`same_stall`: the parts reported
  since the newest report's silence began; an older part belongs to an earlier stall) by each node as it writes
  its part, and written atomically to ``incident.json``: the last node to report has seen the most, and a verdict
  made from fewer parts is replaced, never merged.
* **The first silent rank** (:func:`first_silent`, pure): among the ranks that do not wait for a peer, the one
  whose progress stopped first (then the lowest step, then the lowest rank). A rank without a stack (its node has
  not reported yet, or py-spy could not read it) is a suspect only when no rank with a stack is. When every rank
  waits for a peer, none is named: the peer they wait for is gone (a lost node) or the network is.

The whole job's restart needs nothing from here: each node's supervisor restarts its own torchrun, and torchrun's
agents restart their ranks into the next rendezvous round (``docs/torchrun.md``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from trainbox.diagnose import collective
from trainbox.errors import say
from trainbox.rundir.layout import IncidentDir, JobDir, RunDir
from trainbox.supervise.record import Listener

#: A processes.json or a part is small (a row per process, a row per rank); more is not a report of ours.
MAX_REPORT_BYTES = 4 * 2**20
#: A stack file is read up to this many bytes (the incident writer keeps them far smaller).
MAX_STACK_BYTES = 2**20
#: More nodes than a job.json of ours names is not ours: the nodes not reported are not listed past it.
MAX_NODES = 100_000
#: Parts listed at most when the verdict is made again (a job restarts a few times a day, not millions).
MAX_PARTS_LISTED = 10_000


@dataclass(frozen=True)
class RankSeen:
    """One rank as its node saw it when it called the stall."""

    node: int
    rank: int
    pid: Optional[int]
    #: Whether its stack waits for its peers; None without a stack.
    waiting: Optional[bool]
    #: Its main thread's innermost frame (``file:function``), or the frame where it waits for its peers.
    doing: Optional[str]
    #: When it (or, without per-rank beats, its node) last made progress, unix seconds.
    last_progress_ts: Optional[float]
    #: Its last step (or its node's place) as the node's stall event gives it.
    at: Optional[str]

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Optional[RankSeen]:
        """The rank a part lists, or None when the entry is not one (a part is run-directory input: untrusted)."""
        node, rank, pid = value.get("node"), value.get("rank"), value.get("pid")
        if not (_whole(node) and _whole(rank) and (pid is None or _whole(pid))):
            return None
        waiting, doing, ts, at = value.get("waiting"), value.get("doing"), value.get("last_progress_ts"), value.get("at")
        return cls(
            node=node,
            rank=rank,
            pid=pid,
            waiting=waiting if isinstance(waiting, bool) else None,
            doing=doing if isinstance(doing, str) else None,
            last_progress_ts=float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None,
            at=at if isinstance(at, str) else None,
        )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def first_silent(ranks: Sequence[RankSeen]) -> Optional[RankSeen]:
    """The rank the others wait for (see the module docstring), or None when every rank waits for a peer."""
    not_waiting = [r for r in ranks if r.waiting is False]
    suspects = not_waiting or [r for r in ranks if r.waiting is None]
    if not suspects:
        return None
    never = float("inf")
    return min(suspects, key=lambda r: (r.last_progress_ts if r.last_progress_ts is not None else never, r.rank))


def why(first: Optional[RankSeen], ranks: Sequence[RankSeen], missing: Sequence[int] = ()) -> str:
    """The verdict in one line, for the job's incident and the supervisor's output; ``missing``: the nodes of the job
    that have not reported this stall (yet)."""
    later = f"; node(s) {', '.join(map(str, missing))} not reported yet" if missing else ""
    if first is None:
        if not ranks:
            return "no rank process was found in the reports" + later
        if missing:
            return f"the {len(ranks)} rank(s) reported wait for a peer{later}"
        return f"all {len(ranks)} ranks reported wait for a peer: a lost node or the network, not a rank"
    waiting = [r for r in ranks if r.waiting]
    unread = [r for r in ranks if r.waiting is None and r is not first]
    where = f" in {first.doing}" if first.doing else ""
    if first.waiting is None:
        return f"rank {first.rank} on node {first.node} has no stack yet; the {len(waiting)} reported wait for a peer" + later
    without = f", {len(unread)} without a stack" if unread else ""
    return f"rank {first.rank} on node {first.node} stopped{where}; {len(waiting)} other rank(s) wait for it{without}{later}"


def same_stall(parts: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The parts of the newest stall: those reported since the newest part's silence began."""
    timed = [p for p in parts if isinstance(p.get("ts"), (int, float)) and isinstance(p.get("silent_s"), (int, float))]
    if not timed:
        return []
    newest = max(timed, key=lambda p: p["ts"])
    began = newest["ts"] - newest["silent_s"]
    return [p for p in timed if p["ts"] >= began]


def verdict(parts: Sequence[Mapping[str, Any]], nnodes: Optional[int] = None) -> Dict[str, Any]:
    """The job's incident from its nodes' parts (those of the newest stall), of ``nnodes`` nodes when known."""
    current = same_stall(parts)
    ranks = [seen for part in current for seen in _ranks_of(part)]
    ranks.sort(key=lambda r: (r.node, r.rank))
    first = first_silent(ranks)
    nodes = sorted({p["node"] for p in current if _whole(p.get("node"))})
    missing = [n for n in range(nnodes) if n not in nodes] if nnodes is not None and nnodes <= MAX_NODES else []
    return {
        "ts": max((p["ts"] for p in current), default=None),
        "nodes": nodes,
        "first_silent": asdict(first) if first is not None else None,
        "why": why(first, ranks, missing),
        "ranks": [asdict(r) for r in ranks],
        "incidents": {str(p["node"]): p.get("incident") for p in current if _whole(p.get("node"))},
    }


def _ranks_of(part: Mapping[str, Any]) -> List[RankSeen]:
    listed = part.get("ranks")
    if not isinstance(listed, list):
        return []
    found = (RankSeen.from_json(item) for item in listed if isinstance(item, dict))
    return [seen for seen in found if seen is not None]


def rank_processes(rows: Sequence[Mapping[str, Any]]) -> Dict[int, int]:
    """``{rank: pid}`` of the ranks' own processes in an incident's ``processes.json`` rows: a process with
    torchrun's ``RANK`` whose parent has none or another (its DataLoader workers inherit its ``RANK``)."""
    by_pid = {row.get("pid"): row for row in rows}
    found: Dict[int, int] = {}
    for row in rows:
        rank, pid = row.get("rank"), row.get("pid")
        if not (_whole(rank) and _whole(pid)):
            continue
        parent = by_pid.get(row.get("ppid")) or {}
        if parent.get("rank") != rank and rank not in found:
            found[rank] = pid
    return found


class JobIncidents:
    """Node ``node``'s side of the job's incidents: its part of each stall, and the job's verdict made again."""

    def __init__(self, job: JobDir, node: int) -> None:
        self.job = job
        self.node = node
        self.run = RunDir(job.node(node))

    def heard(self, record: Dict[str, Any]) -> None:
        """A listener on the node's record: on its ``stall`` event, write this node's part and the job's verdict."""
        if record.get("event") != "stall" or not isinstance(record.get("incident"), str):
            return
        try:
            made = self.write_part(record)
            if made is not None:
                found = self.write_verdict()
                say(f"job: {found['why']} (see {self.job.incident})")
        except OSError as exc:  # the shared filesystem failed: the node's own report stands, the run goes on
            say(f"cannot write the job's incident to {self.job.root}: {exc.strerror or exc}")

    def part(self, record: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """This node's part of a stall, from its ``stall`` event and the incident report it names."""
        report = self.run.incident_named(record["incident"])
        if report is None:
            return None
        rows = self._rows(report)
        ts = _seconds(record.get("ts"), time.time())
        silent = _seconds(record.get("silent_s"), 0.0)
        # The event is written after the report and the kill: the stall was called that much earlier.
        called = ts - _seconds(record.get("incident_s"), 0.0) - _seconds(record.get("kill_s"), 0.0)
        at = record.get("at") if isinstance(record.get("at"), str) else None
        ranks = []
        for rank, pid in sorted(rank_processes(rows).items()):
            stack = self._stack(report, pid)
            ranks.append(
                RankSeen(
                    node=self.node,
                    rank=rank,
                    pid=pid,
                    waiting=None if stack is None else collective.waiting_for_peers(stack, pid),  # None: no frame
                    doing=None if stack is None else _doing(stack, pid),
                    last_progress_ts=called - silent,
                    at=at,
                )
            )
        session, attempt = (int(n) for n in report.root.name.split("-"))
        return {
            "node": self.node,
            "session": session,
            "attempt": attempt,
            "ts": ts,
            "silent_s": silent,
            "cause": record.get("cause"),
            "incident": str(report.root),
            "ranks": [asdict(r) for r in ranks],
        }

    def write_part(self, record: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        made = self.part(record)
        if made is None:
            return None
        path = self.job.incident_part(self.node, made["session"], made["attempt"])
        self.job.files.make_dirs(path.parent)
        self.job.files.replace(path, json.dumps(made, indent=1, sort_keys=True).encode())
        return made

    def write_verdict(self) -> Dict[str, Any]:
        described = self.job.files.read_object(self.job.job, MAX_REPORT_BYTES).value or {}
        nnodes = described.get("nnodes")
        found = verdict(read_parts(self.job), nnodes if _whole(nnodes) else None)
        self.job.files.replace(self.job.incident, json.dumps(found, indent=1, sort_keys=True).encode())
        return found

    def _rows(self, report: IncidentDir) -> List[Dict[str, Any]]:
        data = self.run.files.read_bytes(report.processes_json, MAX_REPORT_BYTES).value
        try:
            rows = json.loads(data) if data is not None else []
        except ValueError:
            return []
        return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []

    def _stack(self, report: IncidentDir, pid: int) -> Optional[str]:
        data = self.run.files.read_bytes(report.stack(pid), MAX_STACK_BYTES).value
        text = data.decode(errors="replace") if data is not None else None
        return None if text is None or text.startswith("no stack:") else text


def _seconds(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _doing(stack: str, pid: int) -> Optional[str]:
    waits = collective.where(stack, pid)
    return waits.where if waits is not None else collective.doing(stack, pid)


def read_parts(job: JobDir) -> List[Dict[str, Any]]:
    """Every node's parts there are (unreadable ones left out)."""
    folder = job.incident_part.directory
    parts = []
    for name in job.files.list_dir(folder, MAX_PARTS_LISTED).value or []:
        if not name.endswith(".json"):
            continue
        found = job.files.read_object(Path(folder) / name, MAX_REPORT_BYTES).value
        if found is not None:
            parts.append(found)
    return parts


def listeners(run_dir: Path) -> Tuple[Listener, ...]:
    """What a node's supervisor is told of its events: this node's side of the job's incidents when ``run_dir`` is a
    node's run directory in a job's (``<job>/node-<n>/`` beside ``<job>/job.json``), else nothing."""
    job = JobDir(run_dir.parent)
    node = job.node.number_of(run_dir.name)
    if node is None or job.files.stat(job.job).value is None:
        return ()
    return (JobIncidents(job, node).heard,)
