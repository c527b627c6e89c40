"""examples/plain_pytorch.py: someone's own PyTorch script, supervised with one added line.

Its device handling is tested on whatever this machine has: without a GPU,
``--device cuda`` and ``--amp`` end in one line, and a checkpoint as a GPU run
writes it resumes on the CPU; with one, the script trains there with ``--amp``
and a CPU checkpoint resumes on it, and back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

from tests.supervised import REPO, survivors, train_cli

pytestmark = pytest.mark.training  # the example trains with torch for real

EXAMPLE = REPO / "examples" / "plain_pytorch.py"
#: Two batches per epoch, no worker processes: seconds per run.
QUICK = ["--samples", "64", "--batch", "32", "--workers", "0"]


def example(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the example unsupervised in ``cwd`` (its checkpoint: cwd/plain.pt)."""
    command = [sys.executable, str(EXAMPLE), *QUICK, "--checkpoint", str(cwd / "plain.pt"), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused run (exit 2, no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("plain_pytorch.py: error: "), lines[0]
    return lines[0]


def tag_as_written_on_a_gpu(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite a checkpoint with every tensor recorded on cuda:0, byte for byte what ``torch.save`` writes on a GPU.

    A checkpoint says which device its tensors were on only through each storage's location tag.
    """
    state = torch.load(path, weights_only=True)
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, path)


def test_device_cuda_trains_on_the_gpu_or_ends_in_one_line(tmp_path: Path) -> None:
    result = example(["--epochs", "1", "--device", "cuda", "--amp"], tmp_path)
    if not torch.cuda.is_available():
        assert "torch sees no GPU" in one_line_error(result)
        assert not (tmp_path / "plain.pt").exists()
        return
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("training on cuda (") and ", amp " in result.stdout.splitlines()[0], result.stdout
    assert (tmp_path / "plain.pt").stat().st_size > 0


def test_amp_on_the_cpu_is_refused_in_one_line(tmp_path: Path) -> None:
    assert "--amp needs a GPU" in one_line_error(example(["--device", "cpu", "--amp"], tmp_path))


def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tmp_path / "plain.pt"
    if torch.cuda.is_available():
        first = example(["--epochs", "1", "--device", "cuda"], tmp_path)
        assert first.returncode == 0 and first.stdout.startswith("training on cuda ("), first.stdout + first.stderr
    else:
        first = example(["--epochs", "1", "--device", "cpu"], tmp_path)
        assert first.returncode == 0, first.stderr
        tag_as_written_on_a_gpu(checkpoint, monkeypatch)
        with pytest.raises(RuntimeError, match="CUDA"):  # what a load without map_location does here
            torch.load(checkpoint, weights_only=True)

    resumed = example(["--epochs", "2", "--device", "cpu"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[:2] == ["training on cpu (CPU), fp32", f"resumed from {checkpoint} at epoch 1"]
    assert "epoch 1 loss " in resumed.stdout
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 1
    if torch.cuda.is_available():  # and back: the CPU's checkpoint continues on the GPU
        again = example(["--epochs", "3", "--device", "cuda"], tmp_path)
        assert again.returncode == 0 and f"resumed from {checkpoint} at epoch 2" in again.stdout, again.stdout + again.stderr


#: The healthy second attempt must reach its first batch inside the startup budget too: three interpreters import
#: torch first (the script and two spawn workers), over 20 s on CI's two cores shared by four test workers.
WORKER_START_BUDGET_S = 45


def test_worker_hang_before_the_first_batch_is_caught_and_the_script_resumes(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "examples" / "plain_pytorch.py"), "--epochs", "2", "--samples", "128", "--workers", "2"]
    result = train_cli(
        [
            "supervise",
            "--run-dir",
            str(tmp_path),
            "--startup-timeout",
            str(WORKER_START_BUDGET_S),
            "--stall-timeout",
            "20",
            "--grace",
            "2",
            "--backoff",
            "0.5",
            "--quiet",
            "--",
            *script,
        ],
        tmp_path,
        env={"TRAIN_FAULT": "sleep@worker,attempt=0,index>=0"},
    )

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["budget"] == "startup", "the first batch never came"
    rows = json.loads((result.incident() / "processes.json").read_text())
    assert len(rows) >= 3, "the script and its two spawn-started workers"
    stacks = result.stacks()
    assert "hang_sleep" in stacks and "__getitem__" in stacks
    assert result.of("exit")[0]["beats"] > 0
    assert (tmp_path / "plain.pt").stat().st_size > 0
    assert not survivors(tmp_path)


#: Issue 30's end-to-end run: hangs at random on the fast rung alone (``chance``: about one step in 25, seeded), none on
#: safe. Which rung finishes first depends on this machine's measured speeds, so the test checks that the cost policy
#: weighed each stall it was asked about (stay or down, with its figures), not which way it went. No DataLoader workers:
#: the hang is in the training loop, and each attempt then starts one interpreter, not three.
RANDOM_HANG_LADDER = """\
rungs:
  - {name: fast, env: {TRAIN_FAULT: "sleep@step,chance=4", TRAIN_FAULT_SEED: "3"}}
  - {name: safe, args: ["--batch", "16"], expected_speed: 0.5}
"""


def test_random_hangs_on_the_fast_rung_are_weighed_and_the_script_finishes(tmp_path: Path) -> None:
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(RANDOM_HANG_LADDER)
    run_dir = tmp_path / "run"
    script = [sys.executable, str(EXAMPLE), "--epochs", "4", "--samples", "256", "--batch", "32", "--workers", "0"]
    budgets = ["--stall-timeout", "5", "--startup-timeout", str(WORKER_START_BUDGET_S), "--backoff", "0", "--grace", "1"]
    result = train_cli(["supervise", "--run-dir", str(run_dir), "--ladder", str(ladder), *budgets, "--", *script], run_dir)

    assert result.code == 0, result.stderr
    decisions = result.cost_decisions("fast")
    for decision in decisions:
        assert {c["rung"] for c in decision["candidates"]} == {"fast", "safe"} and decision["lost_to_stalls_s"] > 0
    assert result.of("exit")[0]["code"] == 0 and result.of("exit")[0]["stalls"] == len(result.of("stall"))
    assert (run_dir / "plain.pt").stat().st_size > 0
    print(f"random hangs: {[(d['kind'], d['reason']) for d in decisions]}")
