"""Whether a program would find a GPU here, read from a machine's files (a folder stands for its root)."""

from __future__ import annotations

from pathlib import Path

from trainbox.system import gpus


def test_a_gpu_is_seen_in_the_drivers_lists_unless_the_environment_hides_it(tmp_path: Path) -> None:
    assert not gpus.visible({}, tmp_path), "no driver lists a GPU: the CPU"
    (tmp_path / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    assert gpus.visible({}, tmp_path)
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path)
    assert not gpus.visible({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)
    assert not gpus.visible({"HIP_VISIBLE_DEVICES": "-1"}, tmp_path)


def test_an_amd_gpu_is_a_kfd_node_with_compute_units(tmp_path: Path) -> None:
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0" / "properties").write_text("cpu_cores_count 16\nsimd_count 0\n")
    assert not gpus.visible({}, tmp_path), "a CPU node only"
    (nodes / "1").mkdir()
    (nodes / "1" / "properties").write_text("cpu_cores_count 0\nsimd_count 88\ngfx_target_version 100100\n")
    assert gpus.visible({}, tmp_path)
