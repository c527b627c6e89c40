"""The host doctor: every host check in the order a user should fix them."""

from __future__ import annotations

from pathlib import Path
from typing import List, Mapping, Optional

from trainbox.container import flavors
from trainbox.doctor import devices, host, nvidia, topology
from trainbox.doctor.devices import Identity
from trainbox.doctor.result import Check
from trainbox.system import kfd

FLAVORS = flavors.NAMES
#: rocm when ``<root>/dev/kfd`` exists, else cuda when ``<root>/dev/nvidiactl`` does, else cpu (as ``invoke train``).
default_flavor = flavors.default_for_host


def host_checks(
    root: Path,
    identity: Identity,
    flavor: str,
    stack: Mapping[str, str],
    configured_override: Optional[str],
    image_tag: Optional[str] = None,
    min_free: Optional[int] = None,
) -> List[Check]:
    """Drivers, devices and groups, GPU arch/override/kdb, the NVIDIA runtime, shared memory, then Docker, disk and image.

    ``image_tag``: check the Docker Engine, its free disk and this image;
    None checks free disk at ``root`` and leaves Docker out. ``min_free``:
    bytes of free disk to require (default: what the flavor's build needs).
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {', '.join(FLAVORS)}, not {flavor!r}")
    root = Path(root)
    checks: List[Check] = []
    checks.extend(host.check_driver(root))
    checks.extend(devices.check_devices(root, identity))
    checks.extend(devices.check_nvidia_devices(root, identity))
    checks.extend(topology.check_topology(root, configured_override, kfd.image_kdbs(stack)))
    checks.extend(nvidia.check_host(root, flavor, stack))
    checks.append(host.check_shm(root / "dev/shm"))
    if image_tag is None:
        checks.append(host.check_disk(root, flavor, min_free))
        return checks
    client, reachable = host.docker_client()
    checks.append(reachable)
    if client is None:
        checks.append(host.check_disk(root, flavor, min_free))
        return checks
    try:
        info = host.docker_info(client)
        if flavor == "cuda":
            checks.append(nvidia.check_docker_gpus(host.docker_runtimes(info), root))
        checks.append(host.check_disk(host.docker_root(info), flavor, min_free))
        checks.append(host.check_image(client, image_tag, flavor, stack))
    finally:
        client.close()
    return checks
