"""GPU arch and compute units from the KFD topology → the HSA override and MIOpen kdb name a card needs.

``/sys/class/kfd/kfd/topology/nodes/<n>/properties`` holds ``name value``
lines (amdgpu's ``kfd_topology.c``); CPU nodes have ``simd_count 0``.
``gfx_target_version`` is decimal ``major*10000 + minor*100 + stepping``
(100100 = gfx1010, 90010 = gfx90a). The compute-unit count is
``simd_count / simd_per_cu``, as ROCr computes it: ``array_count *
cu_per_simd_array`` is the full die, so it overcounts harvested parts (an RX
5600 XT reports the RX 5700 XT's 4 x 10 but has 36 CUs).

MIOpen names its kernel database ``<arch>_<n>.kdb`` after the arch HIP
reports (the override's, when one is set) and HIP's multiprocessor count,
which on RDNA (gfx10+) is work-group processors, i.e. CUs / 2 (see
../shared/notes/rocm-gfx1010.md). The lookup needs the exact name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional

TOPOLOGY_NODES = Path("sys/class/kfd/kfd/topology/nodes")
OVERRIDE_ENV = "HSA_OVERRIDE_GFX_VERSION"
#: Archs the torch 1.13.1+rocm5.2 wheel carries kernels for (pytorch/builder manywheel/build_rocm.sh).
WHEEL_ARCHS = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030")
#: Arch families that run the wheel's kernels under an override: RDNA 1/2 as gfx1030, Vega APUs as gfx900.
OVERRIDES = (("gfx101", "10.3.0"), ("gfx103", "10.3.0"), ("gfx90", "9.0.0"))
_KDB_PACKAGE = re.compile(r"miopenkernels-(gfx[0-9a-f]+)-(\d+)kdb")


@dataclass(frozen=True)
class GpuNode:
    """One GPU node of the KFD topology."""

    node: int
    gfx_target_version: int
    simd_count: int
    simd_per_cu: int
    device_id: int
    drm_render_minor: int

    @property
    def arch(self) -> str:
        return arch_name(self.gfx_target_version)

    @property
    def compute_units(self) -> int:
        return self.simd_count // max(1, self.simd_per_cu)


def arch_name(gfx_target_version: int) -> str:
    """``100100`` → ``gfx1010``; ``90010`` → ``gfx90a`` (minor and stepping are hex digits in the name)."""
    major, minor, stepping = gfx_target_version // 10000, gfx_target_version // 100 % 100, gfx_target_version % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def override_arch(version: str) -> str:
    """``10.3.0`` → ``gfx1030``: the arch HIP reports under ``HSA_OVERRIDE_GFX_VERSION``."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{OVERRIDE_ENV}={version!r}: expected MAJOR.MINOR.STEPPING")
    major, minor, stepping = (int(p) for p in parts)
    return f"gfx{major}{minor:x}{stepping:x}"


def needed_override(arch: str) -> Optional[str]:
    """The override ``arch`` needs with the rocm5.2 wheel; None when it runs natively.

    Raises ValueError for an arch no override makes work (RDNA 3 and newer, CDNA 3).
    """
    if arch in WHEEL_ARCHS:
        return None
    for prefix, version in OVERRIDES:
        if arch.startswith(prefix):
            return version
    raise ValueError(f"{arch} is not supported by torch 1.13.1+rocm5.2 (kernels for {', '.join(WHEEL_ARCHS)})")


def kdb_name(node: GpuNode, override: Optional[str]) -> str:
    """The kdb base name MIOpen looks up for ``node`` with ``override`` in force, e.g. ``gfx1030_18``."""
    arch = override_arch(override) if override else node.arch
    rdna = int(arch[3:-2]) >= 10
    return f"{arch}_{node.compute_units // 2 if rdna else node.compute_units}"


def image_kdbs(stack: Mapping[str, str]) -> List[str]:
    """kdb base names the ROCm image provides: the package's own plus ``MIOPEN_KDB_ALIASES`` (env/stack.env)."""
    names = []
    match = _KDB_PACKAGE.fullmatch(stack.get("MIOPEN_KDB_PACKAGE", ""))
    if match:
        names.append(f"{match.group(1)}_{match.group(2)}")
    names.extend(a for a in stack.get("MIOPEN_KDB_ALIASES", "").split(",") if a)
    return names


def parse_properties(text: str) -> Dict[str, int]:
    values: Dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def gpu_nodes(root: Path) -> List[GpuNode]:
    """GPU nodes (simd_count > 0) in node order, the order HIP numbers devices in."""
    base = Path(root) / TOPOLOGY_NODES
    if not base.is_dir():
        return []
    found = []
    for directory in sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            props = parse_properties((directory / "properties").read_text())
        except OSError:
            continue
        if props.get("simd_count", 0) <= 0 or props.get("gfx_target_version", 0) <= 0:
            continue
        found.append(
            GpuNode(
                node=int(directory.name),
                gfx_target_version=props["gfx_target_version"],
                simd_count=props["simd_count"],
                simd_per_cu=props.get("simd_per_cu", 0),
                device_id=props.get("device_id", 0),
                drm_render_minor=props.get("drm_render_minor", 0),
            )
        )
    return found
