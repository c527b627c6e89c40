"""Which checkpoint a restart resumes from, in milliseconds: the newest complete one, and a folder of anything fuzzed."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainbox.supervise.resume.checkpoints import UNKNOWN, Checkpoint, choose, find, problem, step_of


def torch_file(path: Path, mtime: float, cut: Optional[int] = None) -> Path:
    """A file laid out as torch.save writes it (a stored zip, data.pkl first); ``cut``: only its first bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", bytes(4096))
    if cut is not None:
        path.write_bytes(path.read_bytes()[:cut])
    os.utime(path, (mtime, mtime))
    return path


def trainer_checkpoint(folder: Path, step: int, mtime: float, state: Optional[str] = "whole") -> Path:
    """A Trainer's checkpoint-N: weights, and trainer_state.json (whole, cut off, or not yet written)."""
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * 100)
    if state is not None:
        text = json.dumps({"global_step": step, "epoch": 1.0})
        (path / "trainer_state.json").write_text(text if state == "whole" else text[:10])
    for file in path.iterdir():
        os.utime(file, (mtime, mtime))
    return path


def newest(patterns: tuple, root: Path, since: Optional[float] = None) -> Optional[Checkpoint]:
    return choose(find(patterns, [root], since))[0]


def test_the_newest_complete_file_is_chosen_and_a_cut_off_one_passed_over(tmp_path: Path) -> None:
    torch_file(tmp_path / "ck" / "step-10.pt", 1000.0)
    torch_file(tmp_path / "ck" / "step-20.pt", 2000.0)
    torch_file(tmp_path / "ck" / "step-30.pt", 3000.0, cut=3000)  # killed while it was written
    (tmp_path / "ck" / "step-40.pt").write_bytes(b"")
    os.utime(tmp_path / "ck" / "step-40.pt", (4000.0, 4000.0))
    chosen, passed = choose(find(("ck/*.pt",), [tmp_path]))
    assert chosen == Checkpoint(tmp_path / "ck" / "step-20.pt", 2000.0, 20, chosen.size if chosen else 0)
    assert [(Path(path).name, why) for path, why in passed] == [
        ("step-40.pt", "empty"),
        ("step-30.pt", "not a whole zip archive (cut off while it was written?)"),
    ]


def test_a_file_that_grew_since_it_was_found_is_still_being_written(tmp_path: Path) -> None:
    torch_file(tmp_path / "a.pt", 1000.0)
    growing = torch_file(tmp_path / "b.pt", 2000.0)
    found = find(("*.pt",), [tmp_path])
    with open(growing, "ab") as handle:
        handle.write(b"more")
    chosen, passed = choose(found)
    assert chosen is not None and chosen.path.name == "a.pt" and passed == [(str(growing), "still being written")]


def test_a_trainer_checkpoint_counts_once_its_trainer_state_is_whole(tmp_path: Path) -> None:
    trainer_checkpoint(tmp_path / "out", 50, 1000.0)
    trainer_checkpoint(tmp_path / "out", 100, 2000.0, state="cut")
    trainer_checkpoint(tmp_path / "out", 150, 3000.0, state=None)
    chosen, passed = choose(find(("out/checkpoint-*",), [tmp_path]))
    assert chosen is not None and (chosen.path.name, chosen.step) == ("checkpoint-50", 50)
    assert [why for _, why in passed] == ["no trainer_state.json (the save did not finish)", "trainer_state.json is cut off"]


def test_a_torchtitan_step_counts_once_its_metadata_is_written(tmp_path: Path) -> None:
    for step, done in ((10, True), (20, False)):
        folder = tmp_path / "checkpoint" / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / "__0_0.distcp").write_bytes(b"x" * 10)
        if done:
            (folder / ".metadata").write_bytes(b"m")
    assert problem(tmp_path / "checkpoint" / "step-20") == "no .metadata (the save did not finish)"
    chosen = newest(("checkpoint/step-*",), tmp_path)
    assert chosen is not None and chosen.path.name == "step-10" and chosen.step == 10


def test_checkpoints_older_than_the_run_are_not_its_own(tmp_path: Path) -> None:
    torch_file(tmp_path / "runs" / "detect" / "train" / "weights" / "last.pt", 1000.0)
    assert newest(("runs/*/train*/weights/last.pt",), tmp_path, since=1500.0) is None
    torch_file(tmp_path / "runs" / "detect" / "train2" / "weights" / "last.pt", 2000.0)
    chosen = newest(("runs/*/train*/weights/last.pt",), tmp_path, since=1500.0)
    assert chosen is not None and chosen.path.parent.parent.name == "train2"


def test_other_files_need_only_be_there_and_whole(tmp_path: Path) -> None:
    (tmp_path / "state.bin").write_bytes(b"anything")
    (tmp_path / "fake.pt").write_bytes(b"not a torch file")
    (tmp_path / "legacy.pt").write_bytes(b"\x80\x02legacy pickle")
    (tmp_path / "empty").mkdir()
    os.symlink(tmp_path / "state.bin", tmp_path / "link.bin")
    assert problem(tmp_path / "state.bin") is None and problem(tmp_path / "legacy.pt") is None
    assert problem(tmp_path / "fake.pt") == "not a torch.save file (neither a zip archive nor a pickle)"
    assert problem(tmp_path / "empty") == "an empty folder"
    assert problem(tmp_path / "link.bin") == "not a plain file or folder" and problem(tmp_path / "gone") == "gone"


def test_a_step_is_read_from_the_name_or_the_trainer_state(tmp_path: Path) -> None:
    names = {"checkpoint-500": 500, "epoch=3-step=340.ckpt": 340, "iter_900.pt": 900, "ckpt.pt": None, "step-9" * 9: 9}
    assert {name: step_of(tmp_path / name) for name in names} == names
    assert step_of(tmp_path / ("step-" + "9" * 30)) is None


# -- fuzzed: whatever a checkpoint folder holds ---------------------------------------------------------------

ENTRY = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b"PK\x03\x04", b"PK\x03\x04" + bytes(100), b"\x80\x04", b"{", b'{"global_step": 7}']),
)
NAMES = st.sampled_from(
    ["a.pt", "b.ckpt", "checkpoint-1", "checkpoint-x", "step-3", "ckpt.pt", "x.bin", "checkpoint-2/trainer_state.json",
     "step-3/.metadata", "checkpoint-1/model.bin", "deep/er/c.pt"]
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(NAMES, st.tuples(ENTRY, st.integers(0, 5000)), max_size=8), cut=st.booleans())
def test_any_folder_gives_a_complete_checkpoint_or_none_never_an_error(tmp_path: Path, files: Dict, cut: bool) -> None:
    root = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
    for name, (data, mtime) in files.items():
        path = root / name
        if path.parent.exists() and not path.parent.is_dir():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            continue
        path.write_bytes(data)
        os.utime(path, (mtime, mtime))
    if cut and (root / "a.pt").is_file():
        torch_file(root / "a.pt", 4000.0, cut=200)
    chosen, passed = choose(find(("*", "**/*.pt", "*/*"), [root]))
    if chosen is not None:
        assert problem(chosen.path) is None and chosen.path.is_relative_to(root)
    assert all(why for _, why in passed)


# -- folders without a marker: every torch and safetensors file whole ----------------------------------------------


def accelerate_checkpoint(folder: Path, mtime: float, cut: Optional[str] = None) -> Path:
    """A folder as accelerate's ``save_state`` writes it (``checkpoint_N``: safetensors weights, torch.save'd optimizer
    and random states); ``cut``: the file a kill during the save left half written."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file({"weight": np.zeros((16, 16), dtype=np.float32)}, str(folder / "model.safetensors"))
    torch_file(folder / "optimizer.bin", mtime)
    torch_file(folder / "random_states_0.pkl", mtime)
    if cut is not None:
        whole = (folder / cut).read_bytes()
        (folder / cut).write_bytes(whole[: len(whole) // 2])
    for file in folder.iterdir():
        os.utime(file, (mtime, mtime))
    return folder


@pytest.mark.parametrize("cut", ["optimizer.bin", "model.safetensors", "random_states_0.pkl"])
def test_a_folder_without_a_marker_counts_only_when_each_of_its_archives_is_whole(tmp_path: Path, cut: str) -> None:
    whole = accelerate_checkpoint(tmp_path / "checkpoints" / "checkpoint_0", 1000.0)
    accelerate_checkpoint(tmp_path / "checkpoints" / "checkpoint_1", 2000.0, cut=cut)  # killed during the save
    chosen, passed = choose(find(("checkpoints/checkpoint_*",), [tmp_path]))
    assert chosen is not None and chosen.path == whole, passed
    assert [Path(path).name for path, _ in passed] == ["checkpoint_1"] and passed[0][1].startswith(f"{cut}: ")


def test_a_folder_with_nothing_to_check_ranks_below_a_whole_one(tmp_path: Path) -> None:
    whole = accelerate_checkpoint(tmp_path / "ck" / "a", 1000.0)
    unknown = tmp_path / "ck" / "b"
    unknown.mkdir()
    (unknown / "state.json").write_text("{}")
    chosen, passed = choose(find(("ck/*",), [tmp_path]))
    assert chosen is not None and chosen.path == whole and passed == [(str(unknown), UNKNOWN)]
    alone, _ = choose(find(("ck/b",), [tmp_path]))
    assert alone is not None and alone.path == unknown, "taken when nothing whole is there"


def test_a_safetensors_file_is_whole_when_it_is_as_long_as_its_header_says(tmp_path: Path) -> None:
    folder = accelerate_checkpoint(tmp_path / "c", 1000.0)
    data = (folder / "model.safetensors").read_bytes()
    cases = {"whole": data, "longer": data + b"x", "header": data[:12], "short": data[:5], "lying": b"\xff" * 8 + data[8:]}
    for name, content in cases.items():
        (tmp_path / f"{name}.safetensors").write_bytes(content)
    found = {name: problem(tmp_path / f"{name}.safetensors") for name in cases}
    assert found["whole"] is None and all(found[name] for name in cases if name != "whole"), found


# -- what a look costs: a stat of the newest, never a read of every old checkpoint ------------------------------

_opened: List[str] = []
_counting: List[Path] = []


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and _counting and isinstance(args[0], str) and args[0].startswith(str(_counting[0])):
        _opened.append(args[0])


sys.addaudithook(_count_opens)


def files_read(root: Path, patterns: tuple) -> Tuple[Optional[Checkpoint], List[str]]:
    """The checkpoint one look chooses, and the files under ``root`` it opened (Python's ``open`` audit event)."""
    _opened.clear()
    _counting[:] = [root]
    try:
        return choose(find(patterns, [root]))[0], list(_opened)
    finally:
        _counting.clear()


@pytest.mark.parametrize("written", [5, 150])
def test_a_look_reads_the_same_few_files_after_5_checkpoints_as_after_150(tmp_path: Path, written: int) -> None:
    for step in range(1, written + 1):
        trainer_checkpoint(tmp_path / "out", step * 10, 1000.0 + step)
    chosen, read = files_read(tmp_path, ("out/checkpoint-*",))
    newest = tmp_path / "out" / f"checkpoint-{written * 10}"
    assert chosen is not None and (chosen.path, chosen.step) == (newest, written * 10)
    assert read == [str(newest / "trainer_state.json")] * 2, "its marker checked, then its step read: nothing else"
