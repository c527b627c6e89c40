"""A job's status and report: every node in one table, and the rank the others wait for.

The node directories here are written as a supervisor writes them (state.json, events.jsonl, a rank's heartbeat);
``tests/slurm/`` shows the same table for a real two-node job on a real Slurm cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.view import job as job_view
from trainbox.view import metrics


def node(job: JobDir, number: int, state: dict, *events: dict, rank: int) -> None:
    run = RunDir(job.node(number))
    run.rank_heartbeat.directory.mkdir(parents=True)
    run.state.write_text(json.dumps(state))
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    run.rank_heartbeat(rank).write_text(json.dumps({"rank": rank, "step": 40, "ts": 1_700_000_000.5, "pid": 7}))


def make_job(tmp_path: Path) -> JobDir:
    job = JobDir(tmp_path / "train-4242")
    job.root.mkdir()
    job.job.write_text(json.dumps({"job_id": "4242", "nnodes": 2, "nodelist": "n[1-2]", "restart_count": 1}))
    start = {"event": "start", "attempt": 0, "ts": 1.0}
    node(
        job,
        0,
        {"state": "running", "attempt": 1, "silent_s": 3.2, "heartbeat": {"step": 40}},
        start,
        dict(start, attempt=1),
        rank=0,
    )
    stall = {"event": "stall", "attempt": 0, "ts": 2.0, "cause": "idle", "evidence": ["x"]}
    node(job, 1, {"state": "running", "attempt": 1, "silent_s": 75.0, "heartbeat": {"step": 38}}, start, stall, rank=1)
    job.incident.write_text(
        json.dumps({"ts": 1_700_000_000, "why": "rank 1 on node 1 stopped in t.py:hang; 1 other rank(s) wait for it"})
    )
    return job


def test_status_of_a_job_shows_every_node_and_the_rank_the_others_wait_for(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", "status", "--run-dir", str(job.root)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "job 4242: 2 nodes (n[1-2]) requeued 1 time(s)"
    assert lines[2].split() == list(job_view.COLUMNS)
    assert lines[3].split()[:5] == ["0", "running", "2", "0", "step"] and "3s" in lines[3]
    assert lines[4].split()[:5] == ["1", "running", "1", "1", "step"] and "1m15s" in lines[4] and lines[4].split()[-1] == "1"
    assert lines[5].startswith("incident  rank 1 on node 1 stopped in t.py:hang")


def test_watching_a_job_is_one_line_naming_a_node(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    args = [sys.executable, "-m", "trainbox", "status", "--watch", "--run-dir", str(job.root)]
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "node-0" in done.stderr


def test_the_report_of_a_job_is_its_table_linking_each_nodes_report(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    done = subprocess.run([sys.executable, "-m", "trainbox", "report", str(job.root)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    page = job.report.read_text()
    assert '<a href="node-1/report.html">1</a>' in page and "rank 1 on node 1 stopped" in page


def test_metrics_carry_job_node_and_rank_labels(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    families = {f.name: f for f in metrics.collect(job.root, now=1_700_000_100.0)}
    steps = families["trainbox_state"].samples
    assert {(labels["job"], labels["node"]) for labels, _ in steps} == {("train-4242", "0"), ("train-4242", "1")}
    beats = families["trainbox_rank_last_beat_timestamp_seconds"].samples
    assert sorted((labels["node"], labels["rank"], value) for labels, value in beats) == [
        ("0", "0", 1_700_000_000.5),
        ("1", "1", 1_700_000_000.5),
    ]
    one_node = metrics.collect(job.node(1), now=1_700_000_100.0)
    assert all(labels["job"] == "train-4242" and labels["node"] == "1" for f in one_node for labels, _ in f.samples)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job_json=JSON, incident=JSON, names=st.lists(st.sampled_from(["node-0", "node-1", "node-x", "node-99"]), max_size=3))
def test_any_job_directory_renders(tmp_path: Path, job_json: Any, incident: Any, names: list) -> None:
    """job.json, incident.json and the node folders are untrusted: whatever they hold, status and the page render."""
    job = JobDir(tmp_path / f"job-{abs(hash((str(job_json), str(incident), tuple(names))))}")
    job.root.mkdir(exist_ok=True)
    job.job.write_text(json.dumps(job_json))
    job.incident.write_text(json.dumps(incident))
    for name in names:
        (job.root / name).mkdir(exist_ok=True)
    lines = job_view.render(job.root)
    assert lines[0].startswith("job ") and all(line.isprintable() for line in lines)
    job_view.html_page(job.root)
