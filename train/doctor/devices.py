"""``/dev/kfd`` and ``/dev/dri``: present, openable by the user, and the numeric GIDs compose needs.

Openability is decided from the permission bits for a given identity (uid
and the GIDs of the running session), so the check means the same for root,
for a user, and for a recorded tree. Two identities matter: this session
(training outside containers) and the container user, who runs with the
host UID plus the devices' video/render GIDs from compose's ``group_add``.
A device only the container can open is a warning; one neither can open
fails. Group names come from ``<root>/etc/group``: being listed there but not
holding the GID in this session means the user was added and has not logged
in again since.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

from trainbox.doctor.result import Check, fail, not_applicable, ok, warn

KFD = Path("dev/kfd")
DRI = Path("dev/dri")
NVIDIA = Path("dev/nvidiactl")
AMD_VENDOR = "0x1002"


@dataclass(frozen=True)
class Identity:
    """Who would open the devices: the container runs as the host UID with these GIDs."""

    user: str
    uid: int
    gids: FrozenSet[int]


@dataclass(frozen=True)
class Group:
    name: str
    gid: int
    members: FrozenSet[str]


def current_identity() -> Identity:
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Identity(user, uid, frozenset([os.getgid(), *os.getgroups()]))


def read_groups(root: Path) -> Dict[int, Group]:
    """``<root>/etc/group`` by GID (empty when absent)."""
    groups: Dict[int, Group] = {}
    try:
        text = (Path(root) / "etc/group").read_text()
    except OSError:
        return groups
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) == 4 and fields[2].isdigit():
            members = frozenset(m for m in fields[3].split(",") if m)
            groups[int(fields[2])] = Group(fields[0], int(fields[2]), members)
    return groups


def can_open(path: Path, identity: Identity) -> bool:
    """Whether ``identity`` may open ``path`` read-write, by its owner, group and mode bits."""
    info = path.stat()
    if identity.uid == 0:
        return True
    if info.st_uid == identity.uid:
        wanted = stat.S_IRUSR | stat.S_IWUSR
    elif info.st_gid in identity.gids:
        wanted = stat.S_IRGRP | stat.S_IWGRP
    else:
        wanted = stat.S_IROTH | stat.S_IWOTH
    return info.st_mode & wanted == wanted


def render_nodes(root: Path) -> List[Path]:
    """AMD render nodes: ``/dev/dri/renderD*`` whose sysfs device is not another vendor's (nvidia-drm makes them too)."""
    directory = Path(root) / DRI
    nodes = sorted(directory.glob("renderD*")) if directory.is_dir() else []
    return [node for node in nodes if _drm_vendor(root, node.name) in (AMD_VENDOR, None)]


def _drm_vendor(root: Path, name: str) -> Optional[str]:
    try:
        return (Path(root) / "sys/class/drm" / name / "device/vendor").read_text().strip()
    except OSError:
        return None


def device_gids(root: Path) -> Tuple[Optional[int], Optional[int]]:
    """(video, render) GIDs the way .env derives them: the group of card0, and of /dev/kfd (else the render node)."""
    root = Path(root)
    card = root / DRI / "card0"
    kfd = root / KFD
    nodes = render_nodes(root)
    video = card.stat().st_gid if card.exists() else None
    render_source = kfd if kfd.exists() else (nodes[0] if nodes else None)
    return video, render_source.stat().st_gid if render_source else None


def _access_check(
    name: str, path: Path, root: Path, identity: Identity, groups: Dict[int, Group], container_gids: FrozenSet[int]
) -> Check:
    """Openable in this session (native runs), and by the container user, who also gets ``container_gids``."""
    info = path.stat()
    group = groups.get(info.st_gid)
    group_text = f"{group.name} (GID {info.st_gid})" if group else f"GID {info.st_gid}"
    shown = f"{stat.filemode(info.st_mode)} uid {info.st_uid} group {group_text}"
    if can_open(path, identity):
        return ok(name, f"{shown}; {identity.user} can open it")
    if not can_open(path, Identity(identity.user, identity.uid, identity.gids | container_gids)):
        return fail(
            name,
            f"{shown}; neither {identity.user} nor the container (which adds GIDs {sorted(container_gids)}) can open it",
            f"sudo chmod g+rw /{path.relative_to(root)} (and fix the udev rule that set it)",
        )
    outside = f"containers get GID {info.st_gid} through group_add, but {identity.user} cannot open it outside them"
    group_name = group.name if group else str(info.st_gid)
    if group and identity.user in group.members:
        return warn(
            name,
            f"{shown}; {outside}: in {group.name} in /etc/group, not in this session",
            f"for training outside containers: log out and back in (or `newgrp {group_name}`)",
        )
    return warn(
        name,
        f"{shown}; {outside}",
        f"for training outside containers: sudo usermod -aG {group_name} {identity.user}, then log out and back in",
    )


def _gid_text(gid: Optional[int], groups: Dict[int, Group]) -> str:
    return f"{gid} ({groups[gid].name if gid in groups else 'no name here'})"


def check_devices(root: Path, identity: Identity) -> List[Check]:
    """AMD compute devices: /dev/kfd and the DRI render nodes, with the GIDs compose will add."""
    root = Path(root)
    kfd = root / KFD
    nodes = render_nodes(root)
    if not kfd.exists() and not nodes:
        return [not_applicable("amd devices", "no /dev/kfd and no /dev/dri/renderD* (no AMD GPU): not for the rocm flavor")]
    groups = read_groups(root)
    video, render = device_gids(root)
    added = frozenset(gid for gid in (video, render) if gid is not None)
    checks: List[Check] = []
    if kfd.exists():
        checks.append(_access_check("/dev/kfd", kfd, root, identity, groups, added))
    else:
        checks.append(
            fail(
                "/dev/kfd",
                "missing, though /dev/dri has render nodes: the amdgpu driver runs without its compute (KFD) interface",
                "use a kernel built with CONFIG_HSA_AMD=y (every stock distribution kernel is), then reboot",
            )
        )
    if nodes:
        checks.extend(_access_check(f"/dev/dri/{n.name}", n, root, identity, groups, added) for n in nodes)
    else:
        checks.append(fail("/dev/dri", "no render node /dev/dri/renderD*", "load the amdgpu driver: sudo modprobe amdgpu"))
    shown = f"render GID {_gid_text(render, groups)}"
    if video is not None:
        shown = f"video GID {_gid_text(video, groups)} and {shown}"
    checks.append(ok("device gids", f"compose adds {shown}"))
    return checks


def check_nvidia_devices(root: Path, identity: Identity) -> List[Check]:
    """NVIDIA device nodes, for a CUDA machine: /dev/nvidiactl and /dev/nvidia0..."""
    root = Path(root)
    nodes = sorted(p for p in (root / "dev").glob("nvidia[0-9]*"))
    if not (root / NVIDIA).exists() and not nodes:
        return [not_applicable("nvidia devices", "no /dev/nvidia* (no NVIDIA GPU)")]
    groups = read_groups(root)
    present = [p for p in [root / NVIDIA, *nodes] if p.exists()]
    return [_access_check(f"/dev/{p.name}", p, root, identity, groups, frozenset()) for p in present]


def check_dotenv_gids(dotenv: Path, root: Path) -> Check:
    """Whether compose's ``.env`` carries this host's current video/render GIDs."""
    name = ".env gids"
    if not Path(dotenv).is_file():
        return fail(
            name,
            f"{dotenv} missing: compose cannot start",
            "run `invoke setup` (or `python -m trainbox doctor`, which writes it)",
        )
    values = dict(
        line.split("=", 1) for line in Path(dotenv).read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    video, render = device_gids(root)
    wanted = {"TRAINBOX_VIDEO_GID": video, "TRAINBOX_RENDER_GID": render}
    stale = [
        f"{k}={values.get(k, 'unset')} (devices say {v})" for k, v in wanted.items() if v is not None and values.get(k) != str(v)
    ]
    if stale:
        return fail(name, f"{dotenv}: " + "; ".join(stale), "run `invoke setup` (or `python -m trainbox doctor`) to rewrite .env")
    return ok(name, f"{dotenv} matches the devices' GIDs")
