"""The guard that outlives the supervisor (trainbox.system.guard): what it reads, and a supervisor killed with SIGKILL
while its child loads data through a forkserver's or spawn's DataLoader workers leaves nothing running."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.supervised import start_cli, survivors, wait_for
from trainbox.interrupt import WARNING_SIGNAL
from trainbox.system import guard


def test_the_session_is_read_past_a_command_that_holds_parentheses() -> None:
    assert guard.session_of("4321 (python) x) S 1 4300 4299 0 -1") == 4299
    assert guard.session_of("garbage") is None


def test_the_sessions_held_are_those_told_and_not_released() -> None:
    assert guard.held(["+12\n", "+13\n", "-12\n", "junk\n", "+x\n", "-99\n"]) == {13}


#: An unmodified program that loads its batches through DataLoader workers of the start method it is given.
LOADING = textwrap.dedent(
    """\
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, index):
            time.sleep(0.01)
            return torch.zeros(4)

    if __name__ == "__main__":
        loader = DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[1])
        for step, batch in enumerate(loader):
            print(f"step {step}/25000", flush=True)
            time.sleep(0.05)
    """
)


def _names(processes: List[psutil.Process]) -> List[str]:
    named = []
    for process in processes:
        try:
            named.append(" ".join(process.cmdline())[:80])
        except psutil.Error:
            continue
    return named


@pytest.mark.training  # torch's DataLoader workers
@pytest.mark.parametrize("context, started", [("forkserver", 5), ("spawn", 4)])
def test_a_supervisor_killed_with_sigkill_leaves_nothing_of_its_run(tmp_path: Path, context: str, started: int) -> None:
    """The child, multiprocessing's resource tracker, the forkserver and every worker: none is left after 30 s."""
    program = tmp_path / "loading.py"
    program.write_text(LOADING)
    run_dir = tmp_path / "run"
    options = ["--startup-timeout", "120", "--stall-timeout", "60", "--quiet"]
    supervisor = start_cli(["supervise", "--run-dir", str(run_dir), *options, "--", sys.executable, str(program), context])
    try:
        wait_for(lambda: len(survivors(run_dir)) >= started, 120, f"the child, its tracker and workers ({started} processes)")
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(timeout=10)
        wait_for(lambda: not survivors(run_dir), 30, f"the run's processes to end: {_names(survivors(run_dir))}")
    finally:
        supervisor.kill()
        for leftover in survivors(run_dir):
            leftover.kill()


def _ignores(pid: int, signum: int) -> bool:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return bool(int(fields["SigIgn"].strip(), 16) & (1 << (signum - 1)))


def test_the_guard_outlives_a_schedulers_warning_to_every_process_of_the_job() -> None:
    watch = guard.SessionGuard()
    watch.start()
    assert watch.process is not None and watch._pipe is not None
    wait_for(lambda: _ignores(watch.process.pid, WARNING_SIGNAL), timeout=60, what="the guard ignoring it")
    watch.process.send_signal(WARNING_SIGNAL)
    time.sleep(0.5)
    assert watch.process.poll() is None, "Slurm's --signal reaches the guard too: it must stay"
    watch._pipe.close()
    assert watch.process.wait(timeout=30) == 0
