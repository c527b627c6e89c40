"""The run directory: the table in docs/contract.md and ``RunDir`` name the same paths, and only RunDir spells them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

import trainbox.diagnose.incident
import trainbox.rundir.layout
from tests.paths import REPO
from trainbox.rundir.layout import IncidentDir, JobDir, RunDir


def documented_layout(heading: str = "## The run directory") -> List[str]:
    """The paths of a layout table of docs/contract.md (by default the section "The run directory")."""
    text = (REPO / "docs" / "contract.md").read_text()
    section = text[text.index(heading) :]
    table = section[section.index("| path | what |") :].split("\n\n", 1)[0]
    rows = table.splitlines()[2:]  # the header and its separator
    paths = [re.fullmatch(r"\| `([^`]+)` \| .+ \|", row) for row in rows]
    assert all(paths), f"unexpected row in the documented layout table: {rows}"
    return [match.group(1) for match in paths if match]


def test_the_documented_layout_table_is_rundirs_entries_both_ways() -> None:
    documented = documented_layout()
    named = [path for path, _ in RunDir.entries()]
    assert len(set(documented)) == len(documented), "a path listed twice in the documented table"
    assert len(set(named)) == len(named), "a path named twice in RunDir"
    assert not set(documented) - set(named), f"in the documented table but not in RunDir: {set(documented) - set(named)}"
    assert not set(named) - set(documented), f"in RunDir but not in the documented table: {set(named) - set(documented)}"


def test_the_documented_job_directory_table_is_jobdirs_entries_in_order() -> None:
    assert documented_layout("## The job directory") == [path for path, _ in JobDir.entries()]


def test_a_job_directory_names_its_nodes_and_their_run_directories(tmp_path: Path) -> None:
    job = JobDir(tmp_path)
    for name in ("node-1", "node-0", "node-x", "node-12", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "node-3").write_text("a file is no node")
    assert job.nodes() == [0, 1, 12]
    assert RunDir(job.node(1)).events == tmp_path / "node-1" / "events.jsonl"
    assert job.incident_part(2, 20261206030405, 1) == tmp_path / "incidents" / "2-20261206030405-1.json"


def test_incident_docstring_lists_every_incident_file() -> None:
    doc = trainbox.diagnose.incident.__doc__ or ""
    missing = [path for path, _ in IncidentDir.entries() if f"``{path}``" not in doc]
    assert not missing, f"trainbox.diagnose.incident's docstring does not list {missing}"


def test_paths_and_numbered_paths_resolve_under_the_root(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.events == tmp_path / "events.jsonl"
    assert run.train == tmp_path / "train" and run.last_checkpoint == tmp_path / "train" / "weights" / "last.pt"
    assert run.attempt_log(3) == tmp_path / "logs" / "attempt-3.log"
    assert run.attempt_log.directory == tmp_path / "logs"
    assert run.stack_dump(4242) == tmp_path / "stacks" / "4242.txt"
    report = tmp_path / "incidents" / "20261123155507-2"
    assert run.incident_dir(20261123155507, 2) == report == run.incident(20261123155507, 2).root
    assert run.incident(20261123155507, 2).stack(7) == report / "stacks" / "7.txt"
    assert run.incident(20261123155507, 2).gpu == report / "gpu.txt"
    assert run.lock == tmp_path / "supervisor.lock"
    for path, _ in RunDir.entries() + IncidentDir.entries() + JobDir.entries():
        assert not path.startswith("/") and ".." not in path, path


def test_no_module_spells_a_run_directory_file_name_itself() -> None:
    """Every run-directory path in code goes through RunDir: no file name of it as a string, no folder of it joined."""
    parts = {
        part for path, _ in RunDir.entries() + IncidentDir.entries() + JobDir.entries() for part in path.strip("/").split("/")
    }
    files = sorted(p for p in parts if "." in p and "<" not in p)
    # "train" is also the source folder's name (bench/images.py edits train/__init__.py): only its files are checked.
    folders = sorted(p for p in parts if "." not in p and "<" not in p and p != "train")
    spelled = re.compile(
        "|".join([rf"[\"']{re.escape(name)}[\"']" for name in files] + [rf"/ [\"']{name}[\"']" for name in folders])
        + r"|attempt-\{"
    )
    sources = [*(REPO / "train").rglob("*.py"), *(REPO / "bench").glob("*.py")]
    found = [
        f"{source.relative_to(REPO)}: {match.group(0)}"
        for source in sources
        if source.resolve() != Path(trainbox.rundir.layout.__file__).resolve()
        for match in spelled.finditer(source.read_text())
    ]
    assert not found, "run-directory paths spelled outside trainbox.rundir.layout: " + ", ".join(found)


def test_a_new_session_never_reuses_the_name_of_an_existing_report(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    started = 1795449307.9  # 2026-11-23 15:55:07 UTC
    assert run.new_session(started) == 20261123155507
    run.incident_dir(20261123155507, 0).mkdir(parents=True)
    assert run.new_session(started) == 20261123155508, "a supervisor started in the same second gets the next one"


def test_a_numbered_name_gives_its_number_and_nothing_else_does(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.rank_heartbeat.number_of("rank-12.json") == 12 and run.container_log.number_of("container-3.log") == 3
    for name in ("rank-.json", ".rank-1.json.k2j4x_9a.tmp", "rank-1.json.bak", "rank--1.json", "old"):
        assert run.rank_heartbeat.number_of(name) is None, name


@pytest.mark.parametrize(
    "named, found",
    [
        ("/runs/r/incidents/20261123155507-0", "20261123155507-0"),
        ("20261123155507-0", "20261123155507-0"),
        ("..", None),
        ("/etc", None),
        ("incidents/20261123155507-0/../..", None),
        ("", None),
    ],
)
def test_a_stall_events_incident_is_found_here_by_its_folders_name_only(tmp_path: Path, named: str, found: object) -> None:
    report = RunDir(tmp_path).incident_named(named)
    assert (report.root.name if report else None) == found
    if report is not None:
        assert report.root.parent == RunDir(tmp_path).incident_dir.directory
