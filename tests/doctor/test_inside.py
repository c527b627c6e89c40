"""The inside doctor: kdb lookup, cache volumes, and a real run with this machine's CPU torch."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

from trainbox.doctor import inside, render
from trainbox.doctor.mounts import parse_mountinfo
from trainbox.doctor.result import Check, Status

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


CUDNN_MAPS = """\
7f1000000000-7f1000100000 r-xp 00000000 fd:00 201 /opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9
7f1000200000-7f1000300000 r-xp 00000000 fd:00 202 /opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9
7f1000400000-7f1000500000 r-xp 00000000 fd:00 203 /opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn_cnn.so.9
"""
H100 = inside.CudaDevice("NVIDIA H100 80GB HBM3", (9, 0), "13.2", 92600, ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"))


def test_compile_caches_on_volumes_or_in_the_container_tmp(tmp_path: Path) -> None:
    """The cuda image's layout: inductor and triton caches on their own volumes; torch's default under /tmp is not."""
    for name in ("inductor", "triton", "tmp"):
        (tmp_path / name).mkdir()
    mounts = parse_mountinfo(
        "135 108 0:50 / / rw,relatime - overlay overlay rw\n"
        f"156 135 254:0 /var/lib/docker/volumes/trainbox_torch-inductor/_data {tmp_path}/inductor rw - ext4 /dev/vda rw\n"
        f"157 135 254:0 /var/lib/docker/volumes/trainbox_torch-triton/_data {tmp_path}/triton rw - ext4 /dev/vda rw\n"
    )
    image = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    kept = inside.check_compile_caches(image, "trainbox", mounts)
    assert [(c.name, c.status) for c in kept] == [("inductor cache", Status.OK), ("triton cache", Status.OK)]
    assert "trainbox_torch-triton" in kept[1].detail
    lost = inside.check_compile_caches({"TMPDIR": str(tmp_path / "tmp")}, "trainbox", mounts)
    assert [c.status for c in lost] == [Status.FAIL, Status.FAIL]
    assert f"{tmp_path}/tmp/torchinductor_trainbox: NOT persistent overlay" in lost[0].detail
    assert "torch-inductor and torch-triton" in lost[0].fix


def test_cudnn_version_numbers() -> None:
    assert inside.cudnn_version_text(92600) == "9.26.0"
    assert inside.cudnn_version_text(91002) == "9.10.2"
    assert inside.cudnn_version_text(8907) == "8.9.7"


def test_cudnn_version_of_this_torch_matches_its_wheel() -> None:
    torch = pytest.importorskip("torch")
    version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if version is None:
        pytest.skip("this torch has no cuDNN")
    try:
        wheel = importlib.metadata.version(f"nvidia-cudnn-cu{torch.version.cuda.split('.')[0]}")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("cuDNN does not come from an nvidia-cudnn wheel here")
    assert wheel.startswith(inside.cudnn_version_text(version) + ".")


@pytest.mark.parametrize(
    "capability, archs, runs",
    [
        ((9, 0), H100.arch_list, True),  # H100: sm_90 cubins
        ((8, 9), ("sm_80", "sm_86"), True),  # Ada runs Ampere's 8.6 cubins
        ((12, 1), ("sm_120",), True),
        ((7, 0), H100.arch_list, False),  # V100: no sm_70 cubins, no PTX
        ((10, 0), ("sm_90a",), False),  # arch-specific cubins run on 9.0 only
        ((9, 0), ("sm_90a",), True),
        ((12, 0), ("sm_80", "compute_90"), True),  # PTX is JIT-compiled for newer GPUs
        ((8, 6), ("compute_90",), False),
    ],
)
def test_runs_on(capability: tuple[int, int], archs: tuple[str, ...], runs: bool) -> None:
    assert inside.runs_on(capability, archs) is runs


def test_cuda_device_check() -> None:
    check = inside.check_cuda(H100)
    assert check.status is Status.OK
    assert check.detail == "NVIDIA H100 80GB HBM3, compute capability 9.0 (sm_90), CUDA 13.2, cuDNN 9.26.0"
    v100 = inside.check_cuda(inside.CudaDevice("Tesla V100-SXM2-16GB", (7, 0), "13.2", 92600, H100.arch_list))
    assert v100.status is Status.FAIL and "sm_70 kernels" in v100.fix
    no_cudnn = inside.check_cuda(inside.CudaDevice(H100.name, H100.capability, H100.cuda, None, H100.arch_list))
    assert no_cudnn.status is Status.FAIL and "no cuDNN" in no_cudnn.detail


def test_cudnn_sub_libraries_are_not_copies() -> None:
    check, library = inside.check_library(CUDNN_MAPS, "cuda")
    assert check.status is Status.OK
    assert check.detail.endswith("libcudnn.so.9 (SONAME none), with 2 more libcudnn* libraries")
    assert library is not None and library.name == "libcudnn.so.9"
    two = CUDNN_MAPS + "7f2000000000-7f2000100000 r-xp 00000000 fd:00 301 /usr/lib/x86_64-linux-gnu/libcudnn.so.8\n"
    assert inside.check_library(two, "cuda")[0].status is Status.WARN


def test_the_real_libcudnn_of_this_torch() -> None:
    """This process maps libcudnn once torch asks for its version (no GPU needed): one copy, SONAME from the file."""
    torch = pytest.importorskip("torch")
    if not torch.backends.cudnn.is_available():
        pytest.skip("this torch has no cuDNN")
    torch.backends.cudnn.version()
    check, library = inside.check_library(Path("/proc/self/maps").read_text(), "cuda")
    assert check.status is Status.OK, check
    assert library is not None and f"(SONAME {library.name})" in check.detail


def test_why_cuda_does_not_apply() -> None:
    assert inside.no_cuda_reason(None, "13.2") == "torch.cuda.is_available() is False (CUDA 13.2 build, no NVIDIA GPU visible)"
    assert inside.no_cuda_reason("5.2.21151-afdc89f8", None).startswith("a ROCm build of torch")
    assert inside.no_cuda_reason(None, None) == "a CPU build of torch (no CUDA)"


def test_inside_doctor_with_cpu_torch() -> None:
    import torch

    checks = inside.inside_checks()
    by_name = {c.name: c for c in checks}
    assert render.exit_status(checks) == 0, render.format_report(checks)
    assert by_name["gpu"].status is Status.NOT_APPLICABLE
    assert by_name["conv library"].status is Status.NOT_APPLICABLE
    assert by_name["miopen kdb"].status is Status.NOT_APPLICABLE
    reason = inside.no_cuda_reason(torch.version.hip, torch.version.cuda)
    assert by_name["cuda"] == Check("cuda", Status.NOT_APPLICABLE, reason)
    assert by_name["torch.compile caches"].status is Status.NOT_APPLICABLE
    assert by_name["convolution"].status is Status.OK
    assert by_name["convolution"].detail.startswith("on cpu: cold ")
