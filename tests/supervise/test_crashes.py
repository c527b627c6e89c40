"""A crash named by its exception line and its place (trainbox.supervise.crashes), and a real one that repeats."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from tests.paths import FIXTURES, REPO
from tests.supervised import cli_env, faulty_child, train_cli
from trainbox.errors import ExitCode
from trainbox.supervise import crashes
from trainbox.supervise.policy import Outcome, OutcomeKind

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "    model(x)",
    "RuntimeError: operator torchvision::nms does not exist",
]


def test_the_exception_line_is_the_last_line_that_ends_a_traceback() -> None:
    assert crashes.exception_line(TRACEBACK) == "RuntimeError: operator torchvision::nms does not exist"
    assert crashes.exception_line([*TRACEBACK, "wandb: syncing run", ""]) == TRACEBACK[-1], "later chatter is passed over"
    assert (
        crashes.exception_line(["torch.OutOfMemoryError: CUDA out of memory."]) == "torch.OutOfMemoryError: CUDA out of memory."
    )
    assert crashes.exception_line(["KeyboardInterrupt"]) == "KeyboardInterrupt"
    assert crashes.exception_line(["  KeyError: 'lr'  "]) == "KeyError: 'lr'"
    assert crashes.exception_line(["epoch 3 loss 0.2", "Segmentation fault (core dumped)", ""]) is None
    assert crashes.exception_line(["Error rate: 0.5", "MyErrorCount 3"]) is None, "a word with Error in it is not one"
    assert len(crashes.exception_line(["ValueError: " + "x" * 10_000]) or "") == crashes.MAX_LINE


def test_the_place_is_the_last_position_or_before_any_progress() -> None:
    started = Outcome(OutcomeKind.EXITED, code=1, beats=1, last_beat={"phase": "setup"})
    assert crashes.place(started, None) == "before any progress"
    assert crashes.place(started, "safe") == "before any progress, profile safe"
    stepped = Outcome(OutcomeKind.EXITED, code=1, beats=3, first_step_ts=1.0, last_beat={"phase": "val", "epoch": 0, "batch": 2})
    assert crashes.place(stepped, "safe") == "at phase val, epoch 0 batch 2, profile safe"


def test_the_place_is_the_last_counter_the_output_showed_before_a_beat_read_earlier() -> None:
    beaten = Outcome(OutcomeKind.EXITED, code=1, beats=3, first_step_ts=1.0, last_beat={"phase": "train", "step": 38})
    assert crashes.place(beaten, None, {"step": 40, "counter": "words::?"}) == "at step 40"
    assert crashes.place(beaten, None) == "at phase train, step 38", "no counter in the output: the last beat"
    assert crashes.place(Outcome(OutcomeKind.EXITED, code=1), "safe", {"step": 1}) == "at step 1, profile safe"


CRASHING = """\
import sys, time
for step in range(1, 4):
    print(f"step {step}/10", flush=True)
    time.sleep(0.05)
raise RuntimeError(sys.argv[1] if len(sys.argv) > 1 else "operator torchvision::nms does not exist")
"""


def test_a_crash_that_repeats_word_for_word_ends_the_run_on_the_second_quoting_it(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    run_dir = tmp_path / "run"
    done = train_cli(
        ["supervise", "--run-dir", str(run_dir), "--backoff", "0.1", "--quiet", "--", sys.executable, str(script)], run_dir
    )
    assert done.code == ExitCode.GAVE_UP, done.stderr
    assert done.kinds().count("start") == 2, done.kinds()
    [last] = [line for line in done.stderr.splitlines() if line.startswith("trainbox: giving up")]
    log = run_dir / "logs" / "attempt-1.log"
    assert last.endswith(f"Both ended with: RuntimeError: operator torchvision::nms does not exist (in {log})"), last
    assert "the same crash twice in a row, at step 3" in last and log.is_file()
    assert "incidents" not in last, "a run without a stall has no incident reports to point to"
    assert done.of("give_up")[0]["reason"] == "the same crash twice in a row, at step 3"


#: The end of a torchrun whose rank raised without ``@record``: the rank's traceback, prefixed, then torchrun's own.
TORCHRUN_TAIL = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 14, in main
[rank1]:     raise OSError("cannot read shard 7")
[rank1]: OSError: cannot read shard 7
E1206 03:30:45.000000 1 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 19678)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def crashed(lines: List[str], **beat: Any) -> Outcome:
    return Outcome(OutcomeKind.EXITED, code=1, beats=3, first_step_ts=1.0, last_beat=beat or None, detail={"last_output": lines})


def test_torchruns_wrapper_is_never_a_crash_name_the_ranks_own_exception_is() -> None:
    lines = TORCHRUN_TAIL.splitlines()
    assert crashes.exception_line(lines[-12:]) is None, "ChildFailedError is torchrun's, the same for every crash"

    def name(lines: List[str], rank_failure: Any = None, tail: str = TORCHRUN_TAIL) -> Any:
        return crashes.named(crashed(lines, step=3), None, Path("log"), rank_failure, crashes.Output(tail))["exception"]

    assert name(lines[-20:]) == "OSError: cannot read shard 7", "from the rank's traceback above the wrapper"
    # torchrun's error file: the rank's own exception (@record), or torchrun's wrapper when the rank had no @record
    recorded = {"rank": 1, "error": "RuntimeError: rank 1 lost its tensor"}
    assert name(lines, recorded) == recorded["error"]
    wrapper = {"rank": 1, "error": "ChildFailedError: \n=====\ntrain.py FAILED"}
    assert name(lines, wrapper) == "OSError: cannot read shard 7"
    assert crashes.named(crashed(lines[-12:], step=3), None, Path("log"), wrapper)["exception"] is None


@pytest.mark.parametrize(
    "line",
    [
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='hub', port=443): Max retries exceeded",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        "TimeoutError: timed out",
        "OSError: [Errno 110] ETIMEDOUT",
        "RuntimeError: upload failed: ECONNRESET",
        "urllib.error.HTTPError: HTTP Error 502: Bad Gateway",
        "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable for url: https://x/upload",
        "huggingface_hub.errors.HfHubHTTPError: 500 Server Error: Internal Server Error",
        "wandb.errors.CommError: HTTP 504 while uploading",
    ],
)
def test_an_error_that_says_it_may_pass_is_transient(line: str) -> None:
    assert crashes.transient(line)
    assert crashes.named(crashed([line], step=20), None, Path("log"))["transient"] is True


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: operator torchvision::nms does not exist",
        "ValueError: step 500 is past the end",
        "requests.exceptions.HTTPError: 404 Client Error: Not Found",
        "ValueError: bad Timeout value",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 502.00 MiB",
    ],
)
def test_an_error_that_does_not_say_so_is_not_transient(line: str) -> None:
    assert not crashes.transient(line)
    assert not crashes.transient(None)


def test_the_transient_pattern_takes_linear_time() -> None:
    """Every alternative is bounded: a 1 MB line of near-misses is one pass (a backtracking pattern takes minutes)."""
    for line in ("HTTP " * 200_000, "Connection" * 100_000, "status " * 150_000):
        assert not crashes.transient(line)


CRASH_OPTIONS = ["--startup-timeout", "90", "--stall-timeout", "30", "--grace", "5", "--quiet"]


@pytest.mark.training  # torchrun starts two ranks that import torch
def test_under_torchrun_each_crash_is_named_by_the_ranks_own_exception(tmp_path: Path) -> None:
    """A RuntimeError, then an OSError, then the same OSError: the third attempt is the repeat (torchrun's
    ChildFailedError made the first two 'the same crash'), and the give-up line quotes the rank's error."""
    beating = faulty_child("--steps", "30", "--interval", "0.05")[1:]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *beating]
    fault = "raise@step,step=3,attempt=0;oserror@step,step=3,attempt>=1"  # both ranks, so both stop at step 3
    args = ["supervise", "--run-dir", str(tmp_path), *CRASH_OPTIONS, "--backoff", "0.1", "--", *command]
    done = train_cli(args, tmp_path, {"TRAIN_FAULT": fault})

    assert done.code == ExitCode.GAVE_UP, done.stderr
    assert done.kinds().count("start") == 3, done.kinds()
    [last] = [line for line in done.stderr.splitlines() if line.startswith("trainbox: giving up")]
    assert "ChildFailedError" not in last and "Both ended with: OSError: trainbox fault: injected OSError" in last, last
    assert done.of("give_up")[0]["reason"] == "the same crash twice in a row, at step 3"


def test_a_transient_error_is_retried_with_a_growing_backoff_until_it_passes(tmp_path: Path) -> None:
    """An upload at step 20 refused twice (a server down for a few seconds) is two restarts, not 'the same crash'."""
    checkpoint = tmp_path / "step.ckpt"
    child = faulty_child("--steps", "25", "--interval", "0.01", "--checkpoint", str(checkpoint), "--save-every", "5")
    args = ["supervise", "--run-dir", str(tmp_path / "run"), *CRASH_OPTIONS, "--backoff", "0.2", "--", *child]
    done = train_cli(args, tmp_path / "run", {"TRAIN_FAULT": "refused@step,step=20,attempt<2"})

    assert done.code == ExitCode.OK, done.stderr
    assert done.kinds().count("crash") == 2 and done.kinds().count("start") == 3, done.kinds()
    assert [r["delay_s"] for r in done.of("restart")] == [0.2, 0.4], "the backoff grows with each transient error"
    assert done.of("exit")[-1]["restarts"] == 2, "they count against --max-restarts"


@pytest.mark.training  # torchrun starts two ranks that import torch
def test_a_crashs_place_is_the_last_counter_its_output_showed(tmp_path: Path) -> None:
    """A crash at step 40 with a checkpoint every 20: the second attempt is the repeat. The ranks' last beats are
    passed over once they have ended; their output, read to its end, shows step 40 every time."""
    checkpoint = ["--checkpoint", str(tmp_path / "step.ckpt"), "--save-every", "20"]
    beating = faulty_child("--steps", "60", "--interval", "0.02", *checkpoint)[1:]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *beating]
    run_dir = tmp_path / "run"
    args = ["supervise", "--run-dir", str(run_dir), *CRASH_OPTIONS, "--backoff", "0.1", "--max-restarts", "3"]
    done = train_cli([*args, "--", *command], run_dir, {"TRAIN_FAULT": "raise@step,step=40"})

    assert done.code == ExitCode.GAVE_UP, done.stderr
    assert done.kinds().count("start") == 2, done.kinds()
    assert done.of("give_up")[0]["reason"] == "the same crash twice in a row, at step 40"


def test_a_resumed_attempt_says_so_before_its_output_and_counts_the_steps_done_again(tmp_path: Path) -> None:
    """A crash after step 25, a checkpoint every 10: attempt 1 resumed from step 20 is said before its first line,
    and the steps from 21 to the crash's last counter (read to the end of its output) are done again."""
    run_dir, saved = tmp_path / "run", tmp_path / "run" / "ck"
    loop = [sys.executable, str(FIXTURES / "resumable" / "loop.py"), "--steps", "40", "--every", "10", "--out", str(saved)]
    options = ["--backoff", "0.1", "--resume-args", "--resume {checkpoint}", "--checkpoint", "ck/*.pt"]
    paths = [str(FIXTURES / "uninstrumented"), os.environ.get("PYTHONPATH", "")]
    env = cli_env({"PYTHONPATH": os.pathsep.join(filter(None, paths)), "TRAIN_FAULT": "raise@output,attempt=0,lines>=26"})
    args = [sys.executable, "-m", "trainbox", "supervise", "--run-dir", str(run_dir), *options, "--", *loop]
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, timeout=300)

    assert done.returncode == ExitCode.OK, done.stdout
    lines = done.stdout.splitlines()
    crashed = next(n for n, line in enumerate(lines) if line.startswith("trainbox: attempt 0 exited with status 1"))
    said = lines.index(f"trainbox: attempt 1 resumed from {saved / 'step-20.pt'}")
    first = next(n for n, line in enumerate(lines) if n > crashed and line.startswith("step "))
    assert lines[first].startswith("step 21/40") and crashed < said < first, "said before the attempt's own output"
    reached = [line for line in lines[:crashed] if line.startswith("step ")][-1]  # the last counter before the crash
    again = int(reached.split()[1].split("/")[0]) - 20
    assert f"trainbox: attempt 1: {again} steps done again" in lines[first:], done.stdout
