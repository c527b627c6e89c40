"""``invoke lock``: hash-locked requirements per flavor, and the check a build runs first.

The pins come from ``env/``: torch, torchvision and the other versions in
``env/stack.env``, everything else exact in ``env/requirements/pins.txt``
(and the flavor's own ``pins-cpu.txt`` or ``pins-cuda.txt``). For every pin the package
index's simple page (PEP 503: links carry ``#sha256=``) names the wheels of
that version; the lock records the sha256 of each wheel that installs on the
flavor's image (its CPython, x86_64, its glibc). pip installs the lock with
``--require-hashes --no-deps``, so an artifact that is not in it is refused.

Some indexes are reachable only from some machines (the ROCm torch index).
For their wheels ``env/requirements/recorded-hashes.txt`` records sha256
values, each with its source: where the index cannot be reached, a pin takes
the recorded hashes of its fitting wheels (the lock says so in a comment);
where it can, every recorded hash must be what the index lists, or the task
fails and the lock is left as it was. A pin with neither is written as a
``# MISSING`` line and the task fails: never an unpinned line. :func:`check`
refuses such a lock, one that lacks a recorded hash of its pins, and one whose
pins no longer match ``env/`` (the lock records the digest of its inputs).
The Dockerfiles refuse a ``# MISSING`` line too, for builds that go around
:func:`check` (``docker compose build``).
"""

from __future__ import annotations

import hashlib
import html
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from trainbox.atomic import write_text_atomic
from trainbox.container import envfiles, flavors
from trainbox.errors import UserError

PYPI_SIMPLE = "https://pypi.org/simple"
REQUIREMENTS_DIR = envfiles.ENV_DIR / "requirements"
MISSING = "# MISSING "
RECORDED_HASHES = "recorded-hashes.txt"
DIGEST_PREFIX = "# inputs sha256: "
FETCH_TIMEOUT_S = 60
#: Legacy manylinux names and the glibc they stand for.
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_ANCHOR = re.compile(r'<a\s[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', re.IGNORECASE)

Fetch = Callable[[str], str]


@dataclass(frozen=True)
class Pin:
    """One exact requirement and the index that serves it."""

    name: str
    version: str
    index: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass
class Locked:
    """A pin with the sha256 of every wheel of it that fits the flavor, or why there is none."""

    pin: Pin
    hashes: List[str]
    missing: Optional[str] = None
    #: Why the hashes are the recorded ones rather than the index's (its error).
    recorded: Optional[str] = None


def lock_path(flavor: str, requirements_dir: Path = REQUIREMENTS_DIR) -> Path:
    return requirements_dir / f"{flavor}.lock"


def normalize(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned_lines(path: Path) -> List[Tuple[str, str]]:
    pins = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise UserError(f"{path}:{number}: expected NAME==VERSION, got {line!r}")
        pins.append((name.strip(), version.strip()))
    return pins


def recorded_hashes(requirements_dir: Path = REQUIREMENTS_DIR) -> Dict[str, str]:
    """``{wheel filename: sha256}`` from ``recorded-hashes.txt``: ``FILENAME SHA256 SOURCE`` a line."""
    path = requirements_dir / RECORDED_HASHES
    recorded: Dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(None, 2)
        if len(fields) < 3 or not fields[0].endswith(".whl") or not re.fullmatch(r"[0-9a-f]{64}", fields[1]):
            raise UserError(f"{path}:{number}: expected WHEEL-FILENAME SHA256 SOURCE, got {line!r}")
        recorded[fields[0]] = fields[1]
    return recorded


def recorded_for(pin: Pin, recorded: Mapping[str, str], python: str, glibc: Tuple[int, int]) -> Dict[str, str]:
    """The recorded ``{filename: sha256}`` of ``pin``'s wheels that install on CPython ``python`` with ``glibc``."""
    return {name: sha for name, sha in recorded.items() if fits(name, pin.name, pin.version, python, glibc)}


def pins(
    flavor: str,
    stack: Optional[Mapping[str, str]] = None,
    requirements_dir: Path = REQUIREMENTS_DIR,
    index: str = PYPI_SIMPLE,
) -> List[Pin]:
    """Every package of ``flavor``'s image with its exact version and index (``index`` for all but ROCm torch)."""
    stack = dict(stack if stack is not None else envfiles.stack())
    spec = flavors.get(flavor)
    local = "+" + stack[spec.torch_local_key] if spec.torch_local_key else ""
    torch_index = stack[spec.torch_index_key] if spec.torch_index_key else index
    extra = _pinned_lines(requirements_dir / spec.extra_pins) if spec.extra_pins else []
    result = [
        Pin("pip", stack["PIP_VERSION"], index),
        Pin("torch", stack[spec.torch_key] + local, torch_index),
        Pin("torchvision", stack[spec.torchvision_key] + local, torch_index),
        Pin("ultralytics", stack["ULTRALYTICS_VERSION"], index),
        Pin("numpy", stack["NUMPY_VERSION"], index),
        Pin("opencv-python-headless", stack["OPENCV_VERSION"], index),
    ]
    result += [Pin(name, version, index) for name, version in extra + _pinned_lines(requirements_dir / "pins.txt")]
    seen: Dict[str, Pin] = {}
    for pin in result:
        other = seen.setdefault(normalize(pin.name), pin)
        if other.version != pin.version:
            raise UserError(f"{pin.name} is pinned twice in env/: {other.version} and {pin.version}")
    return list(seen.values())


def inputs_digest(flavor: str, pinned: List[Pin], python: str) -> str:
    """sha256 over what the lock was made from: flavor, Python, pins and their indexes."""
    text = "\n".join([flavor, python, *(f"{p.requirement} {p.index}" for p in sorted(pinned, key=lambda p: normalize(p.name)))])
    return hashlib.sha256(text.encode()).hexdigest()


def _glibc(platform: str) -> Optional[Tuple[int, int]]:
    """The glibc an x86_64 Linux platform tag needs; None for any other platform."""
    if platform == "linux_x86_64":
        return (0, 0)
    if platform.endswith("_x86_64") and platform[: -len("_x86_64")] in _LEGACY_MANYLINUX:
        return _LEGACY_MANYLINUX[platform[: -len("_x86_64")]]
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
    return (int(match.group(1)), int(match.group(2))) if match else None


def fits(filename: str, name: str, version: str, python: str, glibc: Tuple[int, int]) -> bool:
    """Whether wheel ``filename`` is ``name==version`` and installs on CPython ``python`` (e.g. "3.9") with ``glibc``."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return False
    project, wheel_version, py_tags, abi_tags, platform_tags = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    if normalize(project) != normalize(name) or wheel_version != version:
        return False
    major, minor = (int(x) for x in python.split(".")[:2])
    cp = f"cp{major}{minor}"
    pythons = set(py_tags.split("."))
    abis = set(abi_tags.split("."))
    stable_abi = "abi3" in abis and any(
        t.startswith(f"cp{major}") and t[2:].isdigit() and int(t[3:] or 0) <= minor for t in pythons
    )
    python_ok = bool(pythons & {cp, f"py{major}", f"py{major}{minor}"}) or stable_abi
    abi_ok = bool(abis & {"none", cp}) or stable_abi
    platform_ok = any(tag == "any" or ((need := _glibc(tag)) is not None and need <= glibc) for tag in platform_tags.split("."))
    return python_ok and abi_ok and platform_ok


def index_hashes(page: str) -> Dict[str, str]:
    """``{filename: sha256}`` of the links on a PEP 503 simple page that carry a sha256 fragment."""
    files = {}
    for href, text in _ANCHOR.findall(page):
        _, _, fragment = html.unescape(href).partition("#")
        if fragment.startswith("sha256="):
            files[urllib.parse.unquote(html.unescape(text).strip())] = fragment[len("sha256=") :]
    return files


def fetch_url(url: str) -> str:
    """GET a simple-index page (the system CA store; urllib honours https_proxy)."""
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        return response.read().decode("utf-8", errors="replace")


def _agree(url: str, listed: Mapping[str, str], recorded: Mapping[str, str]) -> None:
    """Refuse a recorded hash that the reachable index ``url`` does not list for the same file."""
    for name, sha in sorted(recorded.items()):
        if listed.get(name) != sha:
            found = f"lists {listed[name]}" if name in listed else "does not list that file"
            raise UserError(
                f"{name}: env/requirements/{RECORDED_HASHES} records sha256 {sha} but {url} {found}:"
                f" find out which is right and correct {RECORDED_HASHES} (the lock was left as it was)"
            )


def resolve(
    flavor: str, pinned: List[Pin], python: str, fetch: Fetch = fetch_url, recorded: Optional[Mapping[str, str]] = None
) -> List[Locked]:
    """The sha256 of each pin's fitting wheels, from its index or, where that cannot be reached, from
    ``recorded``; a pin without any is :class:`Locked` with ``missing`` set. Raises when a reachable index
    disagrees with a recorded hash."""
    glibc = flavors.get(flavor).glibc
    pages: Dict[str, Dict[str, str]] = {}
    errors: Dict[str, str] = {}
    result = []
    for pin in pinned:
        url = f"{pin.index.rstrip('/')}/{normalize(pin.name)}/"
        known = recorded_for(pin, recorded or {}, python, glibc)
        if url not in pages and url not in errors:
            try:
                pages[url] = index_hashes(fetch(url))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                errors[url] = f"{url} unreachable ({getattr(exc, 'reason', exc)})"
        if url in errors:
            if known:
                result.append(Locked(pin, sorted(set(known.values())), recorded=errors[url]))
            else:
                result.append(Locked(pin, [], missing=errors[url]))
            continue
        _agree(url, pages[url], known)
        hashes = sorted(h for f, h in pages[url].items() if fits(f, pin.name, pin.version, python, glibc))
        missing = None if hashes else f"no wheel of {pin.requirement} for CPython {python} x86_64 at {url}"
        result.append(Locked(pin, hashes, missing))
    return result


def render(flavor: str, locked: List[Locked], digest: str, python: str) -> str:
    """The lock file: pip requirements with ``--hash`` (install with --require-hashes --no-deps)."""
    indexes = sorted({item.pin.index for item in locked} - {PYPI_SIMPLE})
    lines = [
        f"# Generated by `invoke lock --flavor {flavor}` (train/container/locks.py) from env/; do not edit.",
        f"# Target: CPython {python}, x86_64, glibc {'.'.join(map(str, flavors.get(flavor).glibc))}.",
        f"# Install: pip install --require-hashes --no-deps -r {flavor}.lock",
        f"{DIGEST_PREFIX}{digest}",
        *(f"--extra-index-url {url}" for url in indexes),
    ]
    for item in sorted(locked, key=lambda item: normalize(item.pin.name)):
        if item.missing:
            lines.append(f"{MISSING}{item.pin.requirement}: {item.missing}")
            continue
        if item.recorded:
            lines.append(f"# {item.pin.requirement}: sha256 from {RECORDED_HASHES} ({item.recorded})")
        lines.append(" \\\n".join([item.pin.requirement, *(f"    --hash=sha256:{h}" for h in item.hashes)]))
    return "\n".join(lines) + "\n"


def lock(
    flavor: str, requirements_dir: Path = REQUIREMENTS_DIR, fetch: Fetch = fetch_url, stack: Optional[Mapping[str, str]] = None
) -> Path:
    """Write ``<flavor>.lock``; raise (after writing it) when any pin's hashes are missing."""
    stack = dict(stack if stack is not None else envfiles.stack())
    python = stack[flavors.get(flavor).python_key]
    pinned = pins(flavor, stack, requirements_dir)
    locked = resolve(flavor, pinned, python, fetch, recorded_hashes(requirements_dir))
    path = lock_path(flavor, requirements_dir)
    write_text_atomic(path, render(flavor, locked, inputs_digest(flavor, pinned, python), python))
    missing = [item for item in locked if item.missing]
    if missing:
        raise UserError(
            f"{path}: {len(missing)} of {len(locked)} pins have no hash ({missing[0].missing}); the build refuses"
            f" this lock: run `invoke lock --flavor {flavor}` on a machine that reaches the index, or record"
            f" their sha256 in {RECORDED_HASHES}"
        )
    return path


def lock_digest(path: Path) -> str:
    """sha256 of a lock file (the image label that ties an image to its lock)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check(flavor: str, requirements_dir: Path = REQUIREMENTS_DIR, stack: Optional[Mapping[str, str]] = None) -> Path:
    """Refuse a lock that is absent, incomplete, lacks a recorded hash of its pins, has an unhashed line, or was
    made from other pins than env/'s."""
    stack = dict(stack if stack is not None else envfiles.stack())
    path = lock_path(flavor, requirements_dir)
    fix = f"run `invoke lock --flavor {flavor}`"
    if not path.is_file():
        raise UserError(f"{path} not found: {fix}")
    text = path.read_text()
    if MISSING in text:
        first = text.split(MISSING, 1)[1].splitlines()[0].split(":", 1)[0]
        raise UserError(f"{path} has no hash for {first}: {fix} on a machine that reaches the index")
    python = stack[flavors.get(flavor).python_key]
    pinned = pins(flavor, stack, requirements_dir)
    known = recorded_hashes(requirements_dir)
    for pin in pinned:
        for name, sha in recorded_for(pin, known, python, flavors.get(flavor).glibc).items():
            if f"--hash=sha256:{sha}" not in text:
                raise UserError(f"{path}: lacks the sha256 {RECORDED_HASHES} records for {name}: {fix}")
    digest = inputs_digest(flavor, pinned, python)
    recorded = next((line[len(DIGEST_PREFIX) :] for line in text.splitlines() if line.startswith(DIGEST_PREFIX)), None)
    if recorded != digest:
        raise UserError(f"{path} was made from other pins than env/ has now: {fix}")
    for requirement in text.replace("\\\n", " ").splitlines():
        if requirement.strip() and not requirement.startswith(("#", "--")) and "--hash=sha256:" not in requirement:
            raise UserError(f"{path}: {requirement.split()[0]} has no --hash: {fix}")
    return path
