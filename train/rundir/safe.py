"""Safe file operations inside a run directory: what the child left there is input, never trusted.

Why it exists: the run directory is written by the training child, and in the
containers by whatever runs inside them. The supervisor and the host-side tools
(``invoke train``, ``status``, ``report``, ``health``) read and write the same
directory. A ``logs`` link made the host write a container's output into any
folder; a ``heartbeats`` link had a run's own cleanup empty another folder; a
``supervisor.lock`` link had the lock overwrite a checkpoint; a FIFO in place of
``heartbeat.json`` froze the supervisor for good (issue 33). This module is the
one place where trainbox opens, creates, reads, writes or deletes anything in a
run directory. :class:`RunFiles` does it; every other module calls it with
:class:`trainbox.rundir.RunDir`'s names.

The rule
  * **No link is followed below the root.** A path is walked part by part,
    each folder opened relative to the one before it with
    ``openat(fd, part, O_DIRECTORY|O_NOFOLLOW)``; the last part is opened with
    ``O_NOFOLLOW``. A symbolic link anywhere refuses the operation; a ``..``
    part, a NUL byte and an absolute path outside the root are refused before
    any system call (empty and ``.`` parts are dropped, as pathlib does). The
    root itself is opened as given, links included: it is the user's choice
    (``runs -> /data/runs``), and no child can replace it (in a container it is
    the mount point).
  * **Regular files only, and nothing blocks.** The last part is ``lstat``-ed
    first, so a FIFO, socket or device is never even opened (opening a device can
    act); it is then opened with ``O_NONBLOCK`` (a FIFO swapped in meanwhile
    opens at once instead of waiting for a writer, fifo(7)) and ``fstat``-ed: what
    is not a regular file is refused.
  * **Writes never land outside.** A file is replaced by a temporary file in
    the same folder, fsynced and renamed over it with both directory
    descriptors (``renameat``): the rename replaces a planted link, it does not
    write through it. A file opened to be appended to, truncated or locked is
    refused when it has another hard link (``st_nlink > 1``): a hard link to a
    file elsewhere, which ``O_NOFOLLOW`` cannot see, would be written through.
    Missing folders are created (``mkdirat``), never through a link.
  * **Reads are bounded.** Every read takes a byte limit; JSON Lines also a
    per-line limit and a record limit; a listing an entry limit. Numbers in JSON
    are capped at :data:`MAX_INT_DIGITS` digits (CPython before 3.11 parses a
    long integer in quadratic time, CVE-2020-10735); nesting too deep for the
    parser is "not JSON", not a ``RecursionError``.
  * **Only trainbox's own names are deleted.** :meth:`RunFiles.remove` and
    :meth:`RunFiles.clear` take an allow-list (:func:`names`, made from
    RunDir's documented names); they unlink entries (a link is removed, its
    target never touched), never descend into a folder, and report a folder
    where a file was expected instead of deleting it.

Why a walk and not ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``: openat2 is
not in Python's standard library (it would need ctypes and a per-architecture
syscall number, and Linux 5.6). The walk gives the same guarantee here. With no
link followed and no ``..`` part, each step is a real entry of the folder just
opened, so no path can leave the root; and since each step is relative to a
descriptor already open, a folder swapped for a link between two steps makes
the next ``openat`` fail instead of being followed: there is no window between
a check and a use. What openat2 would add is ``RESOLVE_NO_XDEV`` (a mount inside
the run directory: making one needs ``CAP_SYS_ADMIN``, which neither a native
child nor a default container has) and one system call instead of one per part
(a run-directory path has at most four). CPython's ``shutil.rmtree`` defends
against symlink attacks the same way (``_rmtree_safe_fd``: ``os.open`` with
``dir_fd`` and ``O_NOFOLLOW``, checking each entry with ``fstat``). The link
attacks themselves are CWE-59 and CWE-61.

What a caller sees
  * Anything odd about the directory's content is a :class:`Refusal`, returned
    (``Got.refused``, or the return value of a write), never raised; its
    ``.value`` is a few words, and :meth:`Refusal.line` says it in one line.
  * A read never raises: an I/O error (``EIO``) is ``Refusal.UNREADABLE``.
  * A write raises ``OSError`` only for what the machine says: ``ENOSPC`` and
    ``EDQUOT`` (the supervisor turns them into ``DiskFull``, as today), ``EROFS``,
    ``EIO``, ``EMFILE``. What the directory's content causes (``ELOOP``,
    ``ENOTDIR``, ``EISDIR``, ``ENXIO``, ``EACCES``, ``EPERM``, ``EEXIST``) is a refusal.

Limits: natively the child runs as the user and can write the user's files
directly, so there this is about robustness (no crash, no hang, no damage done
by trainbox through a stray link); from a container it is a boundary. A
reader may still read a file that has another hard link (reading is harmless,
and a ``cp -al`` backup of a run hard-links every file); such a copy cannot
be supervised again, since its ``events.jsonl`` and lock are refused (copy
with ``cp -a``). A device swapped in between the ``lstat`` and the open is
opened before ``fstat`` refuses it (making one needs ``CAP_MKNOD``, and a
container's device cgroup still decides what opens). Names from a listing, and
strings in parsed JSON (``"\\ud800"`` in the file), may hold lone surrogates: a caller
that encodes them must say how (``errors="replace"``).

Standard library only: the supervisor, the child and the host-side tools import it.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import json
import os
import re
import secrets
import stat
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    BinaryIO,
    Callable,
    Deque,
    Dict,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    Pattern,
    Tuple,
    TypeVar,
    Union,
)

T = TypeVar("T")
PathLike = Union[str, "os.PathLike[str]"]
#: What a write takes: the bytes, or chunks of them (``docker logs`` streams a container's output).
Data = Union[bytes, bytearray, memoryview, Iterable[bytes]]
#: What :meth:`RunFiles.replace_with` takes instead: a function that writes into a binary file (``torch.save``).
Writer = Callable[[BinaryIO], object]

#: How reads move through a file: large enough for few system calls, small enough to hold per line.
CHUNK_BYTES = 64 * 1024
#: Digits an integer in run-directory JSON may have (a pid, a step, a timestamp in ns: at most 20).
MAX_INT_DIGITS = 64
#: The random part of a temporary file's name: trainbox.atomic's (tempfile's) alphabet and length, so
#: ``atomic.remove_stale_temps`` and :func:`names` recognise the leftovers of either.
TEMP_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"
TEMP_RANDOM_CHARS = 8
#: Names tried before giving up on a free temporary name (each is 37**8 to one to be taken).
TEMP_ATTEMPTS = 100
#: Entries :meth:`RunFiles.clear` names in what it left alone (a note shows a few; a folder may hold millions).
MAX_NAMED_LEFT = 20
#: What a new file or folder asks for; the process umask takes its bits away, as open() and mkdir() do.
NEW_FILE_MODE = 0o666
NEW_FOLDER_MODE = 0o777


class Refusal(enum.Enum):
    """Why an operation on a run-directory path was not done: a few words a caller can count or show."""

    MISSING = "missing"
    BAD_PATH = "not a path inside the run directory"
    SYMLINK = "a symbolic link"
    NOT_A_DIRECTORY = "a file where a folder belongs"
    DIRECTORY = "a folder where a file belongs"
    FIFO = "a FIFO"
    SOCKET = "a socket"
    DEVICE = "a device"
    HARD_LINKED = "a file with another hard link"
    TOO_LARGE = "too large"
    NOT_JSON = "not JSON"
    NOT_AN_OBJECT = "not a JSON object"
    DENIED = "permission denied"
    NOT_ALLOWED = "not a name trainbox writes"
    EXISTS = "already exists"
    UNREADABLE = "unreadable"

    def line(self, path: PathLike) -> str:
        """``logs: a symbolic link, refused`` (for a note, a status line or a UserError)."""
        return f"{os.fspath(path)}: {self.value}" + ("" if self is Refusal.MISSING else ", refused")


@dataclass(frozen=True)
class Got(Generic[T]):
    """What a read found: ``value`` (None exactly when ``refused``), and what it left out.

    ``skipped``: lines or records that were not usable (too long, not JSON, not an object) or entries beyond
    a listing's limit; ``truncated``: only the newest part was read (a tail, or a history over its limit).
    """

    value: Optional[T]
    refused: Optional[Refusal] = None
    skipped: int = 0
    truncated: bool = False


@dataclass(frozen=True)
class Cleared:
    """What :meth:`RunFiles.clear` did: how many entries it removed; what it left alone and why (a folder, a
    name not trainbox's: the first :data:`MAX_NAMED_LEFT` by name, the rest counted in ``more_left``);
    ``refused``: the folder itself was (a link, missing...)."""

    removed: int = 0
    left: Dict[str, Refusal] = field(default_factory=dict)
    more_left: int = 0
    refused: Optional[Refusal] = None


class Open(enum.Enum):
    """How :meth:`RunFiles.open_fd` opens a file it may create: the flags, and whether it is emptied first."""

    APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    TRUNCATE = os.O_WRONLY | os.O_CREAT  # emptied with ftruncate once it is known to be a lone regular file
    LOCK = os.O_RDWR | os.O_CREAT


class _Refused(Exception):
    """Carries a refusal from deep in a walk to the public method, which returns it."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal


#: What the directory's content (not the machine) makes a system call fail with.
_CONTENT_ERRNOS = {
    errno.ENOENT: Refusal.MISSING,
    errno.ELOOP: Refusal.SYMLINK,
    errno.ENOTDIR: Refusal.NOT_A_DIRECTORY,
    errno.EISDIR: Refusal.DIRECTORY,
    errno.ENOTEMPTY: Refusal.DIRECTORY,
    errno.ENXIO: Refusal.FIFO,  # a FIFO (or socket) opened for writing with no reader
    errno.EACCES: Refusal.DENIED,
    errno.EPERM: Refusal.DENIED,
    errno.EEXIST: Refusal.EXISTS,
    errno.ENAMETOOLONG: Refusal.BAD_PATH,
}
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LEAF_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _content_refusal(exc: OSError) -> Refusal:
    """The refusal for an error the directory's content caused; re-raise one the machine caused (ENOSPC, EIO)."""
    refusal = _CONTENT_ERRNOS.get(exc.errno or 0)
    if refusal is None:
        raise exc
    return refusal


def _kind_refusal(mode: int) -> Optional[Refusal]:
    """None for a regular file; otherwise what the entry is, as a refusal."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return Refusal.SYMLINK
    if stat.S_ISDIR(mode):
        return Refusal.DIRECTORY
    if stat.S_ISFIFO(mode):
        return Refusal.FIFO
    return Refusal.SOCKET if stat.S_ISSOCK(mode) else Refusal.DEVICE


def _lstat(folder: int, name: str) -> Optional[os.stat_result]:
    """The entry ``name`` of the open folder, itself (a link is not followed); None when there is none."""
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a name too long, a folder we may not search
        raise _Refused(_content_refusal(exc)) from None


def _split(root: str, path: PathLike, folder: bool = False) -> Tuple[str, ...]:
    """The parts of ``path`` below ``root``: RunDir's ``root / name``, or a name relative to the root.

    Empty and ``.`` parts are dropped, as pathlib does; only a ``folder`` may be the root itself (no parts).
    Plain string work: pathlib took half the time of a whole small read.
    """
    text = os.fspath(path)
    if text == root:
        text = ""
    elif text.startswith(root.rstrip("/") + "/"):
        text = text[len(root.rstrip("/")) + 1 :]
    elif text.startswith("/"):
        raise _Refused(Refusal.BAD_PATH)
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if not (parts or folder) or any(part == ".." or "\0" in part for part in parts):
        raise _Refused(Refusal.BAD_PATH)
    return parts


def _open_root(root: Path, create: bool) -> int:
    """The root, links followed (the user's own path); made with its parents for a write."""
    try:
        if create:
            os.makedirs(root, exist_ok=True)
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _Refused(_content_refusal(exc)) from None


def _open_folder(parent: int, name: str, create: bool) -> int:
    """The folder ``name`` in ``parent``, never through a link; made when missing and ``create``."""
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise _Refused(Refusal.MISSING) from None
    except OSError as exc:
        found = _lstat(parent, name)
        raise _Refused((found and _kind_refusal(found.st_mode)) or _content_refusal(exc)) from None
    with contextlib.suppress(FileExistsError):  # made meanwhile by another writer: opened below like any folder
        os.mkdir(name, NEW_FOLDER_MODE, dir_fd=parent)
    return _open_folder(parent, name, create=False)


@contextlib.contextmanager
def _folder(root: Path, parts: Iterable[str], create: bool) -> Iterator[int]:
    """The open descriptor of ``root/parts...``, walked part by part (see the module's docstring); closed after."""
    fd = _open_root(root, create)
    try:
        for part in parts:
            inner = _open_folder(fd, part, create)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _open_file(folder: int, name: str, flags: int, writing: bool) -> Tuple[int, os.stat_result]:
    """Open ``name`` in ``folder`` as a regular file (see the rule); a writer's also has no other hard link."""
    found = _lstat(folder, name)
    refusal = found and _kind_refusal(found.st_mode)
    if refusal is not None:  # refused before opening: a device may act on open, a FIFO may block
        raise _Refused(refusal)
    try:
        fd = os.open(name, flags | _LEAF_FLAGS, NEW_FILE_MODE, dir_fd=folder)
    except OSError as exc:
        raise _Refused(_content_refusal(exc)) from None
    info = os.fstat(fd)
    refusal = _kind_refusal(info.st_mode) or (Refusal.HARD_LINKED if writing and info.st_nlink > 1 else None)
    if refusal is not None:
        os.close(fd)
        raise _Refused(refusal)
    return fd, info


def _pread_all(fd: int, start: int, count: int) -> bytes:
    """Up to ``count`` bytes from ``start`` (fewer at the end of the file)."""
    chunks: List[bytes] = []
    while count > 0:
        chunk = os.pread(fd, min(count, CHUNK_BYTES), start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: Data) -> None:
    chunks = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + 1:  # the sign
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def parse_object(data: bytes) -> Got[Dict[str, Any]]:
    """The JSON object in ``data`` (strict UTF-8); NOT_JSON or NOT_AN_OBJECT otherwise. Never raises."""
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_bounded_int)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Got(None, Refusal.NOT_JSON)
    return Got(value) if isinstance(value, dict) else Got(None, Refusal.NOT_AN_OBJECT)


def _lines(fd: int, start: int, end: int, line_limit: int) -> Iterator[Optional[bytes]]:
    """The lines between ``start`` and ``end``; None for each one longer than ``line_limit`` (not kept)."""
    pending, overlong = b"", False
    while start < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - start), start)
        if not chunk:
            break
        start += len(chunk)
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            yield None if overlong or len(line) > line_limit else line
            overlong = False
        if len(pending) > line_limit:
            pending, overlong = b"", True
    if pending or overlong:
        yield None if overlong else pending


def _records(fd: int, size: int, limits: Tuple[int, int, int]) -> Got[List[Dict[str, Any]]]:
    """The JSON objects of the newest ``total`` bytes, one per line, at most ``records`` of them (the newest)."""
    line_limit, total, records = limits
    start = max(0, size - total)
    found: Deque[Dict[str, Any]] = deque(maxlen=records)
    skipped = kept = 0
    lines = _lines(fd, start, size, line_limit)
    if start > 0:
        next(lines, None)  # the line the cut fell into
    for line in lines:
        parsed = parse_object(line) if line is not None else Got(None, Refusal.TOO_LARGE)
        if parsed.value is not None:
            found.append(parsed.value)
            kept += 1
        elif line is None or line.strip():
            skipped += 1
    return Got(list(found), skipped=skipped, truncated=start > 0 or kept > len(found))


def _temp_name(name: str) -> str:
    random = "".join(secrets.choice(TEMP_ALPHABET) for _ in range(TEMP_RANDOM_CHARS))
    return f".{name}.{random}.tmp"


def _create_temp(folder: int, name: str, mode: Optional[int]) -> Tuple[int, str]:
    """A new, locked temporary file beside ``name`` (trainbox.atomic's convention: locked while alive)."""
    for _ in range(TEMP_ATTEMPTS):
        temp = _temp_name(name)
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _LEAF_FLAGS, NEW_FILE_MODE, dir_fd=folder)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if mode is not None:
            os.fchmod(fd, mode)
        return fd, temp
    raise _Refused(Refusal.EXISTS)


def _write_through(fd: int, write: Callable[[BinaryIO], object]) -> None:
    """Let ``write`` write into ``fd`` as a buffered binary file (``torch.save`` takes one); ``fd`` stays open."""
    with os.fdopen(os.dup(fd), "wb") as handle:
        write(handle)


def _replace_in(folder: int, name: str, data: Union[Data, Writer], fsync: bool, mode: Optional[int]) -> None:
    """Write ``data`` (or what a :data:`Writer` writes) to a temporary file in ``folder`` and rename it over ``name``."""
    found = _lstat(folder, name)
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise _Refused(Refusal.DIRECTORY)
    keep = stat.S_IMODE(found.st_mode) if found is not None and stat.S_ISREG(found.st_mode) else None
    fd, temp = _create_temp(folder, name, mode if mode is not None else keep)
    try:
        try:
            if callable(data):
                _write_through(fd, data)
            else:
                _write_all(fd, data)
            if fsync:
                os.fsync(fd)
            os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)  # still locked: see trainbox.atomic
        finally:
            os.close(fd)
        if fsync:
            os.fsync(folder)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        if isinstance(exc, OSError):
            raise _Refused(_content_refusal(exc)) from None
        raise


def names(*documented: str) -> Pattern[str]:
    """An allow-list for :meth:`RunFiles.remove` and :meth:`RunFiles.clear` from RunDir's documented names.

    ``names("rank-<rank>.json")`` matches ``rank-3.json`` and the temporary files an interrupted
    replacement of it leaves (``.rank-3.json.k2j4x_9a.tmp``); each ``<placeholder>`` stands for a number.
    """
    alternatives = "|".join(re.sub(r"<[a-z]+>", "[0-9]+", re.escape(name)) for name in documented)
    temp = f"[{re.escape(TEMP_ALPHABET)}]{{{TEMP_RANDOM_CHARS}}}"
    return re.compile(rf"(?:{alternatives})|\.(?:{alternatives})\.{temp}\.tmp")


def temporaries(*documented: str) -> Pattern[str]:
    """The temporary files an interrupted replacement of these names leaves (``.midepoch.pt.k2j4x_9a.tmp``) and not
    the names themselves: for removing a killed write's leftovers beside a file that must stay."""
    alternatives = "|".join(re.sub(r"<[a-z]+>", "[0-9]+", re.escape(name)) for name in documented)
    return re.compile(rf"\.(?:{alternatives})\.[{re.escape(TEMP_ALPHABET)}]{{{TEMP_RANDOM_CHARS}}}\.tmp")


class RunFiles:
    """Every file operation trainbox does in the run directory ``root`` (see the module's docstring).

    Paths are RunDir's (``run.heartbeat``, ``run.rank_heartbeat(3)``) or names relative to the root.
    """

    def __init__(self, root: PathLike) -> None:
        self.root = Path(os.fspath(root))
        #: The root as RunDir's paths begin (pathlib's spelling: no trailing or doubled slash).
        self._prefix = os.fspath(self.root)

    # -- reading: never raises ----------------------------------------------------------------
    def read_bytes(self, path: PathLike, limit: int, start: int = 0) -> Got[bytes]:
        """The file's bytes from ``start`` on; TOO_LARGE when more than ``limit`` of them (none are read then)."""
        return self._reading(path, lambda fd, size: _read_bounded(fd, size, start, limit))

    def read_tail(self, path: PathLike, limit: int) -> Got[bytes]:
        """The last ``limit`` bytes of the file (``truncated`` when there were more): logs, output."""
        return self._reading(path, lambda fd, size: Got(_pread_all(fd, max(0, size - limit), limit), truncated=size > limit))

    def read_span(self, path: PathLike, start: int, limit: int) -> Got[bytes]:
        """At most ``limit`` bytes from ``start`` on (``truncated`` when there were more): a stack dump's new part."""
        return self._reading(path, lambda fd, size: Got(_pread_all(fd, start, limit), truncated=size - start > limit))

    def read_object(self, path: PathLike, limit: int) -> Got[Dict[str, Any]]:
        """The JSON object the file holds (heartbeat, state, summary...); refused as TOO_LARGE, NOT_JSON..."""
        read = self.read_bytes(path, limit)
        return Got(None, read.refused) if read.value is None else parse_object(read.value)

    def read_objects(self, path: PathLike, line_limit: int, total_limit: int, max_records: int) -> Got[List[Dict[str, Any]]]:
        """JSON Lines (events, progress): the objects of the newest ``total_limit`` bytes, at most ``max_records``.

        A line over ``line_limit``, not JSON (a torn last line too) or not an object is counted in ``skipped``;
        ``truncated`` says older records were left out.
        """
        return self._reading(path, lambda fd, size: _records(fd, size, (line_limit, total_limit, max_records)))

    def stat(self, path: PathLike) -> Got[os.stat_result]:
        """The entry's own stat when it is a regular file or a folder reached without a link; else refused."""
        try:
            *folders, name = _split(self._prefix, path)
            with _folder(self.root, folders, create=False) as folder:
                found = _lstat(folder, name)
        except _Refused as refused:
            return Got(None, refused.refusal)
        except OSError:
            return Got(None, Refusal.UNREADABLE)
        if found is None:
            return Got(None, Refusal.MISSING)
        refusal = None if stat.S_ISDIR(found.st_mode) else _kind_refusal(found.st_mode)
        return Got(None, refusal) if refusal else Got(found)

    def list_dir(self, path: PathLike, limit: int) -> Got[List[str]]:
        """The names in a folder, sorted, at most ``limit`` of them (the others counted in ``skipped``)."""
        try:
            parts = _split(self._prefix, path, folder=True)
            with _folder(self.root, parts, create=False) as folder, os.scandir(folder) as entries:
                found: List[str] = []
                skipped = 0
                for entry in entries:
                    if len(found) < limit:
                        found.append(entry.name)
                    else:
                        skipped += 1
        except _Refused as refused:
            return Got(None, refused.refusal)
        except OSError:
            return Got(None, Refusal.UNREADABLE)
        return Got(sorted(found), skipped=skipped, truncated=skipped > 0)

    # -- writing: refusals returned, the machine's errors (a full disk) raised ----------------------
    def replace(self, path: PathLike, data: Data, fsync: bool = True, mode: Optional[int] = None) -> Optional[Refusal]:
        """Create or replace the file atomically (a crash leaves the old content or the new, never a mix).

        ``mode``: the new file's permissions (default: a replaced file's own, else 0o666 less the umask).
        """
        return self._replace(path, data, fsync, mode)

    def replace_with(self, path: PathLike, write: Writer, fsync: bool = True, mode: Optional[int] = None) -> Optional[Refusal]:
        """:meth:`replace` with the content written by ``write(file)`` (a checkpoint streamed by ``torch.save``)."""
        return self._replace(path, write, fsync, mode)

    def _replace(self, path: PathLike, data: Union[Data, Writer], fsync: bool, mode: Optional[int]) -> Optional[Refusal]:
        try:
            *folders, name = _split(self._prefix, path)
            with _folder(self.root, folders, create=True) as folder:
                _replace_in(folder, name, data, fsync, mode)
        except _Refused as refused:
            return refused.refusal
        return None

    def append(self, path: PathLike, data: bytes, fsync: bool = False) -> Optional[Refusal]:
        """Append ``data`` with one ``write`` (events.jsonl: whole lines, never interleaved); create the file."""
        opened = self.open_fd(path, Open.APPEND)
        if opened.value is None:
            return opened.refused
        try:
            _write_all(opened.value, data)
            if fsync:
                os.fsync(opened.value)
        finally:
            os.close(opened.value)
        return None

    def open_fd(self, path: PathLike, how: Open) -> Got[int]:
        """A descriptor (close-on-exec, the caller closes it) on a lone regular file, created when missing.

        ``Open.APPEND``: an attempt's log; ``Open.TRUNCATE``: emptied (a faulthandler stack file);
        ``Open.LOCK``: read-write, content kept (``supervisor.lock``, for ``flock``).
        """
        try:
            *folders, name = _split(self._prefix, path)
            with _folder(self.root, folders, create=True) as folder:
                fd, _ = _open_file(folder, name, how.value, writing=True)
        except _Refused as refused:
            return Got(None, refused.refusal)
        if how is Open.TRUNCATE:
            try:
                os.ftruncate(fd, 0)
            except BaseException:
                os.close(fd)
                raise
        return Got(fd)

    def make_dirs(self, path: PathLike) -> Optional[Refusal]:
        """Make the folder and its missing parents; refused when any part is a link or not a folder."""
        try:
            with _folder(self.root, _split(self._prefix, path, folder=True), create=True):
                return None
        except _Refused as refused:
            return refused.refusal

    def rename(self, source: PathLike, target: PathLike) -> Optional[Refusal]:
        """Rename an entry trainbox made (an incident's staging folder) to a name that is free (else EXISTS)."""
        try:
            *source_folders, source_name = _split(self._prefix, source)
            *target_folders, target_name = _split(self._prefix, target)
            with _folder(self.root, source_folders, create=False) as old, _folder(self.root, target_folders, True) as new:
                if _lstat(new, target_name) is not None:
                    return Refusal.EXISTS
                os.rename(source_name, target_name, src_dir_fd=old, dst_dir_fd=new)
                os.fsync(new)  # the rename is durable once its folder is
        except _Refused as refused:
            return refused.refusal
        except OSError as exc:
            return _content_refusal(exc)
        return None

    def move_over(self, source: PathLike, target: PathLike) -> Optional[Refusal]:
        """Rename the regular file ``source`` (a staged checkpoint) over ``target``, replacing a file or a link
        there (never a folder); the file, then its new folder, are fsynced, so the rename is durable and complete."""
        try:
            *source_folders, source_name = _split(self._prefix, source)
            *target_folders, target_name = _split(self._prefix, target)
            with _folder(self.root, source_folders, create=False) as old, _folder(self.root, target_folders, True) as new:
                fd, _ = _open_file(old, source_name, os.O_RDONLY, writing=False)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                found = _lstat(new, target_name)
                if found is not None and stat.S_ISDIR(found.st_mode):
                    return Refusal.DIRECTORY
                os.rename(source_name, target_name, src_dir_fd=old, dst_dir_fd=new)
                os.fsync(new)
        except _Refused as refused:
            return refused.refusal
        except OSError as exc:
            return _content_refusal(exc)
        return None

    # -- deleting: trainbox's own names only ----------------------------------------------------------
    def remove(self, path: PathLike, allowed: Pattern[str]) -> Optional[Refusal]:
        """Unlink the entry when its name fully matches ``allowed``: a file, or a link itself (never its target).

        A folder is left alone (DIRECTORY); a missing entry is MISSING.
        """
        try:
            *folders, name = _split(self._prefix, path)
            if not allowed.fullmatch(name):
                return Refusal.NOT_ALLOWED
            with _folder(self.root, folders, create=False) as folder:
                return _unlink_entry(folder, name)
        except _Refused as refused:
            return refused.refusal

    def remove_folder(self, path: PathLike, allowed: Pattern[str]) -> Optional[Refusal]:
        """Remove an empty folder whose name fully matches ``allowed`` (a report's staging folder after a failed
        write: :meth:`clear` it first); a link is refused, a folder that is not empty is DIRECTORY."""
        try:
            *folders, name = _split(self._prefix, path)
            if not allowed.fullmatch(name):
                return Refusal.NOT_ALLOWED
            with _folder(self.root, folders, create=False) as folder:
                found = _lstat(folder, name)
                if found is None:
                    return Refusal.MISSING
                if not stat.S_ISDIR(found.st_mode):
                    return _kind_refusal(found.st_mode) or Refusal.NOT_A_DIRECTORY
                os.rmdir(name, dir_fd=folder)
        except _Refused as refused:
            return refused.refusal
        except OSError as exc:
            return _content_refusal(exc)
        return None

    def clear(self, path: PathLike, allowed: Pattern[str]) -> Cleared:
        """Remove the entries of a folder whose names match ``allowed`` (see :meth:`remove`); never recursive."""
        try:
            with _folder(self.root, _split(self._prefix, path, folder=True), create=False) as folder:
                return _clear_in(folder, allowed)
        except _Refused as refused:
            return Cleared(refused=refused.refusal)

    def _reading(self, path: PathLike, read: Callable[[int, int], Got[T]]) -> Got[T]:
        """Open ``path`` for reading and return ``read(fd, size)``; every failure a refusal."""
        try:
            *folders, name = _split(self._prefix, path)
            with _folder(self.root, folders, create=False) as folder:
                fd, info = _open_file(folder, name, os.O_RDONLY, writing=False)
            try:
                return read(fd, info.st_size)
            finally:
                os.close(fd)
        except _Refused as refused:
            return Got(None, refused.refusal)
        except OSError:
            return Got(None, Refusal.UNREADABLE)


def _read_bounded(fd: int, size: int, start: int, limit: int) -> Got[bytes]:
    if size - start > limit:
        return Got(None, Refusal.TOO_LARGE)
    data = _pread_all(fd, start, limit + 1)  # the file may have grown since fstat
    return Got(None, Refusal.TOO_LARGE) if len(data) > limit else Got(data)


def _unlink_entry(folder: int, name: str) -> Optional[Refusal]:
    found = _lstat(folder, name)
    if found is None:
        return Refusal.MISSING
    if stat.S_ISDIR(found.st_mode):
        return Refusal.DIRECTORY
    try:
        os.unlink(name, dir_fd=folder)
    except OSError as exc:
        return _content_refusal(exc)
    return None


def _clear_in(folder: int, allowed: Pattern[str]) -> Cleared:
    removed, more_left = 0, 0
    left: Dict[str, Refusal] = {}
    with os.scandir(folder) as entries:  # one entry at a time: the folder may hold millions
        for entry in entries:
            refusal = _unlink_entry(folder, entry.name) if allowed.fullmatch(entry.name) else Refusal.NOT_ALLOWED
            if refusal is None:
                removed += 1
            elif refusal is Refusal.MISSING:
                continue  # removed meanwhile by someone else: what was asked
            elif len(left) < MAX_NAMED_LEFT:
                left[entry.name] = refusal
            else:
                more_left += 1
    return Cleared(removed, dict(sorted(left.items())), more_left)
