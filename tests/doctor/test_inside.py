"""The inside doctor: kdb lookup, cache volumes, and a real run with this machine's CPU torch."""

from __future__ import annotations

import os
from pathlib import Path

from train.doctor import inside, report
from train.doctor.mounts import parse_mountinfo
from train.doctor.result import Status

MAPS = """\
7f0000000000-7f0000100000 r-xp 00000000 fd:00 123 /opt/venv/lib/python3.10/site-packages/torch/lib/libMIOpen.so
7f0000100000-7f0000200000 r--p 00100000 fd:00 123 /opt/venv/lib/python3.10/site-packages/torch/lib/libMIOpen.so
7f0000300000-7f0000400000 r-xp 00000000 fd:00 124 /opt/venv/lib/python3.10/site-packages/torch/lib/libamdhip64.so
7f0000500000-7f0000501000 rw-p 00000000 00:00 0
"""


def _wheel_layout(tmp_path: Path) -> Path:
    """torch/lib/libMIOpen.so with torch/share/miopen/db holding gfx1030_36.kdb and the gfx1030_18 alias."""
    library = tmp_path / "torch/lib/libMIOpen.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    db = tmp_path / "torch/share/miopen/db"
    db.mkdir(parents=True)
    (db / "gfx1030_36.kdb").write_bytes(b"k" * 4096)
    (db / "gfx1030_18.kdb").symlink_to("gfx1030_36.kdb")
    return library


def test_loaded_libraries_from_maps() -> None:
    assert inside.loaded_libraries(MAPS, "libMIOpen") == ["/opt/venv/lib/python3.10/site-packages/torch/lib/libMIOpen.so"]
    assert inside.loaded_libraries(MAPS, "libcudnn") == []


def test_kdb_next_to_the_library(tmp_path: Path) -> None:
    library = _wheel_layout(tmp_path)
    found = inside.check_kdb(library, "gfx1030_18", {})
    assert found.status is Status.OK
    assert "gfx1030_18.kdb -> gfx1030_36.kdb" in found.detail
    missing = inside.check_kdb(library, "gfx1030_20", {})
    assert missing.status is Status.FAIL
    assert "gfx1030_18.kdb, gfx1030_36.kdb" in missing.detail
    assert "add gfx1030_20 to MIOPEN_KDB_ALIASES" in missing.fix


def test_system_db_path_wins(tmp_path: Path) -> None:
    library = _wheel_layout(tmp_path)
    elsewhere = tmp_path / "opt/trainbox/miopen/db"
    elsewhere.mkdir(parents=True)
    environ = {"MIOPEN_SYSTEM_DB_PATH": str(elsewhere)}
    assert inside.system_db_dir(library, environ) == elsewhere
    check = inside.check_kdb(library, "gfx1030_18", environ)
    assert check.status is Status.FAIL
    assert "set MIOPEN_SYSTEM_DB_PATH" in check.fix


def test_cache_locations() -> None:
    environ = {"HOME": "/home/trainbox", "MIOPEN_CUSTOM_CACHE_DIR": "/cache/miopen/kernels"}
    assert inside.user_dirs(environ) == (Path("/home/trainbox/.config/miopen"), Path("/cache/miopen/kernels"))


def test_cache_on_a_volume_or_on_the_container_root(tmp_path: Path) -> None:
    """A container's layout with its volume mounted on tmp_path/cache (real, writable directories)."""
    (tmp_path / "cache").mkdir()
    mounts = parse_mountinfo(
        "135 108 0:50 / / rw,relatime - overlay overlay rw\n"
        f"156 135 254:0 /var/lib/docker/volumes/miopen-kernels/_data {tmp_path}/cache rw - ext4 /dev/vda rw\n"
    )
    assert inside.check_cache_dir("cache", tmp_path / "cache/kernels", mounts).status is Status.OK
    lost = inside.check_cache_dir("user db", tmp_path / "home/.config/miopen", mounts)
    assert lost.status is Status.FAIL
    assert "overlay" in lost.detail and "miopen-db" in lost.fix


def test_unwritable_cache_dir_fails(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    mounts = parse_mountinfo(f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:2 / {tmp_path} rw - ext4 /dev/sdb1 rw\n")
    check = inside.check_cache_dir("cache", locked / "kernels", mounts)
    expected = Status.OK if os.getuid() == 0 else Status.FAIL  # root writes through mode bits
    assert check.status is expected, check


def test_inside_doctor_with_cpu_torch() -> None:
    checks = inside.inside_checks()
    by_name = {c.name: c for c in checks}
    assert report.exit_status(checks) == 0, report.format_report(checks)
    assert by_name["gpu"].status is Status.NOT_APPLICABLE
    assert by_name["conv library"].status is Status.NOT_APPLICABLE
    assert by_name["miopen kdb"].status is Status.NOT_APPLICABLE
    assert by_name["convolution"].status is Status.OK
    assert by_name["convolution"].detail.startswith("on cpu: cold ")
