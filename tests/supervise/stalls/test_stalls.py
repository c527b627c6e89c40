"""Cause-aware stalls against real faults (train/faults.py): idleness, a blocked DataLoader, real compilers, a
growing kernel cache, a spin, a hang that always comes back, and observe mode. The judge alone, scripted, is
tests/supervise/stalls/test_silence.py; the classifier on recorded evidence, tests/diagnose/test_causes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from tests.supervised import Finished, faulty_child, read_events, start_cli, survivors, train_cli, wait_for
from trainbox.errors import ExitCode

#: Quick grace and backoff; each test sets its own budgets.
QUICK = ["--grace", "1", "--backoff", "0.1", "--quiet"]


def supervise(run_dir: Path, fault: str, budgets: List[str], env: Optional[Dict[str, str]] = None, steps: int = 6) -> Finished:
    args = ["supervise", "--run-dir", str(run_dir), *budgets, *QUICK, "--"]
    child = faulty_child("--steps", str(steps), "--interval", "0.05")
    result = train_cli([*args, *child], run_dir, {"TRAIN_FAULT": fault, **(env or {})})
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


def summary(result: Finished, stall: int = 0) -> Dict:
    return json.loads((result.incident(stall) / "summary.json").read_text())


def test_startup_deadlock_under_a_900_s_budget_is_found_by_idleness(tmp_path: Path) -> None:
    budgets = ["--startup-timeout", "900", "--stall-timeout", "900", "--idle-timeout", "6"]
    result = supervise(tmp_path, "lock@start,attempt=0", budgets)

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["budget"], stall["budget_s"], stall["action"]) == ("idle", "startup", 900.0, "restart")
    assert 6.0 <= stall["silent_s"] < 60.0, "found by idleness, not by the 900 s budget"
    assert stall["cause"] == "idle" and any("idle for" in line for line in stall["evidence"])
    assert "hang_lock_deadlock" in result.stacks()
    report = summary(result)
    assert (report["cause"], report["evidence"], report["rule"]) == (stall["cause"], stall["evidence"], "idle")
    samples = json.loads((result.incident() / "evidence.json").read_text())
    assert len(samples) >= 3, "the silence was sampled before it was judged"
    assert result.of("restart")[0]["reason"].startswith("idle: ")


def test_dataloader_whose_forked_workers_block_is_a_loader_deadlock(tmp_path: Path) -> None:
    result = supervise(tmp_path, "loader@step,step=2,attempt=0", ["--stall-timeout", "120", "--idle-timeout", "6"])

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    stall = result.of("stall")[0]
    assert stall["cause"] == "loader_deadlock", stall["evidence"]
    assert stall["rule"] == "idle" and stall["silent_s"] < 100
    assert "hang_in_dataloader" in result.stacks() and "hang_sleep" in result.stacks()
    assert len(json.loads((result.incident() / "processes.json").read_text())) >= 3, "the child and its two workers"


def test_real_compilers_running_past_the_budget_are_not_killed(tmp_path: Path) -> None:
    result = supervise(tmp_path, "cc@step,step=2,attempt=0", ["--stall-timeout", "4"], {"TRAIN_FAULT_SECONDS": "14"})

    assert result.code == 0, result.stderr
    assert set(result.kinds()) == {"start", "extend", "exit"}, result.kinds()
    extends = result.of("extend")
    assert all(e["cause"] == "kernel_compile" and e["evidence"] for e in extends)
    assert any("cc1" in line for e in extends for line in e["evidence"]), extends[0]["evidence"]
    assert [e["budget_s"] for e in extends] == sorted(e["budget_s"] for e in extends), "each extension goes further"


def test_in_process_compile_that_grows_the_inductor_cache_is_not_killed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {
        "TRAIN_FAULT": "cache@step,step=2,attempt=0",
        # Long enough that `health`, started after the first extension, still finds it compiling on a loaded machine
        # (at 12 s, once in CI, the run had ended by then).
        "TRAIN_FAULT_SECONDS": "30",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c"),
    }
    args = ["supervise", "--run-dir", str(run_dir), "--stall-timeout", "4", *QUICK, "--", *faulty_child("--steps", "6")]
    proc = start_cli(args, env)
    try:
        wait_for(lambda: "extend" in [e["event"] for e in read_events(run_dir)], 60, "the first extension")
        health = train_cli(["health", "--run-dir", str(run_dir)], run_dir)
    finally:
        code = proc.wait(timeout=120)
    result = Finished(code, "", "", run_dir)

    assert result.code == 0
    assert "stall" not in result.kinds() and "extend" in result.kinds(), result.kinds()
    lines = [line for e in result.of("extend") for line in e["evidence"]]
    assert any("TORCHINDUCTOR_CACHE_DIR" in line for line in lines), lines
    assert health.code == 0 and health.stdout.startswith("healthy: running"), "judged by the extended budget"
    assert not survivors(run_dir)


def test_a_compile_that_never_ends_is_stopped_at_the_cap(tmp_path: Path) -> None:
    budgets = ["--stall-timeout", "4", "--compile-cap", "12"]
    result = supervise(tmp_path, "cc@step,step=2,attempt=0", budgets, {"TRAIN_FAULT_SECONDS": "600"})

    assert result.code == 0, result.stderr
    assert result.kinds()[-4:] == ["stall", "restart", "start", "exit"] and "extend" in result.kinds()
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["cause"]) == ("compile_cap", "kernel_compile")
    assert stall["evidence"][0].startswith("still compiling after") and 12 <= stall["silent_s"] < 40
    assert "trainbox warmup" in result.of("restart")[0]["reason"]


def test_a_python_spin_is_busy_python_and_retried_once(tmp_path: Path) -> None:
    result = supervise(tmp_path, "spin@step,step=2,attempt=0", ["--stall-timeout", "4"])

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"]
    assert result.of("stall")[0]["cause"] == "busy_python", result.of("stall")[0]["evidence"]
    assert result.of("restart")[0]["reason"] == "busy_python: the same command again"


#: Another program compiling into a cache the child's environment names: a kernel file every 0.3 s, not in the tree.
OTHER_COMPILER = """
import os, sys, time
cache = sys.argv[1]
os.makedirs(cache, exist_ok=True)
for n in range(100_000):
    with open(os.path.join(cache, f"kernel{n}.hsaco"), "wb") as handle:
        handle.write(os.urandom(4096))
    time.sleep(0.3)
"""


def test_a_spin_while_another_program_grows_a_shared_cache_is_no_compile(tmp_path: Path) -> None:
    """Issue 33 item 10: growth of a shared kernel cache counted as this tree's compile whenever the tree used CPU, so
    a spin (or a sync spinning on a hung GPU) was extended up to --compile-cap and retried as a compile. Now the
    growth counts only when the tree wrote it: a real second program writes here, the tree only spins."""
    cache = tmp_path / "miopen"
    writer = subprocess.Popen([sys.executable, "-c", OTHER_COMPILER, str(cache)])
    try:
        env = {"MIOPEN_CUSTOM_CACHE_DIR": str(cache)}
        result = supervise(tmp_path / "run", "spin@step,step=2,attempt=0", ["--stall-timeout", "4", "--compile-cap", "60"], env)
    finally:
        writer.kill()
        writer.wait()
    assert result.code == 0, result.stderr
    assert len(list(cache.iterdir())) > 10, "the other program did write into the cache all along"
    assert result.kinds() == ["start", "stall", "restart", "start", "exit"], "no extension: nothing of ours compiled"
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["cause"]) == ("budget", "busy_python"), stall["evidence"]
    assert stall["silent_s"] < 15, "found at its budget, not at the compile cap"


def test_the_same_hang_at_the_same_step_gives_up_before_the_restarts_are_spent(tmp_path: Path) -> None:
    result = supervise(tmp_path, "sleep@step,step=3", ["--stall-timeout", "3", "--max-restarts", "5"])

    assert result.code == ExitCode.HUNG
    assert result.kinds() == ["start", "stall", "restart", "start", "stall", "give_up", "exit"]
    reason = result.of("give_up")[0]["reason"]
    cause = result.of("stall")[1]["cause"]
    assert reason == f"stalls again at phase train, step 3 (cause {cause}) with nothing left to try"
    assert result.of("give_up")[0]["restarts"] == 1
    assert f"cause {cause}: " in result.stderr, "the give-up summary names the cause and its evidence"
    assert result.stderr.count("stall cause: ") == 2, "a console line per stall names the cause"


def test_observe_mode_reports_once_and_kills_nothing(tmp_path: Path) -> None:
    args = ["supervise", "--run-dir", str(tmp_path), "--stall-timeout", "30", "--on-stall", "report", *QUICK, "--"]
    child = faulty_child("--steps", "6", "--interval", "0.05", "--slow-step", "3", "--slow-seconds", "6", "--phase-timeout", "1")
    result = train_cli([*args, *child], tmp_path)

    assert result.code == 0, result.stderr
    assert result.kinds() == ["start", "stall", "exit"], "reported, not restarted: the child finished by itself"
    stall = result.of("stall")[0]
    assert stall["action"] == "report" and stall["budget"] == "phase:slow" and stall["cause"]
    assert "sigkilled" not in stall
    assert len(list((tmp_path / "incidents").iterdir())) == 1, "one report for one silence"
    assert result.of("exit")[0]["restarts"] == 0


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
#: A learned budget of a few seconds (min 5 intervals, floor 1 s) and a plain one that outlasts the evaluation.
LEARN_FAST = ["--startup-timeout", "30", "--stall-timeout", "25", "--idle-timeout", "10", "--learned-min-samples", "5"]
LEARN_FAST += ["--learned-floor", "1", "--max-restarts", "1"]


def supervise_program(run_dir: Path, args: List[str], options: List[str], fault: str = "") -> Finished:
    """``trainbox supervise`` of a fixture program that never heard of trainbox; ``fault`` through the output site."""
    paths = [str(FIXTURES / "uninstrumented"), os.environ.get("PYTHONPATH", "")]
    env = {"PYTHONPATH": os.pathsep.join(path for path in paths if path), "TRAIN_FAULT": fault}
    command = [sys.executable, str(FIXTURES / "output" / "programs" / "silent_eval.py"), *args]
    result = train_cli(["supervise", "--run-dir", str(run_dir), *options, *QUICK, "--", *command], run_dir, env)
    assert not survivors(run_dir), f"processes outlived the supervisor: {survivors(run_dir)}"
    return result


def test_a_silent_busy_evaluation_after_a_finished_bar_is_not_killed_by_the_learned_budget(tmp_path: Path) -> None:
    """40 steps 0.25 s apart learn a budget of a few seconds; 8 s of silent, busy evaluation follow the bar's last
    step. The bar has finished, so the plain 25 s budget judges that silence, and the second epoch runs: no stall."""
    args = ["--epochs", "2", "--steps", "40", "--delay", "0.25", "--eval-s", "8"]
    result = supervise_program(tmp_path, args, LEARN_FAST)
    assert result.code == ExitCode.OK, result.stderr
    assert result.kinds() == ["start", "exit"], [(s["budget"], s["budget_s"], s["silent_s"]) for s in result.of("stall")]
    assert "done" in (tmp_path / "logs" / "attempt-0.log").read_text()


def test_a_spin_in_the_middle_of_a_bar_is_found_by_the_stall_budget_past_the_learned_one(tmp_path: Path) -> None:
    """A learned budget is a suspicion: the spinning tree is busy, so it is judged at the plain stall budget (8 s
    here), and the stall event says that the learned budget ran out on a busy tree and which rule called it."""
    # each tqdm draw starts with \r: once step 24 is drawn 25 line ends are written, and the next draw spins
    args = ["--epochs", "1", "--steps", "40", "--delay", "0.25", "--eval-s", "0"]
    options = [*LEARN_FAST, "--stall-timeout", "8"]
    result = supervise_program(tmp_path, args, options, fault="spin@output,attempt=0,lines>=25")
    assert result.code == ExitCode.OK, result.stderr
    stall = result.of("stall")[0]
    assert (stall["rule"], stall["budget"], stall["budget_s"]) == ("stall_budget", "learned:", 8.0), stall
    assert stall["busy"]["busy"] and stall["busy"]["judged_at_s"] == 8.0 and "% CPU" in stall["busy"]["signs"][0]
    assert stall["cause"] == "busy_python" and stall["last_beat"]["step"] == 24
    assert "past its learned: budget" in result.stderr and "but busy (computing" in result.stderr


def test_a_stopped_worker_is_named_and_its_tree_killed_without_spending_the_grace(tmp_path: Path) -> None:
    """A forked worker SIGSTOPped while the main process waits for it: the cause is ``stopped``, the stopped worker is
    told apart from the waiting main thread, and the kill wakes it (SIGCONT) instead of waiting out --grace 20."""
    options = ["--stall-timeout", "4", "--grace", "20", "--backoff", "0.1", "--max-restarts", "0", "--quiet"]
    child = faulty_child("--steps", "6", "--interval", "0.05")
    args = ["supervise", "--run-dir", str(tmp_path), *options, "--", *child]
    result = train_cli(args, tmp_path, {"TRAIN_FAULT": "stopped@step,step=3,attempt=0"})
    assert not survivors(tmp_path), f"processes outlived the supervisor: {survivors(tmp_path)}"
    stall = result.of("stall")[0]
    assert stall["cause"] == "stopped", stall["evidence"]
    assert "stopped (state T" in stall["evidence"][0] and "(not stopped)" in stall["evidence"][-1], stall["evidence"]
    worker = int(stall["evidence"][0].split()[1])
    # Nothing SIGKILLed: without the SIGCONT the stopped worker would have outlived the 20 s grace.
    assert stall["continued"] == [worker] and stall["sigkilled"] == [], stall


def test_a_thread_holding_the_gil_in_c_is_named_first(tmp_path: Path) -> None:
    """A thread in a C call that kept the GIL (``ctypes.PyDLL(None).sleep``) while the main thread waits for it: the
    cause is ``gil_held`` and the evidence names the holder and its frames, not the main thread's wait."""
    result = supervise(tmp_path, "gil@step,step=3,attempt=0", ["--stall-timeout", "4", "--max-restarts", "0"])
    stall = result.of("stall")[0]
    assert stall["cause"] == "gil_held", stall["evidence"]
    first = stall["evidence"][0]
    assert "(gil-holder) holds the GIL" in first and "hold_the_gil_in_c" in first, first
    assert "idle+gil" in result.stacks(), "the stack file marks the holder"


def test_a_stall_timeout_you_give_bounds_a_bar_that_never_reaches_its_first_percent(tmp_path: Path) -> None:
    """Before its first percent a percentage-only bar is judged by the stall budget, and after it by what its
    percents declare, bounded by ``--stall-timeout`` when the user gives one (the idle rule is off here, so that the
    budget alone decides). A bar hung there was found a day later."""
    from tests.supervise.output.test_uninstrumented import program, supervise

    options = ["--stall-timeout", "3", "--idle-timeout", "0", "--max-restarts", "0", "--grace", "1"]
    result = supervise(tmp_path, program("percent_bar.py", "--delay", "1000"), options=options)
    stall = result.of("stall")[0]
    assert (stall["budget_s"], stall["rule"]) == (3.0, "budget"), stall
