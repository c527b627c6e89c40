"""The job's incident from its nodes' parts: which rank the others wait for, in milliseconds.

The real report this is made from is tested in ``tests/supervise/test_ranks.py`` (a DDP job with one rank hung, run as
node 0 of a job) and, across two nodes of a real Slurm cluster, in ``tests/slurm/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from trainbox.job import incident
from trainbox.job.incident import RankSeen, first_silent, rank_processes, same_stall, verdict
from trainbox.rundir.layout import JobDir


def seen(node: int, rank: int, waiting: Optional[bool], last: Optional[float] = 100.0, doing: str = "t.py:f") -> RankSeen:
    return RankSeen(node=node, rank=rank, pid=1000 + rank, waiting=waiting, doing=doing, last_progress_ts=last, at="step 7")


def test_the_rank_not_waiting_for_its_peers_is_named_wherever_it_is() -> None:
    ranks = [seen(0, 0, True), seen(0, 1, True), seen(1, 2, False, doing="t.py:hang"), seen(1, 3, True)]
    assert first_silent(ranks) == ranks[2]
    assert incident.why(ranks[2], ranks) == "rank 2 on node 1 stopped in t.py:hang; 3 other rank(s) wait for it"


def test_among_several_not_waiting_the_one_whose_progress_stopped_first() -> None:
    ranks = [seen(0, 0, False, last=105.0), seen(1, 1, False, last=101.0), seen(1, 2, True, last=99.0)]
    assert first_silent(ranks) == ranks[1]


def test_a_rank_without_a_stack_is_a_suspect_only_when_none_with_a_stack_is() -> None:
    assert first_silent([seen(0, 0, True), seen(1, 1, None)]) == seen(1, 1, None)
    assert first_silent([seen(0, 0, False), seen(1, 1, None, last=1.0)]) == seen(0, 0, False)


def test_when_every_rank_waits_for_a_peer_none_is_named() -> None:
    ranks = [seen(0, 0, True), seen(1, 1, True)]
    assert first_silent(ranks) is None
    assert "a lost node or the network" in incident.why(None, ranks)


def test_a_verdict_before_every_node_reported_says_which_have_not() -> None:
    """The first node to report sees only its own ranks waiting: that is not yet a lost node."""
    found = verdict([part(0, 2000.0, 30.0, [seen(0, 0, True)])], nnodes=2)
    assert found["first_silent"] is None
    assert found["why"] == "the 1 rank(s) reported wait for a peer; node(s) 1 not reported yet"


def part(node: int, ts: float, silent_s: float, ranks: List[RankSeen]) -> Dict[str, Any]:
    return {
        "node": node,
        "ts": ts,
        "silent_s": silent_s,
        "incident": f"/j/node-{node}/incidents/1-0",
        "ranks": [r.__dict__ for r in ranks],
    }


def test_a_verdict_is_made_from_the_parts_of_the_newest_stall_only() -> None:
    old = part(0, 1000.0, 30.0, [seen(0, 0, False)])
    node0 = part(0, 2000.0, 30.0, [seen(0, 0, True)])
    node1 = part(1, 2004.0, 31.0, [seen(1, 1, False)])
    assert same_stall([old, node0, node1]) == [node0, node1]
    found = verdict([old, node0, node1])
    assert found["nodes"] == [0, 1] and (found["first_silent"]["node"], found["first_silent"]["rank"]) == (1, 1)
    assert [r["rank"] for r in found["ranks"]] == [0, 1]


def test_rank_processes_are_the_ranks_not_their_workers() -> None:
    rows = [
        {"pid": 10, "ppid": 1},  # torchrun's agent
        {"pid": 11, "ppid": 10, "rank": 0},
        {"pid": 12, "ppid": 10, "rank": 1},
        {"pid": 13, "ppid": 11, "rank": 0},  # rank 0's DataLoader worker: it inherited RANK
        {"pid": "x", "rank": 5},
    ]
    assert rank_processes(rows) == {0: 11, 1: 12}


def test_a_run_directory_is_a_node_of_a_job_only_beside_job_json(tmp_path: Path) -> None:
    job = JobDir(tmp_path)
    assert incident.listeners(job.node(0)) == ()
    job.job.write_text("{}")
    assert len(incident.listeners(job.node(0))) == 1
    assert incident.listeners(tmp_path / "train-20261206") == ()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
PART_KEYS = st.sampled_from(["node", "ts", "silent_s", "ranks", "incident", "rank", "pid", "waiting", "doing"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(PART_KEYS, JSON, max_size=6) | JSON, max_size=5))
def test_parts_of_any_shape_make_a_verdict_without_an_exception(tmp_path_factory: Any, parts: List[Any]) -> None:
    """A part is run-directory input: whatever a folder holds, the verdict is made, and it is JSON."""
    job = JobDir(tmp_path_factory.mktemp("job"))
    folder = job.incident_part.directory
    folder.mkdir()
    for number, value in enumerate(parts):
        (folder / f"0-1-{number}.json").write_text(json.dumps(value))
    found = verdict(incident.read_parts(job))
    json.dumps(found)
    assert found["first_silent"] is None or isinstance(found["first_silent"]["rank"], int)
