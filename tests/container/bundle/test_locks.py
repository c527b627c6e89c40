"""Hash locks per flavor against a fake package index (no network): complete, recorded hashes used where an index
cannot be reached and checked where it can, refused when a hash is missing or env/ drifted."""

from __future__ import annotations

import hashlib
import re
import shutil
import urllib.error
from pathlib import Path
from typing import Dict, List

import pytest

from trainbox.container import envfiles, flavors, locks
from trainbox.errors import UserError

ROCM_GLIBC = flavors.get("rocm").glibc


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def wheel_names(name: str, version: str, python: str) -> Dict[str, bool]:
    """Wheels a fake index offers for a pin, and whether each fits CPython ``python`` with glibc 2.31."""
    stem = f"{name.replace('-', '_')}-{version}"
    cp = "cp" + python.replace(".", "")
    other = "cp311" if cp != "cp311" else "cp310"
    return {
        f"{stem}-{cp}-{cp}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": True,
        f"{stem}-{other}-{other}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": False,
        f"{stem}-{cp}-{cp}-manylinux_2_35_x86_64.whl": False,
        f"{stem}-{cp}-{cp}-win_amd64.whl": False,
        f"{stem}.tar.gz": False,
    }


class FakeIndex:
    """PEP 503 pages for every pin; URLs under ``unreachable`` raise like a blocked host."""

    def __init__(self, pinned: List[locks.Pin], python: str, unreachable: str = "") -> None:
        self.pages: Dict[str, str] = {}
        self.unreachable = unreachable
        for pin in pinned:
            url = f"{pin.index.rstrip('/')}/{locks.normalize(pin.name)}/"
            links = "".join(
                f'<a href="../../files/{name.replace("+", "%2B")}#sha256={sha(name)}">{name}</a><br/>\n'
                for name in wheel_names(pin.name, pin.version, python)
            )
            self.pages[url] = self.pages.get(url, "") + links

    def add(self, pin: locks.Pin, filename: str, sha256: str) -> None:
        """List one more file, with this sha256, on ``pin``'s page."""
        url = f"{pin.index.rstrip('/')}/{locks.normalize(pin.name)}/"
        self.pages[url] += f'<a href="../../files/{filename.replace("+", "%2B")}#sha256={sha256}">{filename}</a><br/>\n'

    def __call__(self, url: str) -> str:
        if self.unreachable and url.startswith(self.unreachable):
            raise urllib.error.URLError("Name or service not known")
        return f"<html><body>{self.pages[url]}</body></html>"


@pytest.fixture()
def requirements(tmp_path: Path) -> Path:
    directory = tmp_path / "requirements"
    shutil.copytree(envfiles.ENV_DIR / "requirements", directory)
    return directory


def test_cpu_lock_pins_every_package_with_the_hash_of_its_fitting_wheel(requirements: Path) -> None:
    stack = envfiles.stack()
    pinned = locks.pins("cpu", stack, requirements)
    path = locks.lock("cpu", requirements, FakeIndex(pinned, stack["CPU_PYTHON"]), stack)
    text = path.read_text()
    for pin in pinned:
        fitting = [name for name, fits in wheel_names(pin.name, pin.version, stack["CPU_PYTHON"]).items() if fits]
        assert f"{pin.requirement} \\\n    --hash=sha256:{sha(fitting[0])}\n" in text
    assert text.count("--hash=sha256:") == len(pinned)
    assert {p.name for p in pinned} >= {"torch", "torchvision", "pip", "ultralytics", "numpy", "nvidia-cudnn-cu11"}
    assert f"torch=={stack['TORCH_VERSION']} " in text
    assert locks.check("cpu", requirements, stack) == path


def rocm_torch_pins(stack: Dict[str, str], requirements: Path) -> List[locks.Pin]:
    return [pin for pin in locks.pins("rocm", stack, requirements) if pin.name in ("torch", "torchvision")]


def test_unreachable_torch_index_takes_the_recorded_hashes(requirements: Path) -> None:
    stack = envfiles.stack()
    pinned = locks.pins("rocm", stack, requirements)
    fake = FakeIndex(pinned, stack["ROCM_PYTHON"], unreachable=stack["TORCH_ROCM_INDEX"])
    path = locks.lock("rocm", requirements, fake, stack)
    text = path.read_text()
    recorded = locks.recorded_hashes(requirements)
    assert locks.MISSING not in text
    for pin in rocm_torch_pins(stack, requirements):
        (sha,) = locks.recorded_for(pin, recorded, stack["ROCM_PYTHON"], ROCM_GLIBC).values()
        unreachable = f"{stack['TORCH_ROCM_INDEX']}/{pin.name}/ unreachable"
        assert f"# {pin.requirement}: sha256 from recorded-hashes.txt ({unreachable}" in text
        assert f"\n{pin.requirement} \\\n    --hash=sha256:{sha}\n" in text
    assert text.count("--hash=sha256:") == len(pinned)
    assert locks.check("rocm", requirements, stack) == path


def test_unreachable_torch_index_without_recorded_hashes_is_missing_and_refused(requirements: Path) -> None:
    stack = envfiles.stack()
    (requirements / locks.RECORDED_HASHES).write_text("# nothing recorded\n")
    pinned = locks.pins("rocm", stack, requirements)
    fake = FakeIndex(pinned, stack["ROCM_PYTHON"], unreachable=stack["TORCH_ROCM_INDEX"])
    with pytest.raises(UserError) as caught:
        locks.lock("rocm", requirements, fake, stack)
    message = str(caught.value)
    assert "\n" not in message and "2 of" in message and "on a machine that reaches the index" in message
    text = locks.lock_path("rocm", requirements).read_text()
    torch = f"torch=={stack['TORCH_VERSION']}+{stack['TORCH_ROCM_LOCAL']}"
    assert f"# MISSING {torch}: {stack['TORCH_ROCM_INDEX']}/torch/ unreachable" in text
    assert f"\n{torch}" not in text
    assert f"--extra-index-url {stack['TORCH_ROCM_INDEX']}" in text
    refusal = r"has no hash for torch==1.13.1\+rocm5.2: run `invoke lock --flavor rocm` on a machine that reaches the index"
    with pytest.raises(UserError, match=refusal):
        locks.check("rocm", requirements, stack)


def test_reachable_index_must_agree_with_the_recorded_hashes(requirements: Path) -> None:
    """Where the index answers, its hashes are used, and a recorded file it lists otherwise (or not at all) stops
    the task before the lock is touched."""
    stack = envfiles.stack()
    pinned = locks.pins("rocm", stack, requirements)
    recorded = locks.recorded_hashes(requirements)
    torch_pins = rocm_torch_pins(stack, requirements)
    before = locks.lock_path("rocm", requirements).read_bytes()
    (torch_file, torch_sha), *_ = locks.recorded_for(torch_pins[0], recorded, stack["ROCM_PYTHON"], ROCM_GLIBC).items()

    unlisted = FakeIndex(pinned, stack["ROCM_PYTHON"])
    with pytest.raises(UserError, match=rf"^{re.escape(torch_file)}: .* records sha256 {torch_sha} but .* does not list"):
        locks.lock("rocm", requirements, unlisted, stack)
    different = FakeIndex(pinned, stack["ROCM_PYTHON"])
    different.add(torch_pins[0], torch_file, sha("another wheel"))
    with pytest.raises(UserError, match=rf"records sha256 {torch_sha} but \S+ lists {sha('another wheel')}: "):
        locks.lock("rocm", requirements, different, stack)
    assert locks.lock_path("rocm", requirements).read_bytes() == before

    agreeing = FakeIndex(pinned, stack["ROCM_PYTHON"])
    for pin in torch_pins:
        for filename, recorded_sha in locks.recorded_for(pin, recorded, stack["ROCM_PYTHON"], ROCM_GLIBC).items():
            agreeing.add(pin, filename, recorded_sha)
    path = locks.lock("rocm", requirements, agreeing, stack)
    text = path.read_text()
    assert "sha256 from recorded-hashes.txt" not in text
    assert all(f"--hash=sha256:{value}" in text for value in recorded.values())
    assert locks.check("rocm", requirements, stack) == path


def test_lock_without_a_recorded_hash_is_refused(requirements: Path) -> None:
    stack = envfiles.stack()
    pinned = locks.pins("rocm", stack, requirements)
    fake = FakeIndex(pinned, stack["ROCM_PYTHON"], unreachable=stack["TORCH_ROCM_INDEX"])
    path = locks.lock("rocm", requirements, fake, stack)
    recorded_file = requirements / locks.RECORDED_HASHES
    torch_file = next(name for name in locks.recorded_hashes(requirements) if name.startswith("torch-"))
    lines = recorded_file.read_text().splitlines()
    changed = [f"{torch_file} {sha('another wheel')} a test" if line.startswith(torch_file) else line for line in lines]
    recorded_file.write_text("\n".join(changed) + "\n")
    refusal = rf"^{re.escape(str(path))}: lacks the sha256 recorded-hashes.txt records for {re.escape(torch_file)}: run"
    with pytest.raises(UserError, match=refusal):
        locks.check("rocm", requirements, stack)


@pytest.mark.parametrize("line", ["torch-1.whl f3685d08", "torch-1.tar.gz " + "0" * 64 + " a source", "torch-1.whl " + "0" * 64])
def test_recorded_hash_needs_wheel_sha256_and_source(requirements: Path, line: str) -> None:
    (requirements / locks.RECORDED_HASHES).write_text(f"# comment\n{line}\n")
    with pytest.raises(UserError, match=r"recorded-hashes.txt:2: expected WHEEL-FILENAME SHA256 SOURCE"):
        locks.recorded_hashes(requirements)


def test_lock_made_from_other_pins_is_refused(requirements: Path) -> None:
    stack = envfiles.stack()
    locks.lock("cpu", requirements, FakeIndex(locks.pins("cpu", stack, requirements), stack["CPU_PYTHON"]), stack)
    with pytest.raises(UserError, match="made from other pins than env/ has now"):
        locks.check("cpu", requirements, dict(stack, NUMPY_VERSION="1.26.3"))


def test_unhashed_line_and_absent_lock_are_refused(requirements: Path) -> None:
    stack = envfiles.stack()
    locks.lock_path("cpu", requirements).unlink()
    with pytest.raises(UserError, match="cpu.lock not found: run `invoke lock --flavor cpu`"):
        locks.check("cpu", requirements, stack)
    path = locks.lock("cpu", requirements, FakeIndex(locks.pins("cpu", stack, requirements), stack["CPU_PYTHON"]), stack)
    path.write_text(path.read_text() + "left-pad==1.0\n")
    with pytest.raises(UserError, match="left-pad==1.0 has no --hash"):
        locks.check("cpu", requirements, stack)


def test_pinned_twice_with_different_versions_is_refused(requirements: Path) -> None:
    (requirements / "pins.txt").write_text("numpy==1.0.0\n")
    with pytest.raises(UserError, match="numpy is pinned twice in env/"):
        locks.pins("cpu", envfiles.stack(), requirements)


@pytest.mark.parametrize(
    ("filename", "python", "expected"),
    [
        ("six-1.17.0-py2.py3-none-any.whl", "3.9", True),
        ("pydantic_core-2.46.5-cp39-cp39-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.9", True),
        ("pydantic_core-2.46.5-cp39-cp39-musllinux_1_1_x86_64.whl", "3.9", False),
        ("polars_runtime_32-1.36.1-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.10", True),
        ("polars_runtime_32-1.36.1-cp311-abi3-manylinux_2_17_x86_64.whl", "3.10", False),
        ("torch-1.13.1+rocm5.2-cp310-cp310-linux_x86_64.whl", "3.10", True),
        ("torch-1.13.1+rocm5.2-cp39-cp39-linux_x86_64.whl", "3.10", False),
        ("py_spy-0.4.3-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl", "3.9", True),
        ("numpy-1.26.4-cp39-cp39-manylinux_2_34_x86_64.whl", "3.9", False),
        ("numpy-1.26.4.tar.gz", "3.9", False),
    ],
)
def test_fits_matches_python_abi_and_glibc(filename: str, python: str, expected: bool) -> None:
    name, version = filename.split("-")[:2]
    assert locks.fits(filename, name, version.replace(".tar.gz", ""), python, (2, 31)) is expected
