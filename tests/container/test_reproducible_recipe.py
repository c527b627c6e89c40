"""Static checks that every Dockerfile follows the reproducible-build recipe, the ROCm one included (it cannot be
built here: these checks are all it gets on this machine). No Docker needed.

The recipe (train/container/reproducible.py): the base image pinned by digest; every RUN that installs packages
or adds a user ends with forget-build.sh; the .pyc that packages and the venv bootstrap wrote are rewritten by
hash-pycs.py in one process; pip installs the hash lock without compiling and compileall writes hash-based .pyc
in one process under a fixed hash seed; nothing reads the build's clock, host name or a random value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

from tests.paths import REPO
from trainbox.container import envfiles, flavors

DOCKERFILES = {name: REPO / flavors.get(name).dockerfile for name in flavors.NAMES}
IMAGE_SCRIPTS = REPO / "train" / "container" / "image"
FORGET = "sh /usr/local/lib/trainbox/forget-build.sh"
#: Commands whose RUN must end with forget-build.sh: they write logs, caches or dated records.
RECORDING = re.compile(r"apt-get (install|update)|dpkg |setup-app\.sh|useradd")
#: What would put the build's clock, host or a random value into a file, label or the config.
BUILD_VALUES = re.compile(r"\$\(date|`date|\bdate [+-]|\$RANDOM|\$\(hostname|\bhostname\b|uuidgen|/proc/sys/kernel/random")


def runs(path: Path) -> List[str]:
    """Every RUN instruction's command, continuation lines joined, comments between them dropped."""
    text = re.sub(r"^\s*#.*\n", "", path.read_text(), flags=re.M).replace("\\\n", " ")
    return [line[4:].strip() for line in text.splitlines() if line.startswith("RUN ")]


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_every_run_that_installs_or_adds_a_user_ends_by_forgetting_the_build(flavor: str) -> None:
    recording = [run for run in runs(DOCKERFILES[flavor]) if RECORDING.search(run)]
    assert len(recording) >= 2, f"{flavor}: the check found {len(recording)} package/user steps"
    unforgetting = [run[:80] for run in recording if not run.rstrip().endswith(FORGET)]
    assert not unforgetting, f"{flavor}: RUN steps that leave logs and caches: {unforgetting}"


def test_forget_build_removes_what_records_the_build() -> None:
    text = (IMAGE_SCRIPTS / "forget-build.sh").read_text()
    for path in (
        "/var/log/apt/*",
        "/var/log/dpkg.log",
        "/var/cache/ldconfig/aux-cache",
        "/var/lib/dpkg/*-old",
        "/var/cache/apt/*.bin",
    ):
        assert path in text


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_the_pyc_of_packages_and_of_the_venv_bootstrap_are_rewritten_hash_based(flavor: str) -> None:
    python = "${" + flavor.upper() + "_PYTHON}"
    venv = [run for run in runs(DOCKERFILES[flavor]) if "-m venv /opt/venv" in run]
    assert len(venv) == 1
    commands = [command.strip() for command in venv[0].split("&&")]
    created = commands.index(f'"python{python}" -m venv /opt/venv')
    assert commands[created + 1 :] == [
        f'PYTHONHASHSEED=0 "python{python}" /usr/local/lib/trainbox/hash-pycs.py /usr/lib /opt/venv',
        FORGET,
    ]


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_pip_compiles_nothing_and_compileall_writes_hash_based_pyc_in_one_process(flavor: str) -> None:
    pip = [run for run in runs(DOCKERFILES[flavor]) if "pip install" in run]
    assert len(pip) == 1 and "--require-hashes --no-compile" in pip[0]
    assert "PYTHONHASHSEED=0 python -m compileall -f -q -j1 --invalidation-mode unchecked-hash" in pip[0]


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_the_base_image_is_pinned_by_digest(flavor: str) -> None:
    base = envfiles.stack()[f"{flavor.upper()}_BASE_IMAGE"]
    assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", base), base


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_nothing_reads_the_build_s_clock_host_name_or_a_random_value(flavor: str) -> None:
    sources = [DOCKERFILES[flavor], *sorted(IMAGE_SCRIPTS.glob("*.sh"))]
    found = [f"{path.name}: {match.group(0)}" for path in sources for match in BUILD_VALUES.finditer(path.read_text())]
    assert not found


def test_the_checks_find_what_they_look_for() -> None:
    """The patterns above match what they must refuse (a check that can match nothing checks nothing)."""
    assert BUILD_VALUES.search('LABEL built="$(date -u)"') and BUILD_VALUES.search("echo $RANDOM > /id")
    assert RECORDING.search("apt-get update && apt-get install -y x") and not RECORDING.search("pip install x")
