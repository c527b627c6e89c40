"""Persistent or not, from the mountinfo of a real trainbox container."""

from __future__ import annotations

from tests.paths import FIXTURES
from trainbox.doctor.mounts import mount_of, parse_mountinfo

CONTAINER = parse_mountinfo((FIXTURES / "mountinfo/docker-cpu-container.txt").read_text())


def test_named_volume_is_persistent() -> None:
    mount = mount_of("/cache/miopen/kernels/2.17.0/gfx1030_18.ukdb", CONTAINER)
    assert mount is not None and mount.mount_point == "/cache/miopen/kernels"
    assert mount.persistent
    assert mount.root == "/var/lib/docker/volumes/trainbox-doctor-probe/_data"


def test_container_root_and_tmpfs_are_not() -> None:
    home = mount_of("/home/trainbox/.cache/miopen", CONTAINER)
    assert home is not None and (home.mount_point, home.fstype, home.persistent) == ("/", "overlay", False)
    shm = mount_of("/dev/shm/torch_1", CONTAINER)
    assert shm is not None and (shm.mount_point, shm.persistent) == ("/dev/shm", False)
    assert "NOT persistent" in home.describe()


def test_bind_mount_and_escaped_names() -> None:
    assert mount_of("/runs/demo", CONTAINER).persistent  # type: ignore[union-attr]
    mounts = parse_mountinfo("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:2 /x /my\\040cache rw - xfs /dev/sdb1 rw\n")
    mount = mount_of("/my cache/kernels", mounts)
    assert mount is not None and (mount.mount_point, mount.fstype, mount.persistent) == ("/my cache", "xfs", True)
    assert mount_of("/my cachex", mounts).mount_point == "/"  # type: ignore[union-attr]
