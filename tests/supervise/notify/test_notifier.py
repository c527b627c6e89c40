"""The notifier against real programs: one that records, one that hangs, one that floods, one that is missing.

First the :class:`~trainbox.supervise.notify.notifier.Notifier` alone, then through a real ``python -m trainbox supervise``
whose child hangs (trainbox.faults): the run's events told in order, and a notifier that hangs or floods
compared with the same run without one (when each stall was found, and how the run ended).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest

from tests.supervised import REPO, Finished, faulty_child, train_cli, wait_for
from trainbox.errors import ExitCode
from trainbox.supervise.notify import events
from trainbox.supervise.notify import notifier as notify
from trainbox.supervise.notify.notifier import Notifier

#: A limit short enough for a test, long enough for a shell to start on a loaded 2-core machine.
SHORT_LIMIT_S = 1.0
#: A generous bound on a call that only queues (the rule is "returns at once").
QUICK_S = 0.1


class Failures:
    """An ``on_failure`` that keeps what it was told."""

    def __init__(self) -> None:
        self.seen: List[Tuple[str, str]] = []

    def __call__(self, kind: str, line: str) -> None:
        self.seen.append((kind, line))

    def kinds(self) -> List[str]:
        return [kind for kind, _ in self.seen]


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def timed_send(notifier: Notifier, event: dict) -> float:
    started = time.monotonic()
    notifier.send(event)
    return time.monotonic() - started


def test_a_recording_notifier_gets_every_chosen_event_in_order_as_json(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    recorder = script(
        tmp_path, "record.sh", 'printf "%s|%s|" "$TRAINBOX_EVENT" "$TRAINBOX_SUMMARY" >> "$RECORD"; cat >> "$RECORD"\n'
    )
    failures = Failures()
    chosen = frozenset({"stall", "restart", "give_up", "exit"})
    notifier = Notifier([str(recorder)], chosen, failures, env={"RECORD": str(record)})
    sent = [
        {"ts": 1.0, "event": "start", "attempt": 0, "profile": "fast"},  # not asked for
        {"ts": 2.0, "event": "stall", "attempt": 0, "cause": "deadlock", "evidence": ['a "quoted"\nline']},
        {"ts": 3.0, "event": "restart", "attempt": 1, "reason": "stall"},
        {"ts": 4.0, "event": "give_up", "attempt": 1, "reason": "restart budget spent"},
        {"ts": 5.0, "event": "exit", "attempt": 1, "code": 1},
    ]
    for event in sent:
        notifier.send(event)
    notifier.close(timeout=10)

    lines = record.read_text().splitlines()
    fields = [line.split("|", 2) for line in lines]
    assert [name for name, _, _ in fields] == ["stall", "restart", "give_up", "exit"]
    assert [json.loads(event) for _, _, event in fields] == sent[1:]
    assert fields[3][1] == "exit, attempt 1: code 1"
    assert failures.seen == []


def test_a_summary_is_one_line_a_person_can_read() -> None:
    event = {"event": "give_up", "attempt": 3, "reason": "restart budget spent", "restarts": 3, "cause": None}
    assert notify.summary(event) == "give_up, attempt 3: reason restart budget spent"
    stall = {"event": "stall", "attempt": 0, "cause": "deadlock", "evidence": ["..."], "profile": "fast\nsafe"}
    assert notify.summary(stall) == "stall, attempt 0: cause deadlock, profile fast safe"
    assert len(notify.summary({"event": "exit", "reason": "x" * 10_000})) == notify.QUOTE_CHARS


def test_a_notifier_that_never_ends_costs_the_caller_nothing_and_its_group_is_killed_at_the_limit(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "sleep.sh", "sleep 1000 &\nsleep 1000\n")  # two processes in its group
    failures = Failures()
    notifier = Notifier([str(sleeper)], frozenset({"stall"}), failures, limit_s=SHORT_LIMIT_S)

    took = [timed_send(notifier, {"event": "stall", "attempt": n}) for n in range(2)]
    assert max(took) < QUICK_S, took
    wait_for(notifier.groups, 10, "the notifier to start")
    (group,) = notifier.groups()
    # The script and the sleep it starts in the background: on a loaded machine the fork can come after the first look.
    wait_for(lambda: len(descendants_in(group)) >= 2, SHORT_LIMIT_S, "the notifier's background sleep")
    wait_for(lambda: group_gone(group), SHORT_LIMIT_S + 5, "the hung notifier's group to be killed")
    notifier.close(timeout=SHORT_LIMIT_S + 5)

    assert failures.kinds() == ["timeout"]  # the second notifier hung too: said once
    assert "killed on stall" in failures.seen[0][1] and "1 s were up" in failures.seen[0][1]
    assert descendants_in(group) == []


def test_a_notifier_that_floods_its_output_blocks_nothing_and_the_next_one_runs(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    flood = script(
        tmp_path,
        "flood.sh",
        """\
        [ "$TRAINBOX_EVENT" = exit ] && { cat > "$RECORD"; exit 0; }
        head -c 20000000 /dev/zero | tr '\\0' x
        exec yes "$(head -c 300 /dev/zero | tr '\\0' y)" >&2
        """,
    )
    failures = Failures()
    limit = SHORT_LIMIT_S * 3  # time to write 20 MB through a pipe on a loaded machine, then errors without end
    notifier = Notifier([str(flood)], frozenset({"slow", "exit"}), failures, limit_s=limit, env={"RECORD": str(record)})

    assert timed_send(notifier, {"event": "slow", "attempt": 0, "ratio": 0.4}) < QUICK_S
    assert timed_send(notifier, {"event": "exit", "attempt": 0, "code": 0}) < QUICK_S
    notifier.close(timeout=limit + 10)

    assert json.loads(record.read_text()) == {"event": "exit", "attempt": 0, "code": 0}
    assert failures.kinds() == ["timeout"]
    assert re.search(r"killed on slow: its 3 s were up: y{1,200} \(said once", failures.seen[0][1])  # its last error line


def test_a_missing_notifier_is_one_line_once_and_nothing_else_happens(tmp_path: Path) -> None:
    failures = Failures()
    missing = str(tmp_path / "no-such-notifier")
    notifier = Notifier([missing, "--flag"], frozenset({"exit", "stall"}), failures)
    assert failures.kinds() == ["start"]  # said when the run starts, not when it ends

    for attempt in range(3):
        notifier.send({"event": "stall", "attempt": attempt})
    notifier.send({"event": "exit", "attempt": 2, "code": 0})
    notifier.close(timeout=5)

    assert failures.kinds() == ["start"]
    assert failures.seen[0][1].startswith(f"notifier {missing} cannot start: not found")


def test_a_failing_notifier_is_quoted_once(tmp_path: Path) -> None:
    failing = script(tmp_path, "fail.sh", 'echo "curl: (6) Could not resolve host: ntfy.sh" >&2\nexit 6\n')
    failures = Failures()
    notifier = Notifier([str(failing)], frozenset({"exit", "give_up"}), failures)
    notifier.send({"event": "give_up", "attempt": 3})
    notifier.send({"event": "exit", "attempt": 3, "code": 1})
    notifier.close(timeout=10)

    assert failures.seen == [
        (
            "status",
            f"notifier {failing} failed on give_up (status 6): curl: (6) Could not resolve host: ntfy.sh"
            " (said once; the run goes on)",
        )
    ]


def test_close_kills_a_notifier_still_running_and_drops_what_waits(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "sleep.sh", "sleep 1000\n")
    failures = Failures()
    notifier = Notifier([str(sleeper)], frozenset({"give_up", "exit"}), failures)  # the real 10 s limit
    notifier.send({"event": "give_up", "attempt": 0})
    notifier.send({"event": "exit", "attempt": 0, "code": 1})
    wait_for(notifier.groups, 10, "the notifier to start")
    (group,) = notifier.groups()
    started = time.monotonic()
    notifier.close(timeout=0.5)

    assert time.monotonic() - started < events.LIMIT_S / 2  # bounded by close's timeout, not by the notifier
    wait_for(lambda: group_gone(group), 5, "the killed group to be gone")  # its orphaned sleep is init's to reap
    assert failures.kinds() == ["timeout", "dropped"]
    assert "the run ended" in failures.seen[0][1] and "notification of exit dropped" in failures.seen[1][1]


def test_a_full_queue_drops_events_and_says_so_once(tmp_path: Path) -> None:
    sleeper = script(tmp_path, "sleep.sh", "sleep 1000\n")
    failures = Failures()
    notifier = Notifier([str(sleeper)], frozenset({"restart"}), failures)
    notifier.send({"event": "restart", "attempt": 0})
    wait_for(notifier.groups, 10, "the first notifier to start")  # it hangs: what follows waits
    for attempt in range(1, notify.MAX_QUEUED + 5):
        notifier.send({"event": "restart", "attempt": attempt})
    notifier.close(timeout=0)

    assert failures.kinds() == ["dropped", "timeout"]
    assert "notification of restart dropped: 32 notifications are waiting already" in failures.seen[0][1]


def test_under_a_subreaper_what_a_notifier_leaves_behind_is_killed_and_reaped() -> None:
    """The supervisor is a child subreaper: a notifier's orphans become its children; none may stay (alive or zombie)."""
    program = textwrap.dedent(
        """\
        import json, psutil, time
        from trainbox.system import proctree
        from trainbox.supervise.notify.notifier import Notifier
        assert proctree.become_subreaper()
        notifier = Notifier(["sh", "-c", "sleep 1000 & sleep 1000 & echo done"], frozenset({"exit"}))
        notifier.send({"event": "exit", "attempt": 0, "code": 0})
        notifier.close(timeout=10)
        print(json.dumps([[p.pid, p.status()] for p in psutil.Process().children()]))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / ".mypy"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("give_up,exit", {"give_up", "exit"}),
        (" stall , restart ", {"stall", "restart"}),
        ("slow,recovered,supervisor_hung", {"slow", "recovered", "supervisor_hung"}),
    ],
)
def test_notify_on_names_are_read(text: str, expected: set) -> None:
    assert events.parse_events(text) == expected


@pytest.mark.parametrize("text, said", [("give_up,exti", "unknown event 'exti'"), (" , ", "no event named")])
def test_an_unknown_notify_on_name_is_one_line(text: str, said: str) -> None:
    with pytest.raises(ValueError) as error:
        events.parse_events(text)
    message = str(error.value)
    assert said in message and "choose from stall,restart,give_up" in message
    assert "\n" not in message


def test_the_default_events_are_the_ones_a_person_must_hear_of() -> None:
    assert sorted(events.DEFAULT_EVENTS) == ["exit", "give_up", "supervisor_hung"]
    assert events.DEFAULT_EVENTS.issubset(events.NOTIFY_EVENTS)


def test_a_notify_command_is_split_as_a_shell_would_and_run_without_one() -> None:
    assert events.parse_command("examples/notify/ntfy.sh 'my topic'") == ["examples/notify/ntfy.sh", "my topic"]
    for bad, said in (("ntfy.sh 'unclosed", "quote it as for a shell"), ("  ", "needs a command")):
        with pytest.raises(ValueError, match=said):
            events.parse_command(bad)


def descendants_in(group: int) -> List[int]:
    """This test's descendants in process group ``group``."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if os.getpgid(child.pid) == group:
                found.append(child.pid)
        except ProcessLookupError:
            continue
    return found


# -- through a real supervisor: `python -m trainbox supervise --notify ...` -----------------------------------------------------
#: The child hangs at step 3 of every attempt: a stall, a restart, the same stall again, and the run gives up.
HANG_AT_3 = {"TRAIN_FAULT": "sleep@step,step=3"}
#: The stall budget of those runs: short, and far below a notifier's 10 s limit, which would show if it held anything up.
BUDGET_S = 3.0
#: How much later than the same run without a notifier a stall may be found on a loaded 2-core machine. A notifier
#: that held the loop up would show as its whole 10 s limit; a flooding one competes for the CPU, which is noise.
NOISE_S = 2.0
CHOSEN = "stall,restart,give_up,exit"
#: The runs compared with one baseline run: with -n, in one worker, so the baseline runs once.
COMPARED = pytest.mark.xdist_group("notify-runs")


def supervised(tmp_path: Path, name: str, *notify_args: str) -> Finished:
    """The hanging child under a real supervisor, with ``notify_args``; run to its end."""
    run_dir = tmp_path / name
    args = ["supervise", "--run-dir", str(run_dir), "--stall-timeout", str(BUDGET_S), "--grace", "1", "--backoff", "0.1"]
    child = faulty_child("--steps", "50", "--interval", "0.05")
    return train_cli([*args, "--quiet", *notify_args, "--", *child], run_dir, env=HANG_AT_3, timeout=180)


def late_s(run: Finished) -> List[float]:
    """How long past its budget each stall was found."""
    return [stall["silent_s"] - stall["budget_s"] for stall in run.of("stall")]


def run_kinds(run: Finished) -> List[str]:
    return [kind for kind in run.kinds() if kind != "notify_failed"]


@pytest.fixture(scope="module")
def without_notifier(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    run = supervised(tmp_path_factory.mktemp("baseline"), "run")
    kinds = ["start", "stall", "restart", "start", "stall", "give_up", "exit"]
    assert run.code == ExitCode.HUNG and run_kinds(run) == kinds, run.stderr
    return run


def test_a_supervised_run_tells_a_real_notifier_every_chosen_event_in_order(tmp_path: Path) -> None:
    told = tmp_path / "told.txt"
    notifier = script(tmp_path, "tell.sh", f'{{ printf "%s|" "$TRAINBOX_EVENT"; cat; }} >> {told}\n')
    run = supervised(tmp_path, "run", "--notify", str(notifier), "--notify-on", CHOSEN)
    assert run.code == ExitCode.HUNG, run.stderr
    lines = [line.split("|", 1) for line in told.read_text().splitlines()]
    assert [name for name, _ in lines] == ["stall", "restart", "stall", "give_up", "exit"]
    assert [json.loads(body) for _, body in lines] == [e for e in run.events if e["event"] in CHOSEN.split(",")]
    assert "notify_failed" not in run.kinds()


@COMPARED
@pytest.mark.parametrize(
    "name, body",
    [
        pytest.param("sleeps", "sleep 1000\n", id="sleeps"),
        pytest.param("floods", "head -c 20000000 /dev/zero | tr '\\0' x\nexec yes flood >&2\n", id="floods"),
    ],
)
def test_a_notifier_that_hangs_or_floods_changes_neither_detection_nor_outcome(
    tmp_path: Path, without_notifier: Finished, name: str, body: str
) -> None:
    """Each stall is found while a notifier of the stall before hangs or floods (the second one), and the outcome is the same."""
    notifier = script(tmp_path, f"{name}.sh", body)
    run = supervised(tmp_path, "run", "--notify", str(notifier), "--notify-on", CHOSEN)
    assert (run.code, run_kinds(run)) == (without_notifier.code, run_kinds(without_notifier)), run.stderr
    assert max(late_s(run)) <= max(late_s(without_notifier)) + NOISE_S, (late_s(run), late_s(without_notifier))
    assert [e["kind"] for e in run.of("notify_failed")][:1] == ["timeout"]  # it did run, and was killed at its limit
    assert len(run.of("notify_failed")) == len({e["kind"] for e in run.of("notify_failed")}), "once per kind"
    for stall in range(2):  # the notifier in flight during the second stall is not part of the stalled tree
        assert str(notifier) not in (run.incident(stall) / "processes.txt").read_text()


def test_a_missing_notifier_is_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-notifier"
    run_dir = tmp_path / "run"
    child = faulty_child("--steps", "5", "--interval", "0.05")
    run = train_cli(["supervise", "--run-dir", str(run_dir), "--quiet", "--notify", str(missing), "--", *child], run_dir)
    assert run.code == 0, run.stderr
    said = [line for line in run.stderr.splitlines() if not line.startswith(("trainbox: the run is in", "trainbox: report: "))]
    assert said == [
        f"trainbox: notify: notifier {missing} cannot start: not found, or not executable (said once; the run goes on)",
        "trainbox: completed after 1 attempt(s) (0 stall(s), 0 crash(es))",
    ], "besides the run's first line (where it is) and its last (its report)"
    assert run.kinds() == ["notify_failed", "start", "exit"]


def test_a_failing_notifier_s_secret_is_not_recorded(tmp_path: Path) -> None:
    """requests' error line names the webhook, whose URL is the secret: the line told (and written) has it redacted."""
    said = "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: https://hooks.slack.com/services/T0/B0/SECRETtoken123"
    failing = script(tmp_path, "fail.sh", f'echo "{said}" >&2\nexit 1\n')
    failures = Failures()
    notifier = Notifier([str(failing)], frozenset({"exit"}), failures)
    notifier.send({"event": "exit", "attempt": 0, "code": 1})
    notifier.close(timeout=10)

    [(kind, line)] = failures.seen
    assert kind == "status" and "SECRETtoken123" not in line and "/services/" not in line, line
    assert "Not Found for url: https://hooks.slack.com/[redacted] (said once; the run goes on)" in line


def test_a_secret_at_the_quote_s_cut_is_redacted_whole(tmp_path: Path) -> None:
    """The notifier's last line is redacted before it is cut to its length: a token there keeps none of itself."""
    token = "Ab1" * 14
    failing = script(tmp_path, "fail.sh", f'echo "{"." * (notify.QUOTE_CHARS - 15)} {token}" >&2\nexit 1\n')
    failures = Failures()
    notifier = Notifier([str(failing)], frozenset({"exit"}), failures)
    notifier.send({"event": "exit", "attempt": 0, "code": 1})
    notifier.close(timeout=10)

    [(kind, line)] = failures.seen
    assert kind == "status" and token[:6] not in line, line
