"""trainbox.rundir.safe against every hostile kind of entry (tests/rundir/hostile.py), at a file's place and at a
folder's, and Hypothesis properties: no read raises or runs away, no write lands outside the run directory."""

from __future__ import annotations

import ast
import errno
import os
import re
import resource
import signal
import stat
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from tests.rundir import hostile
from tests.rundir.hostile import KINDS, Kind, Scene, assert_bounded, plant, put, scene
from trainbox.rundir.layout import RunDir
from trainbox.rundir.safe import Open, Refusal, RunFiles, names, temporaries

#: Generous bounds for a few operations on one hostile entry: a correct one takes milliseconds and a few MiB;
#: a FIFO opened the blocking way never returns, and a 1 GiB file read whole needs 1 GiB.
SECONDS = 20.0
MIB = 64.0
#: The read limit the tests use: below the precious checkpoint (100,000 bytes) and the sparse file.
LIMIT = 64 * 1024
#: read_objects' limits in the tests: a line, the newest bytes, the records.
OBJECT_LIMITS = (4096, LIMIT, 1000)
#: What trainbox may delete in the tests: the rank files and their leftover temporary files.
RANK_FILES = names("rank-<rank>.json")
#: Hypothesis examples per property: each makes a scene (a temporary folder) and some fork a child.
EXAMPLES = 60

#: What reading (or opening for a write) refuses in place of a file; None: a regular file (read, bounded).
AT_A_FILE: Dict[Kind, Optional[Refusal]] = {
    Kind.SYMLINK_TO_FILE: Refusal.SYMLINK,
    Kind.SYMLINK_TO_FOLDER: Refusal.SYMLINK,
    Kind.DANGLING_SYMLINK: Refusal.SYMLINK,
    Kind.SYMLINK_LOOP: Refusal.SYMLINK,
    Kind.HARD_LINK: None,
    Kind.FIFO: Refusal.FIFO,
    Kind.FOLDER: Refusal.DIRECTORY,
    Kind.SOCKET: Refusal.SOCKET,
    Kind.DEVICE: Refusal.DEVICE,
    Kind.SPARSE: None,
}
#: What a path through each kind, as a folder, is refused for (a FOLDER is a real folder: nothing).
AT_A_FOLDER: Dict[Kind, Optional[Refusal]] = {
    **AT_A_FILE,
    Kind.HARD_LINK: Refusal.NOT_A_DIRECTORY,
    Kind.SPARSE: Refusal.NOT_A_DIRECTORY,
    Kind.FOLDER: None,
}


def kind_ids(kind: Kind) -> str:
    return kind.name.lower()


@pytest.fixture
def hostile_scene() -> Iterator[Scene]:
    with scene() as made:
        yield made


def _in_a_child(check: Any) -> None:
    """Run ``check`` bounded (a FIFO opened the blocking way would hang it: it is killed, the test fails)."""
    assert_bounded(check, SECONDS, MIB)


# -- in place of a file -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_reads_take_only_a_regular_file_bounded_and_never_block(hostile_scene: Scene, kind: Kind) -> None:
    plant(hostile_scene.run / "heartbeat.json", kind, hostile_scene.outside)
    files = RunFiles(hostile_scene.run)
    refused = AT_A_FILE[kind]

    def reads() -> None:
        whole, tail = files.read_bytes("heartbeat.json", LIMIT), files.read_tail("heartbeat.json", LIMIT)
        parsed, lines = files.read_object("heartbeat.json", LIMIT), files.read_objects("heartbeat.json", *OBJECT_LIMITS)
        if refused is not None:
            assert [whole.refused, tail.refused, parsed.refused, lines.refused] == [refused] * 4
            assert whole.value is tail.value is parsed.value is lines.value is None
        else:  # a regular file larger than the limits: refused whole, read in part
            assert whole.refused is parsed.refused is Refusal.TOO_LARGE
            assert tail.value is not None and len(tail.value) == LIMIT and tail.truncated
            assert lines.value == [] and lines.truncated

    _in_a_child(reads)
    hostile_scene.assert_outside_intact()


@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_stat_says_what_is_there_without_following_a_link(hostile_scene: Scene, kind: Kind) -> None:
    plant(hostile_scene.run / "train" / "weights" / "last.pt", kind, hostile_scene.outside)
    found = RunFiles(hostile_scene.run).stat(hostile_scene.run / "train" / "weights" / "last.pt")
    if kind is Kind.FOLDER:
        assert found.value is not None and stat.S_ISDIR(found.value.st_mode)
    elif AT_A_FILE[kind] is None:
        assert found.value is not None and stat.S_ISREG(found.value.st_mode)
    else:
        assert found.value is None and found.refused is AT_A_FILE[kind]


@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_replace_puts_a_new_file_in_place_of_anything_but_a_folder(hostile_scene: Scene, kind: Kind) -> None:
    target = hostile_scene.run / "state.json"
    plant(target, kind, hostile_scene.outside)
    files = RunFiles(hostile_scene.run)

    def replace() -> None:
        refusal = files.replace("state.json", b'{"state": "running"}')
        if kind is Kind.FOLDER:
            assert refusal is Refusal.DIRECTORY and (target / "inside.txt").read_text() == "a folder's own file\n"
        else:  # the rename replaced the entry itself: a link's target, a hard link's other name are untouched
            assert refusal is None and stat.S_ISREG(target.lstat().st_mode) and target.read_bytes() == b'{"state": "running"}'
        assert not [p for p in os.listdir(hostile_scene.run) if p.endswith(".tmp")], "a temporary file left behind"

    _in_a_child(replace)
    hostile_scene.assert_outside_intact()


@pytest.mark.parametrize("how", list(Open), ids=lambda how: how.name.lower())
@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_appending_truncating_and_locking_take_only_a_lone_regular_file(hostile_scene: Scene, kind: Kind, how: Open) -> None:
    target = hostile_scene.run / "supervisor.lock"
    plant(target, kind, hostile_scene.outside)
    files = RunFiles(hostile_scene.run)
    refused = Refusal.HARD_LINKED if kind is Kind.HARD_LINK else AT_A_FILE[kind]

    def opens() -> None:
        opened = files.open_fd("supervisor.lock", how)
        assert opened.refused is refused
        if opened.value is not None:
            os.close(opened.value)
            assert target.stat().st_size == (0 if how is Open.TRUNCATE else hostile.SPARSE_BYTES)
        if how is Open.APPEND:
            assert files.append("supervisor.lock", b"{}\n") is refused

    _in_a_child(opens)
    hostile_scene.assert_outside_intact()


@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_remove_unlinks_the_entry_itself_and_leaves_a_folder_alone(hostile_scene: Scene, kind: Kind) -> None:
    target = hostile_scene.run / "heartbeats" / "rank-0.json"
    plant(target, kind, hostile_scene.outside)
    refusal = RunFiles(hostile_scene.run).remove(target, RANK_FILES)
    if kind is Kind.FOLDER:
        assert refusal is Refusal.DIRECTORY and (target / "inside.txt").exists()
    else:
        assert refusal is None and not os.path.lexists(target)
    hostile_scene.assert_outside_intact()


# -- in place of a folder -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS, ids=kind_ids)
def test_no_operation_goes_through_anything_but_a_real_folder(hostile_scene: Scene, kind: Kind) -> None:
    plant(hostile_scene.run / "heartbeats", kind, hostile_scene.outside)
    files = RunFiles(hostile_scene.run)
    refused = AT_A_FOLDER[kind]

    def operations() -> None:
        rank = "heartbeats/rank-0.json"
        assert files.list_dir("heartbeats", 100).refused is refused
        assert files.clear("heartbeats", RANK_FILES).refused is refused
        assert files.make_dirs("heartbeats/old") is refused
        assert files.replace(rank, b"{}") is refused
        assert files.append(rank, b"{}\n") is refused
        opened = files.open_fd(rank, Open.LOCK)
        assert opened.refused is refused
        if opened.value is not None:
            os.close(opened.value)
        assert files.rename(rank, "moved.json") is refused
        if refused is not None:
            assert files.read_object(rank, LIMIT).refused is refused
            assert files.stat(rank).refused is refused
            assert files.remove(rank, RANK_FILES) is refused

    _in_a_child(operations)
    hostile_scene.assert_outside_intact()


def test_a_linked_logs_folder_is_never_written_through(hostile_scene: Scene) -> None:
    """Issue 33 item 1: ``logs -> ../../elsewhere`` made the host save a container's output there."""
    elsewhere = os.path.relpath(hostile_scene.outside.folder, hostile_scene.run)  # ../../outside/precious
    (hostile_scene.run / "logs").symlink_to(elsewhere)
    files = RunFiles(hostile_scene.run)
    assert files.stat("logs/container-0.log").refused is Refusal.SYMLINK  # "is the name taken?"
    assert files.replace("logs/container-0.log", iter([b"output ", b"of a container\n"])) is Refusal.SYMLINK
    assert files.append("logs/attempt-0.log", b"child output\n") is Refusal.SYMLINK
    assert files.make_dirs("logs/sub") is Refusal.SYMLINK
    hostile_scene.assert_outside_intact()


def test_a_linked_heartbeats_folder_is_not_emptied(hostile_scene: Scene) -> None:
    """Issue 33 item 2: ``heartbeats -> ../precious`` holding ``best.pt`` was emptied by the attempt's cleanup."""
    (hostile_scene.run / "heartbeats").symlink_to(os.path.relpath(hostile_scene.outside.folder, hostile_scene.run))
    files = RunFiles(hostile_scene.run)
    cleared = files.clear("heartbeats", re.compile(".*"))  # even an allow-list that takes every name
    assert cleared.refused is Refusal.SYMLINK and cleared.removed == 0
    assert files.remove("heartbeats/best.pt", re.compile(".*")) is Refusal.SYMLINK
    hostile_scene.assert_outside_intact()


def test_a_link_deeper_in_the_path_is_refused_too(hostile_scene: Scene) -> None:
    (hostile_scene.run / "train").mkdir()
    (hostile_scene.run / "train" / "weights").symlink_to(hostile_scene.outside.folder)
    files = RunFiles(hostile_scene.run)
    assert files.read_bytes("train/weights/best.pt", 1 << 20).refused is Refusal.SYMLINK
    assert files.replace("train/weights/midepoch.pt", b"x") is Refusal.SYMLINK
    assert files.remove("train/weights/best.pt", names("best.pt")) is Refusal.SYMLINK
    hostile_scene.assert_outside_intact()


def test_a_lock_through_a_link_is_refused_and_its_target_kept(hostile_scene: Scene) -> None:
    """Issue 33 item 3: a ``supervisor.lock`` link to ``last.pt`` left 4 bytes of it, holding a pid."""
    lock = hostile_scene.run / "supervisor.lock"
    lock.symlink_to(hostile_scene.outside.checkpoint)
    assert RunFiles(hostile_scene.run).open_fd(lock, Open.LOCK).refused is Refusal.SYMLINK
    lock.unlink()
    os.link(hostile_scene.outside.checkpoint, lock)  # what O_NOFOLLOW cannot see
    assert RunFiles(hostile_scene.run).open_fd(lock, Open.LOCK).refused is Refusal.HARD_LINKED
    assert hostile_scene.outside.checkpoint.stat().st_size == hostile.PRECIOUS_BYTES
    hostile_scene.assert_outside_intact()


def test_a_file_where_a_folder_belongs_is_refused(hostile_scene: Scene) -> None:
    put(hostile_scene.run / "logs", b"not a folder")
    files = RunFiles(hostile_scene.run)
    assert files.replace("logs/attempt-0.log", b"x") is Refusal.NOT_A_DIRECTORY
    assert files.read_bytes("logs/attempt-0.log", LIMIT).refused is Refusal.NOT_A_DIRECTORY
    assert (hostile_scene.run / "logs").read_bytes() == b"not a folder"


# -- bounded reads ----------------------------------------------------------------------------------------------
def test_a_sparse_gigabyte_is_never_read_whole(hostile_scene: Scene) -> None:
    plant(hostile_scene.run / "events.jsonl", Kind.SPARSE, hostile_scene.outside)
    files = RunFiles(hostile_scene.run)

    def reads() -> None:
        assert files.read_bytes("events.jsonl", 1 << 20).refused is Refusal.TOO_LARGE
        assert files.read_tail("events.jsonl", 1 << 20).value == bytes(1 << 20)
        history = files.read_objects("events.jsonl", 1 << 20, 8 << 20, 1000)
        assert history.value == [] and history.skipped == 0 and history.truncated  # its only line is the one cut

    bounded = assert_bounded(reads, SECONDS, MIB)
    assert bounded.peak_mib < MIB


def test_read_objects_skips_and_counts_what_is_not_an_object(hostile_scene: Scene) -> None:
    """Issue 33 item 7's lines (``[1]``, 100,000 ``[``, a byte 0xe9) and an overlong, a blank and a torn line."""
    lines = [b'{"event": "start"}', b"[1]", hostile.DEEP_JSON, b"\xe9", b"", b'{"x": "' + b"y" * 5000 + b'"}']
    put(hostile_scene.run / "events.jsonl", b"\n".join(lines + [b'{"event": "exit"}', b'{"event": "to']))
    got = RunFiles(hostile_scene.run).read_objects("events.jsonl", 4096, 1 << 20, 1000)
    assert got.value == [{"event": "start"}, {"event": "exit"}]
    assert got.skipped == 5 and not got.truncated and got.refused is None


def test_read_objects_keeps_the_newest_records_when_over_its_limits(hostile_scene: Scene) -> None:
    put(hostile_scene.run / "progress.jsonl", b"".join(b'{"step": %d}\n' % step for step in range(1000)))
    files = RunFiles(hostile_scene.run)
    by_records = files.read_objects("progress.jsonl", 100, 1 << 20, 10)
    assert by_records.value == [{"step": step} for step in range(990, 1000)] and by_records.truncated
    by_bytes = files.read_objects("progress.jsonl", 100, 100, 1000)  # 100 bytes: the cut line is dropped
    assert by_bytes.value and by_bytes.value[-1] == {"step": 999} and len(by_bytes.value) < 10 and by_bytes.truncated


def test_read_bytes_from_an_offset_reads_what_came_after(hostile_scene: Scene) -> None:
    """``health`` reads a stack dump from the size it had before it asked for one."""
    put(hostile_scene.run / "stacks" / "42.txt", b"old dump\nnew dump\n")
    got = RunFiles(hostile_scene.run).read_bytes("stacks/42.txt", 9, start=9)
    assert got.value == b"new dump\n"


def test_numbers_too_long_to_parse_cheaply_are_not_json(hostile_scene: Scene) -> None:
    put(hostile_scene.run / "heartbeat.json", b'{"step": ' + b"9" * 5000 + b"}")
    assert RunFiles(hostile_scene.run).read_object("heartbeat.json", LIMIT).refused is Refusal.NOT_JSON


# -- writes -----------------------------------------------------------------------------------------------------
def test_replace_makes_the_missing_folders_keeps_the_mode_and_streams_chunks(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "new"
    files = RunFiles(run)
    assert files.replace(run / "logs" / "container-0.log", iter([b"a", b"b"])) is None
    assert (run / "logs" / "container-0.log").read_bytes() == b"ab"
    (run / "logs" / "container-0.log").chmod(0o600)
    assert files.replace("logs/container-0.log", b"c", mode=None) is None
    assert stat.S_IMODE((run / "logs" / "container-0.log").stat().st_mode) == 0o600


def test_replace_removes_its_temporary_file_when_the_data_fails(tmp_path: Path) -> None:
    def broken() -> Any:
        yield b"half"
        raise ConnectionError("the engine went away")

    with pytest.raises(ConnectionError):
        RunFiles(tmp_path).replace("logs/container-0.log", broken())
    assert os.listdir(tmp_path / "logs") == []


def test_a_full_disk_is_raised_not_refused(tmp_path: Path) -> None:
    """The machine's errors reach the caller (the supervisor's DiskFull path): a file-size limit stands in."""

    def write_past_the_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        with pytest.raises(OSError) as raised:
            RunFiles(tmp_path).append("events.jsonl", b"x" * 100)
        assert raised.value.errno == errno.EFBIG
        with pytest.raises(OSError):
            RunFiles(tmp_path).replace("state.json", b"x" * 100)
        assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []

    assert_bounded(write_past_the_limit, SECONDS, MIB)


def test_rename_moves_a_staging_folder_and_never_replaces(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert files.replace("incidents/.20261123155507-0.partial/summary.json", b"{}") is None
    assert files.rename("incidents/.20261123155507-0.partial", "incidents/20261123155507-0") is None
    assert (tmp_path / "incidents" / "20261123155507-0" / "summary.json").read_bytes() == b"{}"
    assert files.make_dirs("incidents/.again.partial") is None
    assert files.rename("incidents/.again.partial", "incidents/20261123155507-0") is Refusal.EXISTS


def test_clear_removes_trainbox_names_and_reports_the_rest(hostile_scene: Scene) -> None:
    heartbeats = hostile_scene.run / "heartbeats"
    for name in ("rank-0.json", "rank-1.json", ".rank-1.json.k2j4x_9a.tmp", "notes.txt"):
        put(heartbeats / name, b"{}")
    plant(heartbeats / "rank-2.json", Kind.SYMLINK_TO_FILE, hostile_scene.outside)
    plant(heartbeats / "rank-3.json", Kind.FOLDER, hostile_scene.outside)
    plant(heartbeats / "old", Kind.FOLDER, hostile_scene.outside)
    cleared = RunFiles(hostile_scene.run).clear("heartbeats", RANK_FILES)
    assert cleared.removed == 4 and cleared.refused is None
    assert cleared.left == {"notes.txt": Refusal.NOT_ALLOWED, "old": Refusal.NOT_ALLOWED, "rank-3.json": Refusal.DIRECTORY}
    assert sorted(os.listdir(heartbeats)) == ["notes.txt", "old", "rank-3.json"]
    assert (heartbeats / "old" / "inside.txt").exists()
    hostile_scene.assert_outside_intact()


@pytest.mark.parametrize("name", ["best.pt", "rank-1.json.bak", "rank-x.json", "Rank-1.json", ".rank-1.json.short.tmp"])
def test_remove_refuses_a_name_trainbox_does_not_write(hostile_scene: Scene, name: str) -> None:
    put(hostile_scene.run / "heartbeats" / name, b"keep")
    assert RunFiles(hostile_scene.run).remove(f"heartbeats/{name}", RANK_FILES) is Refusal.NOT_ALLOWED
    assert (hostile_scene.run / "heartbeats" / name).read_bytes() == b"keep"


def test_names_takes_rundirs_documented_names_and_their_temporary_files() -> None:
    pattern = names("rank-<rank>.json", "heartbeat.json")
    assert all(pattern.fullmatch(n) for n in ["rank-0.json", "rank-12.json", "heartbeat.json", ".heartbeat.json.a_b1c2d3.tmp"])
    assert not any(pattern.fullmatch(n) for n in ["rank-.json", "rank-1xjson", "heartbeat.json.tmp", "../rank-1.json"])


# -- paths --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["..", "../outside/file.txt", "logs/../../outside/file.txt", "/etc/passwd", "", ".", "a\0b"])
def test_a_path_outside_the_run_directory_is_refused(hostile_scene: Scene, path: str) -> None:
    files = RunFiles(hostile_scene.run)
    assert files.read_bytes(path, LIMIT).refused is Refusal.BAD_PATH
    assert files.replace(path, b"x") is Refusal.BAD_PATH
    assert files.append(path, b"x") is Refusal.BAD_PATH
    assert files.remove(path, re.compile(".*")) is Refusal.BAD_PATH
    hostile_scene.assert_outside_intact()


@pytest.mark.parametrize("root", ["runs/trainbox", "runs/trainbox/", "./runs//trainbox"])
def test_rundirs_paths_under_a_relative_root_are_its_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    monkeypatch.chdir(tmp_path)
    run = RunDir(Path(root))
    files = RunFiles(root)
    assert files.replace(run.rank_heartbeat(3), b"{}") is None
    assert (tmp_path / "runs" / "trainbox" / "heartbeats" / "rank-3.json").read_bytes() == b"{}"
    assert files.list_dir(run.root, 10).value == ["heartbeats"]
    assert files.read_object(run.rank_heartbeat(3), LIMIT).value == {}


def test_a_name_too_long_is_refused_not_raised(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert files.read_bytes("x" * 300, LIMIT).refused is Refusal.BAD_PATH
    assert files.replace("x" * 300, b"x") is Refusal.BAD_PATH


def test_a_refusal_reads_as_one_line() -> None:
    assert Refusal.SYMLINK.line("runs/a/logs") == "runs/a/logs: a symbolic link, refused"
    assert Refusal.MISSING.line("heartbeat.json") == "heartbeat.json: missing"


# -- properties -----------------------------------------------------------------------------------------------------
#: Where readers look (RunDir's names): a hostile entry is planted at one of these or at its folder.
READ_PATHS = ("heartbeat.json", "heartbeats/rank-0.json", "events.jsonl", "incidents/20261123155507-0/summary.json")
#: Path parts a writer may be handed by a confused caller: climbs, links, folders, a NUL.
PATH_PARTS = ("..", ".", "", "logs", "heartbeats", "link", "x.json", "a\0b")


def _check_reads(files: RunFiles, path: str) -> None:
    """Every read of ``path`` returns a consistent answer (value exactly when not refused, objects are dicts)."""
    answers: List[Any] = [
        files.read_bytes(path, LIMIT),
        files.read_tail(path, LIMIT),
        files.read_object(path, LIMIT),
        files.read_objects(path, *OBJECT_LIMITS),
        files.stat(path),
        files.list_dir(path, 100),
    ]
    for got in answers:
        assert (got.value is None) == (got.refused is not None), got
    parsed, lines = answers[2], answers[3]
    assert parsed.value is None or isinstance(parsed.value, dict)
    assert lines.value is None or all(isinstance(record, dict) for record in lines.value)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=st.one_of(hostile.kinds(), hostile.file_bytes()), where=st.sampled_from(READ_PATHS), at_folder=st.booleans())
def test_every_read_of_any_content_or_kind_returns_bounded(entry: Any, where: str, at_folder: bool) -> None:
    with scene() as made:
        target = made.run / where
        target = target.parent if at_folder and target.parent != made.run else target
        if isinstance(entry, Kind):
            plant(target, entry, made.outside)
        else:
            put(target, entry)
        files = RunFiles(made.run)
        assert_bounded(lambda: _check_reads(files, where), SECONDS, MIB)
        made.assert_outside_intact()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(PATH_PARTS), min_size=1, max_size=4),
    absolute=st.booleans(),
    logs=hostile.kinds(),
)
def test_no_write_with_any_path_lands_outside(parts: List[str], absolute: bool, logs: Kind) -> None:
    with scene() as made:
        plant(made.run / "logs", logs, made.outside)
        (made.run / "link").symlink_to(made.outside.folder)
        path = ("/" if absolute else "") + "/".join(parts)
        files = RunFiles(made.run)
        everything = re.compile(".*", re.S)

        def writes() -> None:
            if files.replace(path, b"new") is None:
                assert os.path.realpath(made.run / path).startswith(os.path.realpath(made.run) + os.sep)
            files.append(path, b"line\n")
            files.make_dirs(path)
            opened = files.open_fd(path, Open.TRUNCATE)
            if opened.value is not None:
                os.close(opened.value)
            files.remove(path, everything)
            files.clear(path, everything)

        assert_bounded(writes, SECONDS, MIB)
        made.assert_outside_intact()


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.binary(max_size=hostile.MAX_FILE_BYTES), cut=st.integers(min_value=0))
def test_replace_then_read_gives_back_the_bytes(data: bytes, cut: int) -> None:
    with scene() as made:
        files = RunFiles(made.run)
        chunks = iter([data[: cut % (len(data) + 1)], data[cut % (len(data) + 1) :]])
        assert files.replace("train/args.yaml", chunks, fsync=False) is None
        assert files.read_bytes("train/args.yaml", len(data)).value == data
        assert files.read_tail("train/args.yaml", 7).value == data[-7:]


#: Lines that are never a JSON object: invalid UTF-8, JSON of another shape, the hostile blobs without line breaks.
NOT_OBJECTS = st.one_of(
    st.binary(max_size=32).map(lambda raw: b"\xff" + raw.replace(b"\n", b"")),
    hostile.json_values(allow_nan=False).filter(lambda value: not isinstance(value, dict)).map(hostile.dumps),
    st.sampled_from([blob for blob in hostile.HOSTILE_BLOBS if b"\n" not in blob and not blob.startswith(b'{"')]),
)

#: Objects with some of events.jsonl's own fields, each of any shape (no NaN: it is not equal to itself).
EVENT_LIKE = hostile.json_objects(("ts", "event", "attempt"), allow_nan=False)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(EVENT_LIKE, NOT_OBJECTS), min_size=1, max_size=20))
def test_appended_objects_come_back_in_order_and_the_rest_is_counted(lines: List[Any]) -> None:
    with scene() as made:
        files = RunFiles(made.run)
        for line in lines:
            assert files.append("events.jsonl", (hostile.dumps(line) if isinstance(line, dict) else line) + b"\n") is None
        got = files.read_objects("events.jsonl", 1 << 20, 1 << 24, 1000)
        assert got.value == [line for line in lines if isinstance(line, dict)]
        assert got.skipped == sum(1 for line in lines if not isinstance(line, dict) and line.strip())


# -- the rule for the whole code base: nothing else opens a run-directory path ------------------------------------
#: Calls that open, create, read, write, list or delete a path (pathlib's methods, os/shutil's functions,
#: trainbox.atomic's writers). ``x.stat()`` and friends on a RunFiles are its own safe operations: a RunFiles is
#: always named ``files`` (``run.files``, ``self.files``), and calls on that name are not file operations here.
PATH_METHODS = frozenset(
    {
        "open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "mkdir", "rmdir", "iterdir", "glob",
        "rglob", "touch", "symlink_to", "hardlink_to", "is_dir", "is_file", "exists", "stat", "lstat", "rename",
        "chmod",
    }
)  # fmt: skip
PATH_FUNCTIONS = frozenset(
    {
        "open", "os.open", "os.rename", "os.replace", "os.remove", "os.unlink", "os.listdir", "os.scandir",
        "os.makedirs", "os.mkdir", "os.rmdir", "os.stat", "os.lstat", "os.path.exists", "os.path.isdir",
        "os.path.isfile", "shutil.rmtree", "shutil.copyfile", "shutil.copy", "shutil.move", "write_text_atomic",
        "atomic_writer", "fsync_path", "remove_stale_temps", "torch.save", "torch_load",
    }
)  # fmt: skip
#: What a line that uses a path directly says, and why, after it: the path is not the run directory's (a dataset,
#: the run directory's root, which is the user's own), or the run-directory file was checked by trainbox.rundir.safe
#: just before (a checkpoint that ``torch.load`` must open by path, found to be a regular file reached without a link).
EXCEPTION_MARKS = ("not the run directory:", "run directory, checked:")
#: Modules that are handed run-directory paths without importing trainbox.rundir (the network guard's log).
HANDED_RUN_PATHS = ("yolo.offline",)


def _dotted(node: ast.AST) -> str:
    """``os.path.exists`` for the expression ``os.path.exists``; "" for anything that is not a plain name chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _file_operation(call: ast.Call) -> Optional[str]:
    """The file operation ``call`` is, or None."""
    name = _dotted(call.func)
    if name in PATH_FUNCTIONS:
        return name
    if isinstance(call.func, ast.Attribute) and call.func.attr in PATH_METHODS:
        receiver = _dotted(call.func.value)
        if receiver == "files" or receiver.endswith(".files") or receiver in ("os", "shutil", "json", "yaml", "io"):
            return None
        return f".{call.func.attr}()"
    return None


def _in_scope(dotted: str, source: str) -> bool:
    return dotted in HANDED_RUN_PATHS or "trainbox.rundir" in source or "trainbox import heartbeat" in source


def test_nothing_but_rundir_safe_opens_a_run_directory_path() -> None:
    """Issue 33's rule: in every module that names run-directory paths, each file operation goes through
    trainbox.rundir.safe, or its line says why it may be direct (:data:`EXCEPTION_MARKS`)."""
    package = REPO / "train"
    found = []
    for path in sorted(package.rglob("*.py")):
        dotted = ".".join(path.relative_to(package).with_suffix("").parts)
        source = path.read_text()
        if dotted == "rundir.safe" or not _in_scope(dotted, source):
            continue
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            operation = _file_operation(node) if isinstance(node, ast.Call) else None
            if operation is None:
                continue
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            comments = [lines[n - 1].partition("#")[2] for n in span]
            if not any(mark in comment for mark in EXCEPTION_MARKS for comment in comments):
                found.append(f"train/{path.relative_to(package)}:{node.lineno}: {operation}")
    assert not found, "file operations outside trainbox.rundir.safe:\n" + "\n".join(found)


def test_move_over_replaces_a_file_or_a_link_never_a_folder(hostile_scene: Scene) -> None:
    """A staged checkpoint renamed over ``last.pt``: a link there is replaced, not written through."""
    files = RunFiles(hostile_scene.run)
    weights = hostile_scene.run / "train" / "weights"
    assert files.replace(weights / ".staging" / "last.pt", b"new") is None
    plant(weights / "last.pt", Kind.SYMLINK_TO_FILE, hostile_scene.outside)
    assert files.move_over(weights / ".staging" / "last.pt", weights / "last.pt") is None
    assert (weights / "last.pt").read_bytes() == b"new" and not (weights / "last.pt").is_symlink()
    assert files.replace(weights / ".staging" / "best.pt", b"x") is None
    plant(weights / "best.pt", Kind.FOLDER, hostile_scene.outside)
    assert files.move_over(weights / ".staging" / "best.pt", weights / "best.pt") is Refusal.DIRECTORY
    hostile_scene.assert_outside_intact()


def test_remove_folder_takes_only_an_empty_folder_of_its_name(hostile_scene: Scene) -> None:
    files = RunFiles(hostile_scene.run)
    own = re.compile(r"\.x\.partial")
    assert files.make_dirs("incidents/.x.partial/stacks") is None
    assert files.remove_folder("incidents/.x.partial", own) is Refusal.DIRECTORY, "not empty"
    assert files.remove_folder("incidents/.x.partial/stacks", names("stacks")) is None
    assert files.remove_folder("incidents/.x.partial", own) is None and not (hostile_scene.run / "incidents/.x.partial").exists()
    plant(hostile_scene.run / "incidents" / ".x.partial", Kind.SYMLINK_TO_FOLDER, hostile_scene.outside)
    assert files.remove_folder("incidents/.x.partial", own) is Refusal.SYMLINK
    assert files.remove_folder("incidents/other", own) is Refusal.NOT_ALLOWED
    hostile_scene.assert_outside_intact()


def test_temporaries_are_the_leftovers_and_not_the_file(hostile_scene: Scene) -> None:
    leftovers = b"{}"
    weights = hostile_scene.run / "train" / "weights"
    for name in ("midepoch.pt", ".midepoch.pt.k2j4x_9a.tmp", ".midepoch.pt.short.tmp"):
        put(weights / name, leftovers)
    cleared = RunFiles(hostile_scene.run).clear(weights, temporaries("midepoch.pt"))
    assert cleared.removed == 1 and sorted(os.listdir(weights)) == [".midepoch.pt.short.tmp", "midepoch.pt"]


def test_a_span_and_a_streamed_write(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert files.replace_with("stacks/42.txt", lambda handle: handle.write(b"old dump\nnew dump\n")) is None
    assert files.read_span("stacks/42.txt", 9, 4).value == b"new " and files.read_span("stacks/42.txt", 9, 4).truncated
    assert files.read_span("stacks/42.txt", 9, 100).value == b"new dump\n"
