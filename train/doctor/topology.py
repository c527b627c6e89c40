"""The doctor's checks of an AMD GPU's topology: arch, the HSA override it needs, and the kdb MIOpen will ask for.

The facts come from :mod:`trainbox.system.kfd` (the KFD topology, read the way ROCr reads it); this module only
turns them into checks with their fixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, List, Optional

from trainbox.doctor.result import Check, fail, not_applicable, ok, warn
from trainbox.system import kfd

FIX_REBUILD = "then `invoke build --flavor rocm`"


def check_topology(root: Path, configured_override: Optional[str], provided_kdbs: Collection[str]) -> List[Check]:
    """Per GPU: arch and CUs, whether the configured override fits, whether the image has its kdb."""
    nodes = kfd.gpu_nodes(root)
    if not nodes:
        return [not_applicable("gpu arch", f"no GPU node in {Path(root) / kfd.TOPOLOGY_NODES} (no AMD GPU or amdgpu not loaded)")]
    checks: List[Check] = []
    for index, node in enumerate(nodes):
        label = f"gpu {index}"
        checks.append(
            ok(
                f"{label} arch",
                f"KFD node {node.node}: {node.arch}, {node.compute_units} CUs"
                f" ({node.simd_count} SIMDs / {node.simd_per_cu} per CU),"
                f" PCI device 0x{node.device_id:04x}, /dev/dri/renderD{node.drm_render_minor}",
            )
        )
        try:
            needed = kfd.needed_override(node.arch)
        except ValueError as exc:
            checks.append(fail(f"{label} hsa override", str(exc), "train with the cpu flavor (`invoke train --flavor cpu`)"))
            continue
        checks.append(_override_check(label, node, needed, configured_override))
        name = kfd.kdb_name(node, configured_override if configured_override else needed)
        if name in provided_kdbs:
            checks.append(ok(f"{label} miopen kdb", f"MIOpen asks for {name}.kdb; the ROCm image provides it"))
        else:
            checks.append(
                warn(
                    f"{label} miopen kdb",
                    f"MIOpen asks for {name}.kdb, which the ROCm image lacks (it has {', '.join(provided_kdbs) or 'none'}):"
                    " every convolution kernel is compiled at the first batch (minutes)",
                    f"add {name} to MIOPEN_KDB_ALIASES in env/stack.env, {FIX_REBUILD}",
                )
            )
    return checks


def _override_check(label: str, node: kfd.GpuNode, needed: Optional[str], configured: Optional[str]) -> Check:
    name = f"{label} hsa override"
    shown = f"{kfd.OVERRIDE_ENV}={configured}" if configured else f"no {kfd.OVERRIDE_ENV}"
    if needed is None:
        if configured is None or kfd.override_arch(configured) == node.arch:
            return ok(name, f"{node.arch} runs the wheel's kernels natively ({shown} is harmless)")
        return fail(
            name,
            f"{node.arch} runs the wheel's kernels natively, but {shown} makes HIP treat it as {kfd.override_arch(configured)}",
            f"remove {kfd.OVERRIDE_ENV} from env/gfx1010.env, {FIX_REBUILD}",
        )
    if configured == needed:
        return ok(name, f"{node.arch} needs {kfd.OVERRIDE_ENV}={needed}; configured")
    return fail(
        name,
        f"{node.arch} needs {kfd.OVERRIDE_ENV}={needed} (the wheel has no {node.arch} kernels); found {shown}",
        f"set {kfd.OVERRIDE_ENV}={needed} in env/gfx1010.env, {FIX_REBUILD}",
    )
