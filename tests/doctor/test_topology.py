"""The doctor's topology checks on recorded KFD trees: arch, HSA override and kdb, each failure with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts import CARDS, host
from trainbox.container import envfiles
from trainbox.doctor import topology
from trainbox.doctor.result import Status
from trainbox.system import kfd


@pytest.mark.parametrize("tree, arch, cus, override, kdb", CARDS)
def test_topology_checks_pass_with_the_image_settings(tree: str, arch: str, cus: int, override: str, kdb: str) -> None:
    configured = envfiles.runtime_env("rocm").get(kfd.OVERRIDE_ENV)
    checks = topology.check_topology(host(tree), configured, kfd.image_kdbs(envfiles.stack()))
    assert [c.status for c in checks] == [Status.OK] * 3, checks
    assert f"{arch}, {cus} CUs" in checks[0].detail
    assert f"{kdb}.kdb" in checks[2].detail


def test_missing_override_fails_with_the_value_to_set() -> None:
    checks = topology.check_topology(host("rx5600xt"), None, ["gfx1030_18"])
    override = next(c for c in checks if c.name == "gpu 0 hsa override")
    assert override.status is Status.FAIL
    assert "HSA_OVERRIDE_GFX_VERSION=10.3.0" in override.fix


def test_wrong_override_on_a_native_card_fails() -> None:
    checks = topology.check_topology(host("rx6800xt"), "10.1.0", ["gfx1030_36"])
    override = next(c for c in checks if c.name == "gpu 0 hsa override")
    assert override.status is Status.FAIL
    assert "remove HSA_OVERRIDE_GFX_VERSION" in override.fix


def test_missing_kdb_warns_with_the_alias_to_add() -> None:
    checks = topology.check_topology(host("rx5600xt"), "10.3.0", ["gfx1030_36"])
    kdb = next(c for c in checks if c.name == "gpu 0 miopen kdb")
    assert kdb.status is Status.WARN
    assert "add gfx1030_18 to MIOPEN_KDB_ALIASES" in kdb.fix


def test_unsupported_arch_fails_towards_the_cpu_flavor(host_copy) -> None:
    root: Path = host_copy("rx6800xt")
    properties = root / kfd.TOPOLOGY_NODES / "1/properties"
    properties.write_text(properties.read_text().replace("gfx_target_version 100300", "gfx_target_version 110000"))
    checks = topology.check_topology(root, "10.3.0", [])
    assert checks[1].status is Status.FAIL
    assert "gfx1100 is not supported" in checks[1].detail
    assert "--flavor cpu" in checks[1].fix


@pytest.mark.parametrize("tree", ["no-gpu", "nvidia"])
def test_no_amd_gpu_is_not_applicable(tree: str) -> None:
    assert kfd.gpu_nodes(host(tree)) == []
    (check,) = topology.check_topology(host(tree), "10.3.0", [])
    assert check.status is Status.NOT_APPLICABLE
