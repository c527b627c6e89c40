"""Hostile run-directory contents: the one kit every reader's and writer's tests use.

The run directory is written by the training child (and in a container by
whatever runs there), so every test of code that reads or writes it plants the
same things (issue 33): links (to a file outside, to a folder outside,
dangling, a loop), a hard link to a file outside, a FIFO, a folder, a socket, a
device, a 1 GiB sparse file; and as content arbitrary bytes, 100,000 ``[``,
invalid UTF-8 and JSON of every shape. NVIDIA's nvidia-resiliency-ext keeps its
faults in one injection module (``shared_utils/inject_fault.py``); this is the
same idea for files.

* :func:`plant` puts one :class:`Kind` at a path; :class:`Outside` is the
  world outside the run directory that nothing may touch (``precious/best.pt``
  and a file), with :meth:`Outside.assert_intact`; :func:`scene` makes both in
  a fresh temporary folder (Hypothesis examples cannot share pytest's ``tmp_path``).
* Hypothesis strategies: :func:`json_values`, :func:`json_objects` (aimed at a
  reader's own field names), :func:`file_bytes`, :func:`kinds`.
* :func:`assert_bounded` runs a reader in a forked child with an address-space
  limit and a time limit, and asserts it returned without an exception.

How memory is bounded: the child sets ``RLIMIT_AS`` to its own size at the
fork plus the bound, so an allocation past it fails (``MemoryError``) in the
child, which reports it; the figure returned is ``VmPeak`` at the end less
``VmSize`` at the start (Linux starts a forked child's peak at its own size).
tracemalloc was rejected: it sees only what goes through Python's allocator
(not C libraries' malloc nor mmap), enforces nothing (a runaway reader, such as
the 10**9-rank set of issue 33 item 6, would take the machine before the peak
were read), and slows the traced code severalfold, which would distort the time
bound. The child also isolates a reader that blocks (a FIFO opened without
``O_NONBLOCK``): it is killed at the time bound and the test fails instead of
hanging. Virtual size counts reservations that are never touched (thread
stacks, malloc arenas), so the bound is conservative; readers are single-threaded.

Limits: a device node needs ``CAP_MKNOD`` (root, or a default Docker
container): without it :data:`KINDS` leaves :attr:`Kind.DEVICE` out. Linux only
(``/proc/self/status``, ``mknod`` of a socket).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import resource
import select
import shutil
import signal
import stat
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Sequence, Tuple

from hypothesis import strategies as st

#: The size of the sparse file: large enough that reading it whole would be a failure anyone notices.
SPARSE_BYTES = 1 << 30
#: The precious checkpoint's size, as in issue 33 item 3 (a lock written through a link left 4 bytes of it).
PRECIOUS_BYTES = 100_000
#: Nesting that exceeds any recursive parser's limit (issue 33 item 7).
DEEP_JSON = b"[" * 100_000
#: A byte that is not UTF-8 on its own (issue 33 item 7: ``0xe9``, Latin-1's "é").
INVALID_UTF8 = b'{"phase": "d\xe9j\xe0"}'
#: Contents that broke or could break a reader: deep nesting, invalid UTF-8, a torn object, NUL bytes, a BOM,
#: UTF-16, an integer of 5,000 digits (quadratic to parse before CPython 3.11), NaN, a huge exponent.
HOSTILE_BLOBS: Tuple[bytes, ...] = (
    DEEP_JSON,
    b"{" * 100_000,
    b'{"a":' * 50_000,
    INVALID_UTF8,
    b"\xe9",
    b'{"ts": 1, "event": "start"',
    b"\x00" * 4096,
    b"\xef\xbb\xbf{}",
    '{"a": 1}'.encode("utf-16"),
    b"9" * 5000,
    b'{"n": ' + b"9" * 5000 + b"}",
    b'{"loss": NaN, "x": -Infinity}',
    b'{"x": 1e999999}',
    b"\n" * 10_000,
)
#: JSON values of every shape a field may hold instead of the one a reader expects.
JSON_SHAPES: Tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    10**30,
    1.5,
    float("inf"),
    "",
    "2/10",
    [],
    [1],
    {},
    {"a": None},
    [[[[]]]],
)
#: The most arbitrary bytes :func:`file_bytes` makes: room for every shape, small enough for many examples a second.
MAX_FILE_BYTES = 4096


class Kind(enum.Enum):
    """What can stand where a run-directory file or folder is expected."""

    SYMLINK_TO_FILE = "a link to a file outside"
    SYMLINK_TO_FOLDER = "a link to a folder outside"
    DANGLING_SYMLINK = "a link to nothing"
    SYMLINK_LOOP = "a link to itself"
    HARD_LINK = "a hard link to a file outside"
    FIFO = "a FIFO"
    FOLDER = "a folder holding a file"
    SOCKET = "a socket"
    DEVICE = "a character device (/dev/null's numbers)"
    SPARSE = "a 1 GiB sparse file"

    @property
    def is_link(self) -> bool:
        return self in (Kind.SYMLINK_TO_FILE, Kind.SYMLINK_TO_FOLDER, Kind.DANGLING_SYMLINK, Kind.SYMLINK_LOOP)


def _can_make_devices() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        try:
            os.mknod(os.path.join(folder, "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except OSError:
            return False
    return True


#: The kinds this machine can plant (a device needs CAP_MKNOD).
KINDS: Tuple[Kind, ...] = tuple(kind for kind in Kind if kind is not Kind.DEVICE or _can_make_devices())


@dataclass(frozen=True)
class Outside:
    """The world outside the run directory: ``precious/best.pt``, ``precious/notes.txt`` and ``file.txt``."""

    root: Path

    @property
    def folder(self) -> Path:
        return self.root / "precious"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "best.pt"

    @property
    def file(self) -> Path:
        return self.root / "file.txt"

    def create(self) -> Outside:
        self.folder.mkdir(parents=True)
        self.checkpoint.write_bytes(bytes(range(256)) * (PRECIOUS_BYTES // 256) + bytes(PRECIOUS_BYTES % 256))
        (self.folder / "notes.txt").write_text("keep me\n")
        self.file.write_text("outside the run directory\n")
        return self

    def snapshot(self) -> Dict[str, Tuple[str, bytes]]:
        """Every entry below the root, links not followed: (kind, content or link target)."""
        found: Dict[str, Tuple[str, bytes]] = {}
        for folder, folders, files in os.walk(self.root):
            for name in folders + files:
                path = Path(folder) / name
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    found[str(path.relative_to(self.root))] = ("link", os.fsencode(os.readlink(path)))
                elif stat.S_ISREG(info.st_mode):
                    found[str(path.relative_to(self.root))] = ("file", path.read_bytes())
                else:
                    found[str(path.relative_to(self.root))] = (stat.filemode(info.st_mode), b"")
        return found

    def assert_intact(self, before: Dict[str, Tuple[str, bytes]]) -> None:
        after = self.snapshot()
        assert after == before, f"outside the run directory changed: {sorted(set(after.items()) ^ set(before.items()))}"


@dataclass(frozen=True)
class Scene:
    """A run directory (``run``, empty) and the world outside it (its sibling ``outside``), with a snapshot."""

    run: Path
    outside: Outside
    before: Dict[str, Tuple[str, bytes]]

    def assert_outside_intact(self) -> None:
        self.outside.assert_intact(self.before)


@contextlib.contextmanager
def scene() -> Iterator[Scene]:
    """A fresh :class:`Scene` in a temporary folder, removed afterwards (links are removed, never followed)."""
    base = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        outside = Outside(base / "outside").create()
        run = base / "runs" / "trainbox"
        run.mkdir(parents=True)
        yield Scene(run, outside, outside.snapshot())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def plant(path: Path, kind: Kind, outside: Outside) -> None:
    """Put ``kind`` at ``path`` (which must not exist; its parent is made as a real folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind is Kind.SYMLINK_TO_FILE:
        path.symlink_to(outside.checkpoint)
    elif kind is Kind.SYMLINK_TO_FOLDER:
        path.symlink_to(os.path.relpath(outside.folder, path.parent))  # relative, as `logs -> ../../elsewhere`
    elif kind is Kind.DANGLING_SYMLINK:
        path.symlink_to(outside.root / "nowhere")
    elif kind is Kind.SYMLINK_LOOP:
        path.symlink_to(path.name)
    elif kind is Kind.HARD_LINK:
        os.link(outside.checkpoint, path)
    elif kind is Kind.FIFO:
        os.mkfifo(path)
    elif kind is Kind.FOLDER:
        path.mkdir()
        (path / "inside.txt").write_text("a folder's own file\n")
    elif kind is Kind.SOCKET:
        os.mknod(path, stat.S_IFSOCK | 0o600)  # no bind(): no 108-byte path limit, nothing to close
    elif kind is Kind.DEVICE:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    else:
        with open(path, "wb") as handle:
            handle.truncate(SPARSE_BYTES)


def put(path: Path, data: bytes) -> Path:
    """A regular file holding ``data`` (its parent made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- Hypothesis strategies --------------------------------------------------------------------------------
def json_values(max_leaves: int = 12, allow_nan: bool = True) -> st.SearchStrategy[Any]:
    """Any JSON value: scalars (NaN and infinities unless ``allow_nan`` is False), lists, objects, nested."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=allow_nan, allow_infinity=allow_nan),
        st.text(max_size=16),
        st.sampled_from(("", "2/10", "NaN", "0xe9")),  # strings where numbers belong
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=max_leaves,
    )


def json_objects(keys: Sequence[str] = (), allow_nan: bool = True) -> st.SearchStrategy[Dict[str, Any]]:
    """JSON objects whose fields are often a reader's own ``keys`` (``ts``, ``epoch``...) holding any shape."""
    names = (st.sampled_from(list(keys)) | st.text(max_size=8)) if keys else st.text(max_size=8)
    return st.dictionaries(names, json_values(allow_nan=allow_nan), max_size=8)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def file_bytes(keys: Sequence[str] = (), max_size: int = MAX_FILE_BYTES) -> st.SearchStrategy[bytes]:
    """What a run-directory file may hold: bytes, one JSON value or object, JSON Lines of any values
    (mixed with garbage lines), a torn copy of any of these, or one of :data:`HOSTILE_BLOBS`."""
    line = st.one_of(json_objects(keys).map(dumps), json_values().map(dumps), st.binary(max_size=64))
    whole = st.one_of(
        st.binary(max_size=max_size),
        json_values().map(dumps),
        st.sampled_from(JSON_SHAPES).map(dumps),
        json_objects(keys).map(dumps),
        st.lists(line, max_size=12).map(b"\n".join),
        st.sampled_from(HOSTILE_BLOBS),
    )
    return st.one_of(whole, st.tuples(whole, st.integers(min_value=0)).map(lambda torn: torn[0][: torn[1]]))


def kinds() -> st.SearchStrategy[Kind]:
    return st.sampled_from(KINDS)


# -- bounded execution ----------------------------------------------------------------------------------
#: How much of a child's traceback comes back (a RecursionError's is long; its head and end say enough).
TRACEBACK_CHARS = 4000


@dataclass(frozen=True)
class Bounded:
    """What a call in :func:`assert_bounded` took: wall seconds and the growth of its address space's peak."""

    seconds: float
    peak_mib: float


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _run_child(call: Callable[[], object], out: int, mib: float) -> NoReturn:
    """In the forked child: limit the address space, run ``call``, write what happened to ``out``, exit."""
    result: Dict[str, Any] = {"error": None}
    try:
        start_kib = _vm_kib("VmSize")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (start_kib * 1024 + int(mib * 1024 * 1024), hard))
        started = time.monotonic()
        call()
        result.update(seconds=time.monotonic() - started, peak_mib=(_vm_kib("VmPeak") - start_kib) / 1024)
    except BaseException:  # everything, MemoryError and RecursionError included, is the parent's to report
        text, half = traceback.format_exc(), TRACEBACK_CHARS // 2
        result["error"] = text if len(text) <= TRACEBACK_CHARS else f"{text[:half]}\n...\n{text[-half:]}"
    finally:
        with contextlib.suppress(BaseException):
            os.write(out, json.dumps(result).encode())
        os._exit(0)


def _collect(pid: int, source: int, seconds: float) -> Dict[str, Any]:
    """The child's report, or a failure when it did not answer within ``seconds`` (then it is killed)."""
    chunks: List[bytes] = []
    deadline = time.monotonic() + seconds
    while True:
        ready, _, _ = select.select([source], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"did not return within {seconds} s (killed)")
        chunk = os.read(source, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        raise AssertionError(f"the child ended without a report (wait status {status})")
    return json.loads(b"".join(chunks))


def assert_bounded(call: Callable[[], object], seconds: float, mib: float) -> Bounded:
    """Run ``call`` in a forked child; assert that it returned, raised nothing, took at most ``seconds`` and
    grew its address space by at most ``mib`` MiB (see the module's docstring). Assertions inside ``call`` count."""
    source, sink = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(source)
        _run_child(call, sink, mib)
    os.close(sink)
    try:
        report = _collect(pid, source, seconds)
    finally:
        os.close(source)
    assert report["error"] is None, f"raised in the bounded call:\n{report['error']}"
    bounded = Bounded(report["seconds"], report["peak_mib"])
    assert bounded.seconds <= seconds, f"took {bounded.seconds:.1f} s > {seconds} s"
    return bounded
