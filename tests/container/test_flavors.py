"""The flavor registry (train/container/flavors.py) against the files it names, and the host rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import REPO
from trainbox.container import compose, dotenv, envfiles, flavors
from trainbox.errors import UserError

ROOT = REPO


@pytest.mark.parametrize("name", flavors.NAMES)
def test_every_flavor_names_existing_files_and_pins(name: str) -> None:
    flavor = flavors.get(name)
    stack = envfiles.stack()
    assert (ROOT / flavor.dockerfile).is_file()
    assert all(path.is_file() for path in flavor.env_paths())
    for key in (flavor.python_key, flavor.torch_key, flavor.torchvision_key):
        assert key in stack, f"{name}: {key} not in env/stack.env"
    if flavor.extra_pins:
        assert (ROOT / "env/requirements" / flavor.extra_pins).is_file()
    service = compose.service(name, dotenv.variables(dotenv.settings(name)), ROOT)
    assert service.build["dockerfile"] == flavor.dockerfile and service.image == f"trainbox:{name}"
    assert (name == "cpu") == (not flavor.no_gpu_fix), "every GPU flavor says what to do without its GPU"


@pytest.mark.parametrize(
    "nodes, expected",
    [
        ([], "cpu"),
        (["dev/nvidiactl"], "cuda"),
        (["dev/kfd"], "rocm"),
        (["dev/kfd", "dev/nvidiactl"], "rocm"),
    ],
)
def test_default_flavor_follows_the_kernel_drivers(tmp_path: Path, nodes: list, expected: str) -> None:
    (tmp_path / "dev").mkdir()
    for node in nodes:
        (tmp_path / node).touch()
    assert flavors.default_for_host(tmp_path) == expected


def test_unknown_flavor_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--flavor must be one of rocm, cuda, cpu, not 'gpu'$"):
        flavors.get("gpu")
