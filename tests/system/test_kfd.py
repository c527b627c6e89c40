"""GPU arch, CUs, HSA override and kdb name from recorded KFD topologies."""

from __future__ import annotations

import pytest

from tests.hosts import CARDS, host
from trainbox.container import envfiles
from trainbox.system import kfd


@pytest.mark.parametrize("tree, arch, cus, override, kdb", CARDS)
def test_card_needs(tree: str, arch: str, cus: int, override: str, kdb: str) -> None:
    (node,) = kfd.gpu_nodes(host(tree))
    assert (node.node, node.arch, node.compute_units) == (1, arch, cus)
    assert kfd.needed_override(node.arch) == override
    assert kfd.kdb_name(node, override) == kdb


def test_harvested_card_counts_active_cus_not_the_die() -> None:
    props = kfd.parse_properties((host("rx5600xt") / kfd.TOPOLOGY_NODES / "1/properties").read_text())
    assert props["array_count"] * props["cu_per_simd_array"] == 40
    assert kfd.gpu_nodes(host("rx5600xt"))[0].compute_units == 36


@pytest.mark.parametrize("version, name", [(100100, "gfx1010"), (100300, "gfx1030"), (90010, "gfx90a"), (110501, "gfx1151")])
def test_arch_names(version: int, name: str) -> None:
    assert kfd.arch_name(version) == name


def test_override_names_the_arch_hip_reports() -> None:
    assert kfd.override_arch("10.3.0") == "gfx1030"
    with pytest.raises(ValueError, match="MAJOR.MINOR.STEPPING"):
        kfd.override_arch("gfx1030")


def test_image_provides_the_kdbs_of_every_navi_card_here() -> None:
    provided = kfd.image_kdbs(envfiles.stack())
    assert {kdb for *_, kdb in CARDS} <= set(provided)
