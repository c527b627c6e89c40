"""The fault injector in-process: ``chance=P`` (a random hang at a set rate, the same hangs again for the same
seed) and the fail-slow kinds and conditions (the hangs are exercised by every supervisor test)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainbox import faults
from trainbox.heartbeat import ATTEMPT_ENV


def fired(spec: str, monkeypatch: pytest.MonkeyPatch, seed: str = "0", steps: int = 2000) -> list:
    monkeypatch.setenv(faults.FAULT_ENV, spec)
    monkeypatch.setenv(faults.SEED_ENV, seed)
    (fault,) = faults.parse(spec)
    return [step for step in range(steps) if fault.matches("step", {"attempt": "0", "step": step})]


def test_chance_fires_at_its_rate_and_the_same_steps_for_the_same_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = fired("sleep@step,chance=5", monkeypatch)
    assert 60 <= len(hung) <= 140, "about 5 % of 2000 calls"
    assert fired("sleep@step,chance=5", monkeypatch) == hung, "repeatable"
    assert fired("sleep@step,chance=5", monkeypatch, seed="1") != hung, "another seed, other steps"
    assert set(fired("sleep@step,chance=5,step>=1000", monkeypatch)) == {s for s in hung if s >= 1000}
    assert fired("sleep@step,chance=0", monkeypatch) == [] and len(fired("sleep@step,chance=100", monkeypatch)) == 2000


def test_chance_takes_a_decimal_percentage(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = fired("sleep@step,chance=0.5", monkeypatch, steps=20000)
    assert 60 <= len(hung) <= 140, "about 0.5 % of 20000 calls"
    for bad in ("chance=x", "chance=101", "chance=-1", "chance=nan"):
        with pytest.raises(ValueError, match="a percentage from 0 to 100"):
            faults.parse(f"sleep@step,{bad}")


def test_conditions_take_a_range() -> None:
    (fault,) = faults.parse("leak@step,attempt=0,step>=3,step<5")
    assert fault.conditions == (("attempt", "=", 0), ("step", ">=", 3), ("step", "<", 5))
    assert [fault.matches("step", {"attempt": 0, "step": n}) for n in range(7)] == [False] * 3 + [True] * 2 + [False] * 2
    assert not fault.matches("step", {"attempt": 1, "step": 4}) and not fault.matches("getitem", {"attempt": 0, "step": 4})
    with pytest.raises(ValueError, match="KEY<INT"):
        faults.parse("slow@step,step<x")


def _timed(site: str, **context: object) -> float:
    started = time.monotonic()
    faults.point(site, **context)
    return time.monotonic() - started


def test_slow_stretches_what_its_site_took(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "slow@getitem,index>=10")
    monkeypatch.setenv(faults.FACTOR_ENV, "5")
    assert _timed("getitem", index=3, took=0.05) < 0.04  # before its condition holds: untouched
    assert 0.18 <= _timed("getitem", index=10, took=0.05) < 0.5  # 4 more times the 0.05 s it took


def test_slow_without_took_stretches_the_time_between_hits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "slow@step")
    monkeypatch.setenv(faults.FACTOR_ENV, "3")
    monkeypatch.setattr(faults, "_last_slow", [])
    faults.point("step")
    time.sleep(0.1)
    assert 0.18 <= _timed("step") < 0.5  # the 0.1 s since the last hit, twice more


def test_leak_keeps_resident_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(faults.FAULT_ENV, "leak@step,step<2")
    monkeypatch.setenv(faults.LEAK_MB_ENV, "2")
    monkeypatch.setattr(faults, "_leaked", [])
    for step in range(4):
        faults.point("step", step=step)
    assert [len(block) for block in faults._leaked] == [2 * 2**20] * 2
    assert all(block[4096 * 7] == 1 for block in faults._leaked)


@pytest.mark.parametrize("kind", sorted(faults.TORCH_KINDS))
def test_a_torch_hang_is_armed_with_torch_imported_before_the_first_beat(kind: str, tmp_path: Path) -> None:
    # A stall found during `import torch` (seconds of Python on a loaded machine) would be busy_python, not the hang.
    probe = "import sys; from trainbox import faults; faults.main(['--steps', '1']); print('torch' in sys.modules)"
    env = {"PATH": "/usr/bin:/bin", faults.FAULT_ENV: f"{kind}@step,step=99", "TRAIN_RUN_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "True"
    unarmed = subprocess.run([sys.executable, "-c", probe], env={**env, faults.FAULT_ENV: "sleep@step,step=99"},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert unarmed.stdout.splitlines()[-1] == "False", "no other fault pays for the import"


def test_the_output_site_is_placed_by_what_was_printed_however_often_a_bar_was_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``seen`` counts the writes that showed TRAIN_FAULT_TEXT: the same place whether a bar drew 2 states or 20."""
    monkeypatch.setenv(ATTEMPT_ENV, "0")
    monkeypatch.setenv(faults.FAULT_ENV, "raise@output,seen>=1")
    monkeypatch.setenv(faults.TEXT_ENV, "1/2  ")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert faults.watch_output()
    for draw in range(20):  # a scan bar: as many states as the machine's speed gave it time to draw
        sys.stdout.write(f"\rScanning {draw}/20")
    sys.stderr.write("\n      Epoch    GPU_mem\n")
    sys.stdout.write("\r: 0% 0/4")
    sys.stdout.write("\r        1/2         0G      3.123  0/4")  # epoch 1 of 2 shown: the next write hangs
    with pytest.raises(RuntimeError, match="injected exception"):
        sys.stdout.write("\r        1/2         0G      3.101  1/4")
    drawn = sys.stdout._stream.getvalue()  # type: ignore[attr-defined]
    assert drawn.endswith("0G      3.123  0/4") and drawn.count("\r") == 22


def test_without_a_text_nothing_is_seen() -> None:
    written = faults._Written()
    for text in ("\r        1/2         0G", "done\n"):
        written.add(text)
    assert (written.lines, written.seen) == (2, 0)


#: A program that saves three checkpoints, torch.save to a path, into a buffer then Path.write_bytes (as Ultralytics
#: does), and says whether torch was imported before its own import of it.
SAVING = """
import io, sys
from pathlib import Path
before = 'torch' in sys.modules
import torch
for i in range(3):
    torch.save({'w': torch.zeros(50_000), 'i': i}, f'path-{i}.pt')
    buffer = io.BytesIO()
    torch.save({'i': i}, buffer)
    Path(f'bytes-{i}.pt').write_bytes(buffer.getvalue())
    print('saved', i, before, flush=True)
"""


def saving(tmp_path: Path, fault: str, counted: str) -> subprocess.CompletedProcess:
    paths = [str(Path(__file__).parent / "fixtures" / "uninstrumented"), *sys.path]
    env = {"PYTHONPATH": os.pathsep.join(paths), ATTEMPT_ENV: "0", faults.FAULT_ENV: fault, faults.CHECKPOINT_ENV: counted}
    return subprocess.run([sys.executable, "-c", SAVING], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_kill_during_a_checkpoint_write_leaves_it_half_written_and_the_earlier_ones_whole(tmp_path: Path) -> None:
    import torch

    done = saving(tmp_path, "sigkill@checkpoint,saves>=1", "path-")
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.splitlines() == ["saved 0 False"], "killed in the second save; torch imported by the program"
    assert torch.load(tmp_path / "path-0.pt")["i"] == 0
    whole = (tmp_path / "path-0.pt").stat().st_size
    assert (tmp_path / "path-1.pt").stat().st_size == whole // 2, "half of it on disk"
    with pytest.raises(RuntimeError):
        torch.load(tmp_path / "path-1.pt")


def test_write_bytes_is_the_site_too_and_an_unarmed_program_saves_whole_files(tmp_path: Path) -> None:
    import torch

    (tmp_path / "killed").mkdir()
    killed = saving(tmp_path / "killed", "sigkill@checkpoint,saves>=2", "bytes-")
    assert killed.returncode == -signal.SIGKILL and len(killed.stdout.splitlines()) == 2, killed.stderr
    assert (tmp_path / "killed" / "bytes-2.pt").stat().st_size < (tmp_path / "killed" / "bytes-1.pt").stat().st_size
    (tmp_path / "whole").mkdir()
    whole = saving(tmp_path / "whole", "sleep@output,lines>=999", "")
    assert whole.returncode == 0 and len(whole.stdout.splitlines()) == 3, whole.stderr
    assert [torch.load(tmp_path / "whole" / f"path-{i}.pt")["i"] for i in range(3)] == [0, 1, 2]


def test_a_fault_armed_for_a_node_of_a_slurm_job_fires_on_that_node_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``node`` comes from ``SLURM_NODEID``: a real ``raise`` fault, fired on node 1 and not on node 0 or outside Slurm."""
    monkeypatch.setenv(faults.FAULT_ENV, "raise@step,node=1")
    for node in ("0", None):
        if node is None:
            monkeypatch.delenv("SLURM_NODEID", raising=False)
        else:
            monkeypatch.setenv("SLURM_NODEID", node)
        faults.point("step", step=1)  # nothing fires
    monkeypatch.setenv("SLURM_NODEID", "1")
    with pytest.raises(RuntimeError):
        faults.point("step", step=1)
