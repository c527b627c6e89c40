"""Hash locks per flavor against a fake package index (no network): complete, refused when a hash is missing or env/ drifted."""

from __future__ import annotations

import hashlib
import shutil
import urllib.error
from pathlib import Path
from typing import Dict, List

import pytest

from trainbox.container import envfiles, flavors, locks
from trainbox.errors import UserError


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


def test_unreachable_torch_index_is_recorded_missing_and_refused(requirements: Path) -> None:
    stack = envfiles.stack()
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


def test_lock_made_from_other_pins_is_refused(requirements: Path) -> None:
    stack = envfiles.stack()
    locks.lock("cpu", requirements, FakeIndex(locks.pins("cpu", stack, requirements), stack["CPU_PYTHON"]), stack)
    with pytest.raises(UserError, match="made from other pins than env/ has now"):
        locks.check("cpu", requirements, dict(stack, NUMPY_VERSION="1.26.3"))


def test_rocm_lock_must_carry_the_torch_hashes_env_records(requirements: Path) -> None:
    stack = envfiles.stack()
    pinned = locks.pins("rocm", stack, requirements)
    locks.lock("rocm", requirements, FakeIndex(pinned, stack["ROCM_PYTHON"]), stack)
    with pytest.raises(UserError, match="no torch wheel has the sha256 env/stack.env records as TORCH_ROCM_SHA256"):
        locks.check("rocm", requirements, stack)
    for pin in pinned:
        if pin.name in flavors.get("rocm").known_hashes:
            fitting = next(n for n, fits in wheel_names(pin.name, pin.version, stack["ROCM_PYTHON"]).items() if fits)
            stack[flavors.get("rocm").known_hashes[pin.name]] = sha(fitting)
    assert locks.check("rocm", requirements, stack) == locks.lock_path("rocm", requirements)


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
