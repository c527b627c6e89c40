"""Where the test suite's CPU time goes: each test's own and its child processes' CPU seconds, by file and by test.

The inner loop (``-m "not docker and not training"``) runs with four workers on two cores and is CPU-bound (the
machine stays busy), so its wall time is its CPU time over two: this tells which tests to make cheaper. A test's
CPU is what its worker spent during the test plus what the child processes it waited for spent (``os.times``: a
child's CPU is counted once it is reaped, grandchildren through it); a session or module fixture's cost lands on
the first test that uses it.

What the Docker Engine and its containers spend is no child of the test's: ``machine_cpu_s`` is the whole machine's
busy CPU during the test (``/proc/stat``), which tells a Docker test's cost when it runs alone (``-n 0``) and is
shared with whatever ran beside it otherwise.

    python bench/suite_cpu.py                          # the inner loop
    python bench/suite_cpu.py -m "not docker" --write  # another selection; --write keeps the result

Run as a pytest plugin (``-p bench.suite_cpu``) it writes one JSON file per worker into ``$SUITE_CPU_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

REPO = Path(__file__).resolve().parent.parent
OUT_ENV = "SUITE_CPU_DIR"
RECORDS: List[Dict[str, Any]] = []


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot: /proc/stat's user, nice, system, irq, softirq and steal
    (guest time is inside user and nice already; steal counts, as CPU this machine asked for and did not get)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # fields[:8]: user .. steal


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    before, started, machine = os.times(), time.monotonic(), machine_busy_s()
    yield
    after = os.times()
    RECORDS.append(
        {
            "test": item.nodeid,
            "wall_s": round(time.monotonic() - started, 3),
            "self_cpu_s": round(after.user + after.system - before.user - before.system, 3),
            "children_cpu_s": round(
                after.children_user + after.children_system - before.children_user - before.children_system, 3
            ),
            "machine_cpu_s": round(machine_busy_s() - machine, 3),
        }
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(OUT_ENV)
    if out and RECORDS:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(out) / f"{worker}.json").write_text(json.dumps(RECORDS))


def summarize(records: List[Dict[str, Any]], top: int) -> Dict[str, Any]:
    by_file: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0.0])  # file -> [its tests' CPU-s, machine CPU-s]
    for record in records:
        record["cpu_s"] = round(record["self_cpu_s"] + record["children_cpu_s"], 3)
        totals = by_file[record["test"].split("::")[0]]
        totals[0] += record["cpu_s"]
        totals[1] += record["machine_cpu_s"]
    files = [[name, round(cpu, 1), round(machine, 1)] for name, (cpu, machine) in by_file.items()]
    return {
        "tests": len(records),
        "cpu_s": round(sum(r["cpu_s"] for r in records), 1),
        # [file, CPU-s, machine CPU-s]: a Docker test spends its CPU in dockerd and its containers, which only the
        # machine's figure shows (alone, -n 0).
        "by_file": sorted(files, key=lambda row: -row[1])[:top],
        "by_file_machine": sorted(files, key=lambda row: -row[2])[:top],
        "by_test": sorted(records, key=lambda r: -r["cpu_s"])[:top],
        "by_test_machine": sorted(records, key=lambda r: -r["machine_cpu_s"])[:top],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", dest="marks", default="not docker and not training", help="pytest's -m expression")
    parser.add_argument("-n", dest="workers", default="4", help="pytest-xdist workers (as the README's command)")
    parser.add_argument("--top", type=int, default=30, help="files and tests listed (default 30)")
    parser.add_argument("--write", action="store_true", help="write bench/results/suite-cpu.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        started = time.monotonic()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "bench.suite_cpu", "-n", args.workers, "-m", args.marks]
        done = subprocess.run(command, cwd=REPO, env=dict(os.environ, **{OUT_ENV: out}))
        wall = time.monotonic() - started
        records = [r for path in Path(out).glob("*.json") for r in json.loads(path.read_text())]
    result = {"marks": args.marks, "workers": args.workers, "wall_s": round(wall, 1), "exit": done.returncode}
    result.update(summarize(records, args.top))
    print(f"{result['tests']} tests, {result['cpu_s']} CPU-s in {result['wall_s']} s (exit {done.returncode})")
    print("  CPU-s  machine  file")
    for name, seconds, machine in result["by_file"]:
        print(f"{seconds:7.1f}  {machine:7.1f}  {name}")
    if args.write:
        from common import write_results  # bench/common.py: this script's folder is on sys.path

        lines = [f"# Suite CPU: `-m \"{args.marks}\"`, -n {args.workers}", "",
                 f"{result['tests']} tests, {result['cpu_s']} CPU-s in {result['wall_s']} s (exit {done.returncode}).",
                 "", "| CPU-s | machine CPU-s | file |", "|---:|---:|---|"]  # fmt: skip
        lines += [f"| {seconds:.1f} | {machine:.1f} | `{name}` |" for name, seconds, machine in result["by_file"]]
        write_results("suite-cpu", result, "\n".join(lines) + "\n")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
