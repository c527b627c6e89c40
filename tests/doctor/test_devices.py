"""Device nodes, permission bits and groups, on copies of recorded trees with real modes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import pytest

from tests.hosts import host
from trainbox.doctor import devices
from trainbox.doctor.devices import Identity
from trainbox.doctor.result import Status

ALICE_UID = 4321


def _amd_tree(host_copy, mode: int, members: Iterable[str]) -> Path:
    """rx5600xt with device modes ``mode`` and a ``render`` group at the devices' real GID."""
    root: Path = host_copy("rx5600xt")
    for device in (root / "dev/kfd", root / "dev/dri/renderD128", root / "dev/dri/card0"):
        device.chmod(mode)
    gid = (root / "dev/kfd").stat().st_gid
    (root / "etc/group").write_text(f"render:x:{gid}:{','.join(members)}\n")
    return root


def _alice(*gids: int) -> Identity:
    return Identity("alice", ALICE_UID, frozenset(gids))


def test_member_of_the_device_group_can_open(host_copy) -> None:
    root = _amd_tree(host_copy, 0o660, ["alice"])
    gid = (root / "dev/kfd").stat().st_gid
    checks = devices.check_devices(root, _alice(gid))
    assert [c.status for c in checks] == [Status.OK] * 3, checks
    assert f"render GID {gid} (render)" in checks[-1].detail


def test_group_added_but_not_in_this_session(host_copy) -> None:
    root = _amd_tree(host_copy, 0o660, ["alice"])
    kfd_check = devices.check_devices(root, _alice())[0]
    assert kfd_check.status is Status.WARN  # the container still gets the GID through group_add
    assert "through group_add" in kfd_check.detail and "not in this session" in kfd_check.detail
    assert "log out and back in" in kfd_check.fix


def test_not_in_the_group(host_copy) -> None:
    root = _amd_tree(host_copy, 0o660, [])
    kfd_check = devices.check_devices(root, _alice())[0]
    assert kfd_check.status is Status.WARN
    assert "sudo usermod -aG render alice" in kfd_check.fix


def test_device_not_group_writable(host_copy) -> None:
    root = _amd_tree(host_copy, 0o600, ["alice"])
    gid = (root / "dev/kfd").stat().st_gid
    kfd_check = devices.check_devices(root, _alice(gid))[0]
    assert kfd_check.status is Status.FAIL
    assert "nor the container" in kfd_check.detail
    assert "chmod g+rw /dev/kfd" in kfd_check.fix


def test_render_node_by_its_own_bits(host_copy) -> None:
    root = _amd_tree(host_copy, 0o660, [])
    node = root / "dev/dri/renderD128"
    node.chmod(0o606)  # read-write for everyone but its group: no group needed
    assert devices.check_devices(root, _alice())[1].status is Status.OK
    node.chmod(0o600)
    assert devices.check_devices(root, _alice())[1].status is Status.FAIL


def test_world_accessible_device_and_root(host_copy) -> None:
    root = _amd_tree(host_copy, 0o666, [])
    assert devices.can_open(root / "dev/kfd", _alice())
    (root / "dev/kfd").chmod(0o000)
    assert not devices.can_open(root / "dev/kfd", _alice())
    assert devices.can_open(root / "dev/kfd", Identity("root", 0, frozenset({0})))


def test_render_nodes_without_kfd_fail(host_copy) -> None:
    root: Path = host_copy("rx5600xt")
    (root / "dev/kfd").unlink()
    checks = devices.check_devices(root, devices.current_identity())
    assert checks[0].status is Status.FAIL
    assert "CONFIG_HSA_AMD" in checks[0].fix


def test_nvidia_render_nodes_are_not_amd() -> None:
    (check,) = devices.check_devices(host("nvidia"), devices.current_identity())
    assert check.status is Status.NOT_APPLICABLE
    nvidia = devices.check_nvidia_devices(host("nvidia"), devices.current_identity())
    assert [c.name for c in nvidia] == ["/dev/nvidiactl", "/dev/nvidia0"]


def test_no_gpu_is_not_applicable() -> None:
    assert [c.status for c in devices.check_devices(host("no-gpu"), devices.current_identity())] == [Status.NOT_APPLICABLE]
    assert devices.device_gids(host("no-gpu"))[1] is None


def test_read_groups_of_a_recorded_host() -> None:
    groups = devices.read_groups(host("rx5600xt"))
    assert (groups[44].name, groups[109].name) == ("video", "render")
    assert "alice" in groups[109].members


@pytest.mark.parametrize("written, status", [("right", Status.OK), ("stale", Status.FAIL), (None, Status.FAIL)])
def test_dotenv_gids(tmp_path: Path, written: str, status: Status) -> None:
    root = host("rx5600xt")
    video, render = devices.device_gids(root)
    dotenv = tmp_path / ".env"
    if written is not None:
        render_text = str(render) if written == "right" else str(render + 1)
        dotenv.write_text(f"# generated\nTRAINBOX_VIDEO_GID={video}\nTRAINBOX_RENDER_GID={render_text}\n")
    check = devices.check_dotenv_gids(dotenv, root)
    assert check.status is status, check
    if status is Status.FAIL:
        assert "invoke setup" in check.fix


def test_current_identity_is_this_process() -> None:
    identity = devices.current_identity()
    assert identity.uid == os.getuid()
    assert os.getgid() in identity.gids
