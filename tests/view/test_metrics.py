"""Metrics of a real supervised run with a stall, read by a real node_exporter and served over HTTP.

One run (tests/supervised.py's faulty child, hung at step 3 of its first attempt) is watched at four
moments: before its directory exists, while it hangs, while its second attempt trains, and after it
ended. The textfile is the supervisor's own (``supervise --metrics-textfile``; before the run,
``trainbox metrics RUN_DIR --textfile``), scraped through Debian's ``prometheus-node-exporter`` (its
textfile collector only); the same directory is served by ``trainbox metrics RUN_DIR --serve``. Each
moment is taken once both scrapes show it. ``promtool check metrics`` (Debian's ``prometheus``) lints
both. A program this needs and the machine lacks fails the test, with the package to install.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.supervised import REPO, cli_env, faulty_child, program, survivors, wait_for
from trainbox.errors import UserError
from trainbox.rundir.events import Cause
from trainbox.rundir.layout import RunDir
from trainbox.view import metrics

#: One supervised run feeds every test here: with -n, keep them in one worker, so it runs once.
pytestmark = pytest.mark.xdist_group("metrics-run")

#: The hang's budget: the supervisor rewrites its textfile at least every REFRESH_EVERY_S (5 s), so one rewrite
#: lands between 1 s of silence and the stall.
STALL_S = 8
#: The second attempt's steps at 0.05 s each: 25 s of training, time for two progress samples (one per 5 s) and
#: a textfile rewritten after them.
STEPS = "500"
RUN = "stalled-run"
SUPERVISE = [
    "supervise",
    "--startup-timeout",
    "15",
    "--stall-timeout",
    str(STALL_S),
    "--grace",
    "1",
    "--backoff",
    "0.1",
    "--quiet",
]
#: The moments the run is scraped at, in order.
MOMENTS = ("before", "hung", "training", "ended")
SOURCES = ("node_exporter", "serve")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def samples(text: str) -> Dict[str, List[tuple]]:
    """Sample name -> [(labels, value)], from a scrape."""
    found: Dict[str, List[tuple]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(text: str, name: str, run: str, **labels: str) -> Optional[float]:
    """The value of the one sample ``name{run=..., labels...}`` in a scrape; None when absent."""
    matching = [v for found, v in samples(text).get(name, []) if found.get("run") == run and labels.items() <= found.items()]
    assert len(matching) <= 1, (name, labels, matching)
    return matching[0] if matching else None


def current_state(text: str, run: str) -> List[str]:
    return [labels["state"] for labels, v in samples(text)["trainbox_state"] if labels["run"] == run and v == 1]


@dataclass
class NodeExporter:
    textfiles: Path
    url: str
    proc: subprocess.Popen

    def scrape(self) -> str:
        text = scrape(self.url)
        assert "node_textfile_scrape_error 0" in text, text[-2000:]  # every textfile parsed
        return text


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    binary = program("prometheus-node-exporter", "node_exporter", package="prometheus-node-exporter")
    textfiles = tmp_path_factory.mktemp("textfiles")
    port = free_port()
    argv = [
        binary,
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={textfiles}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    exporter = NodeExporter(textfiles, f"http://127.0.0.1:{port}/metrics", proc)

    def answers() -> bool:
        assert proc.poll() is None, f"node_exporter ended: {proc.stderr.read().decode() if proc.stderr else ''}"
        with contextlib.suppress(OSError):
            return "node_textfile_scrape_error" in scrape(exporter.url)
        return False

    try:
        wait_for(answers, 30, "node_exporter to answer")
        yield exporter
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Watched:
    """What was scraped at each moment of the run, through each source, and how it ended."""

    run_dir: Path
    scraped: Dict[str, Dict[str, str]] = field(default_factory=lambda: {source: {} for source in SOURCES})
    taken_ts: Dict[str, float] = field(default_factory=dict)
    code: Optional[int] = None

    @property
    def events(self) -> List[dict]:
        return [json.loads(line) for line in (self.run_dir / "events.jsonl").read_text().splitlines()]


def cli(*args: str) -> List[str]:
    return [sys.executable, "-m", "trainbox", *args]


def shows_the_hang(text: str) -> bool:
    silence = value(text, "trainbox_silence_seconds", RUN)
    return value(text, "trainbox_step", RUN) == 3 and silence is not None and silence >= 1.0


def shows_training_again(text: str) -> bool:
    """The second attempt trains, and its pace is known (two progress samples with a step)."""
    pace = value(text, "trainbox_steps_per_second", RUN)
    return current_state(text, RUN) == ["running"] and value(text, "trainbox_restarts_total", RUN) == 1 and bool(pace)


@pytest.fixture(scope="module")
def watched(node_exporter: NodeExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    run_dir = tmp_path_factory.mktemp("runs") / RUN
    textfile = node_exporter.textfiles / f"{RUN}.prom"
    seen = Watched(run_dir)
    port = free_port()
    server = subprocess.Popen(cli("metrics", str(run_dir), "--serve", f"127.0.0.1:{port}"), env=cli_env(), cwd=REPO)
    served = f"http://127.0.0.1:{port}/metrics"

    def take(moment: str, ready: Callable[[str], bool], timeout: float) -> None:
        """Scrape both until each shows the moment (the textfile is rewritten every few seconds)."""
        texts: Dict[str, str] = {}

        def shown() -> bool:
            texts["node_exporter"], texts["serve"] = node_exporter.scrape(), scrape(served)
            return all(ready(text) for text in texts.values())

        wait_for(shown, timeout, f"both scrapes to show the run {moment}")
        seen.taken_ts[moment] = time.time()
        for source, text in texts.items():
            seen.scraped[source][moment] = text

    child = faulty_child("--steps", STEPS, "--interval", "0.05")
    argv = cli(*SUPERVISE, "--run-dir", str(run_dir), "--metrics-textfile", str(textfile), "--", *child)
    env = cli_env({"TRAIN_FAULT": "sleep@step,step=3,attempt=0"})
    try:
        wait_for(lambda: _answers(served), 60, "trainbox metrics --serve to answer")
        subprocess.run(cli("metrics", str(run_dir), "--textfile", str(textfile)), env=cli_env(), cwd=REPO, check=True)
        take("before", lambda text: current_state(text, RUN) == ["unknown"], 30)
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        take("hung", shows_the_hang, 60)
        take("training", shows_training_again, 90)
        _, stderr = proc.communicate(timeout=120)
        seen.code = proc.returncode
        assert seen.code == 0, stderr.decode()[-2000:]
        take("ended", lambda text: current_state(text, RUN) == ["succeeded"], 30)
        yield seen
    finally:
        server.terminate()
        assert server.wait(10) == 0
        assert not survivors(run_dir)


def _answers(url: str) -> bool:
    with contextlib.suppress(OSError):
        return bool(scrape(url))
    return False


@pytest.fixture(params=SOURCES)
def scraped(request: pytest.FixtureRequest, watched: Watched) -> Dict[str, str]:
    return watched.scraped[request.param]


def test_before_the_run_exists_its_state_is_unknown(scraped: Dict[str, str]) -> None:
    text = scraped["before"]
    assert current_state(text, RUN) == ["unknown"]
    assert value(text, "trainbox_restarts_total", RUN) == 0
    assert value(text, "trainbox_silence_seconds", RUN) is None


def test_while_it_hangs_the_silence_grows_against_its_budget(scraped: Dict[str, str], watched: Watched) -> None:
    text = scraped["hung"]
    assert current_state(text, RUN) in (["running"], ["stalled"])  # a stall may be declared as the scrape is taken
    assert value(text, "trainbox_step", RUN) == 3
    assert value(text, "trainbox_budget_seconds", RUN) == STALL_S
    assert 1.0 <= value(text, "trainbox_silence_seconds", RUN) < STALL_S + 30  # type: ignore[operator]
    last_progress = value(text, "trainbox_last_progress_timestamp_seconds", RUN)
    assert last_progress is not None and last_progress <= watched.taken_ts["hung"] - 1.0
    assert value(text, "trainbox_restarts_total", RUN) == 0
    assert all(v == 0 for labels, v in samples(text)["trainbox_stalls_total"] if labels["run"] == RUN)
    assert value(text, "trainbox_slow_ratio", RUN) == 1


def test_after_the_stall_the_next_attempt_shows_the_restart_the_cause_and_its_pace(
    scraped: Dict[str, str], watched: Watched
) -> None:
    text = scraped["training"]
    (stall,) = [e for e in watched.events if e["event"] == "stall"]
    assert current_state(text, RUN) == ["running"]
    assert value(text, "trainbox_restarts_total", RUN) == 1
    assert value(text, "trainbox_stalls_total", RUN, cause=stall["cause"]) == 1
    assert sum(v for labels, v in samples(text)["trainbox_stalls_total"] if labels["run"] == RUN) == 1
    assert value(text, "trainbox_step", RUN) > 3  # type: ignore[operator]
    assert 1.0 < value(text, "trainbox_steps_per_second", RUN) <= 20.0  # type: ignore[operator]  # one step per 0.05 s at most
    assert value(text, "trainbox_silence_seconds", RUN) < STALL_S  # type: ignore[operator]
    assert value(text, "trainbox_run_info", RUN, phase="train", profile="") == 1


def test_after_the_run_it_shows_success_and_the_history(scraped: Dict[str, str], watched: Watched) -> None:
    text = scraped["ended"]
    (stall,) = [e for e in watched.events if e["event"] == "stall"]
    assert current_state(text, RUN) == ["succeeded"]
    assert value(text, "trainbox_restarts_total", RUN) == 1
    assert value(text, "trainbox_stalls_total", RUN, cause=stall["cause"]) == 1
    assert {labels["cause"] for labels, _ in samples(text)["trainbox_stalls_total"]} >= {c.value for c in Cause}
    assert value(text, "trainbox_step", RUN) == int(STEPS) - 1
    for gone in ("trainbox_silence_seconds", "trainbox_budget_seconds", "trainbox_steps_per_second", "trainbox_eta_seconds"):
        assert value(text, gone, RUN) is None, gone
    assert value(text, "trainbox_supervisor_updated_timestamp_seconds", RUN) <= watched.taken_ts["ended"]  # type: ignore[operator]


def test_node_exporter_and_serve_say_the_same(watched: Watched) -> None:
    def trainbox_only(text: str) -> Dict[str, list]:
        found = samples(text).items()
        return {
            name: sorted((sorted(labels.items()), v) for labels, v in rows)
            for name, rows in found
            if name.startswith("trainbox_")
        }

    by_textfile, served = (trainbox_only(watched.scraped[source]["ended"]) for source in SOURCES)
    assert by_textfile == served


def test_promtool_accepts_the_textfile_and_the_served_page(watched: Watched, tmp_path: Path) -> None:
    promtool = program("promtool", package="prometheus")
    served = watched.scraped["serve"]["ended"]
    rendered = metrics.render(metrics.collect(watched.run_dir))
    for text in (rendered, served):
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_several_runs_share_one_textfile_directory(node_exporter: NodeExporter, watched: Watched, tmp_path: Path) -> None:
    other = tmp_path / "garbage-run"
    other.mkdir()
    (other / "state.json").write_text('{"state": "gave_up\\"\\n"}')
    (other / "events.jsonl").write_bytes(b'[1]\n{"ts": 1.79e9, "event": "restart"}\n\xe9\n' + b"[" * 100_000 + b"\n")
    metrics.write_textfile(other, node_exporter.textfiles / "garbage-run.prom")
    try:
        text = node_exporter.scrape()
    finally:
        (node_exporter.textfiles / "garbage-run.prom").unlink()
    assert current_state(text, "garbage-run") == ['gave_up"\ufffd']  # a control character is replaced (rundir.records.text)
    assert value(text, "trainbox_restarts_total", "garbage-run") == 1
    assert current_state(text, RUN) == ["succeeded"]


# -- reading a run directory that was written by hand -----------------------------------------------------------------------
def write(run_dir: Path, name: str, content: object) -> None:
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, (list, tuple)):
        path.write_text("".join(json.dumps(record) + "\n" for record in content))
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))


def rendered_value(run_dir: Path, name: str, now: float, **kwargs: object) -> Optional[float]:
    text = metrics.render(metrics.collect(run_dir, now=now, **kwargs))  # type: ignore[arg-type]
    return value(text, name, run_dir.name)


def test_the_slow_ratio_holds_from_a_slow_event_until_recovered_or_a_new_attempt(tmp_path: Path) -> None:
    events = [
        {"ts": 1, "event": "start", "attempt": 0, "profile": "fast"},
        {"ts": 2, "event": "slow", "attempt": 0, "ratio": 0.41, "suspect": "contention"},
    ]
    write(tmp_path, "events.jsonl", events)
    assert rendered_value(tmp_path, "trainbox_slow_ratio", now=3) == 0.41
    for ending in ("recovered", "start", "exit"):
        write(tmp_path, "events.jsonl", [*events, {"ts": 3, "event": ending, "attempt": 0}])
        assert rendered_value(tmp_path, "trainbox_slow_ratio", now=4) == 1, ending


def test_eta_and_deadline_where_they_are_known(tmp_path: Path) -> None:
    # Epoch 3 of 10 at step 250 with 100 batches per epoch, batch 16 at 32 img/s: 750 steps, 375 s left.
    write(tmp_path, "heartbeat.json", {"epoch": 3, "batch": 50, "step": 250, "imgs_per_s": 32.0, "phase": "train"})
    write(tmp_path, "train/args.yaml", "epochs: 10\nbatch: 16\n")
    assert rendered_value(tmp_path, "trainbox_eta_seconds", now=0) == 375
    assert rendered_value(tmp_path, "trainbox_deadline_timestamp_seconds", now=0) is None
    assert rendered_value(tmp_path, "trainbox_deadline_timestamp_seconds", now=0, deadline_ts=1_800_000_000) == 1_800_000_000
    assert rendered_value(tmp_path, "trainbox_epoch", now=0) == 3


def test_labels_that_need_escaping_come_back_intact(tmp_path: Path) -> None:
    profile = 'a "quoted"\\ name'
    write(tmp_path, "events.jsonl", [{"ts": 1, "event": "start", "attempt": 0, "profile": profile}])
    text = metrics.render(metrics.collect(tmp_path, now=2))
    assert value(text, "trainbox_run_info", tmp_path.name, profile=profile) == 1


def test_the_pace_is_zero_once_the_child_was_silent_for_the_whole_window(tmp_path: Path) -> None:
    write(tmp_path, "progress.jsonl", [{"ts": 100 + 5 * n, "attempt": 0, "step": 10 * n, "phase": "train"} for n in range(4)])
    assert rendered_value(tmp_path, "trainbox_steps_per_second", now=116) == 2
    assert rendered_value(tmp_path, "trainbox_steps_per_second", now=115 + metrics.PACE_WINDOW_S + 1) == 0


def test_files_that_block_or_are_not_files_are_passed_over(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")
    os.mkfifo(tmp_path / "events.jsonl")
    (tmp_path / "heartbeat.json").mkdir()
    (tmp_path / "progress.jsonl").symlink_to("/dev/zero")
    (tmp_path / "heartbeats").mkdir()
    os.mkfifo(tmp_path / "heartbeats" / "rank-0.json")
    result: List[str] = []
    reader = threading.Thread(target=lambda: result.append(metrics.render(metrics.collect(tmp_path))), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading the run directory blocked"
    assert current_state(result[0], tmp_path.name) == ["unknown"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
record = st.fixed_dictionaries(
    {"event": st.sampled_from(["start", "stall", "restart", "slow", "recovered", "exit", "crash"])},
    optional={
        "ts": json_values,
        "attempt": json_values,
        "ratio": json_values,
        "cause": json_values,
        "profile": json_values,
        "step": json_values,
        "phase": json_values,
    },
)
file_content = (
    st.binary(max_size=200)
    | json_values.map(json.dumps)
    | st.lists(record | json_values, max_size=6).map(lambda rows: "\n".join(json.dumps(row) for row in rows))
)
FILES = ("state.json", "heartbeat.json", "events.jsonl", "progress.jsonl", "train/args.yaml", "heartbeats/rank-0.json")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.fixed_dictionaries({}, optional={name: file_content for name in FILES}), now=json_values)
def test_any_content_renders_and_parses(tmp_path: Path, contents: Dict[str, object], now: object) -> None:
    run_dir = tmp_path / "fuzzed"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    for name, content in contents.items():
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else str(content).encode())
    moment = now if isinstance(now, (int, float)) and not isinstance(now, bool) and abs(now) < 1e12 else None
    text = metrics.render(metrics.collect(run_dir, now=moment))
    assert len(current_state(text, "fuzzed")) == 1
    assert all(name.startswith("trainbox_") for name in samples(text))


# -- the command's pieces ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, address",
    [
        ("9101", ("127.0.0.1", 9101)),
        ("127.0.0.1:9101", ("127.0.0.1", 9101)),
        ("[::1]:9101", ("::1", 9101)),
        (":9101", ("0.0.0.0", 9101)),
    ],
)
def test_serve_addresses(text: str, address: tuple) -> None:
    assert metrics.parse_address(text) == address


@pytest.mark.parametrize("text", ["", "host:", "127.0.0.1:http", "127.0.0.1:70000", "9101:"])
def test_a_bad_serve_address_is_one_line(text: str) -> None:
    with pytest.raises(UserError, match=r"give \[ADDR:\]PORT"):
        metrics.parse_address(text)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    metrics.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_writes_a_textfile_with_its_deadline(tmp_path: Path) -> None:
    out = tmp_path / "textfiles" / "run.prom"
    assert metrics.main(parse(str(tmp_path), "--textfile", str(out), "--deadline", "2030-01-01T00:00+00:00")) == 0
    assert value(out.read_text(), "trainbox_deadline_timestamp_seconds", tmp_path.name) == 1893456000


def test_a_textfile_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot write"):
        metrics.main(parse(str(tmp_path), "--textfile", str(blocker / "run.prom")))


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"):
            metrics.serve(tmp_path, "127.0.0.1", port)


def test_serve_without_prometheus_client_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as where it is not installed
    with pytest.raises(UserError, match=r"--serve needs prometheus_client: pip install prometheus_client"):
        metrics.serve(tmp_path, "127.0.0.1", 0)


def test_the_supervisors_textfile_that_cannot_be_written_is_one_line_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    keeper = metrics.Keeper(blocker / "run.prom")
    for _ in range(3):
        keeper(RunDir(tmp_path))
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(f"trainbox: metrics: cannot write {blocker / 'run.prom'}: ")
    assert said[0].endswith("(said once; the run goes on)")
    good = metrics.Keeper(tmp_path / "textfiles" / "run.prom")
    good(RunDir(tmp_path))
    assert current_state((tmp_path / "textfiles" / "run.prom").read_text(), tmp_path.name) == ["unknown"]


def test_serve_ends_on_a_stop_signal(tmp_path: Path) -> None:
    port = free_port()
    code = "import sys; from trainbox.view import metrics; sys.exit(metrics.serve(sys.argv[1], '127.0.0.1', int(sys.argv[2])))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / ".mypy"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(port)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and f"on http://127.0.0.1:{port}/metrics" in proc.stdout.readline()
        assert current_state(scrape(f"http://127.0.0.1:{port}/metrics"), tmp_path.name) == ["unknown"]
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        proc.kill()


# -- the documented alert rules (docs/watching.md) --------------------------------------------------------------------------
#: Three runs, a minute apart: one whose progress stopped at 0, one that keeps making progress, one that gave up at 2m.
RULE_TESTS = """\
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'trainbox_last_progress_timestamp_seconds{run="stuck"}', values: '0x20'}
      - {series: 'trainbox_state{run="stuck",state="running"}', values: '1x20'}
      - {series: 'trainbox_last_progress_timestamp_seconds{run="fine"}', values: '0+60x20'}
      - {series: 'trainbox_state{run="fine",state="running"}', values: '1x20'}
      - {series: 'trainbox_state{run="done",state="running"}', values: '1 1 0x18'}
      - {series: 'trainbox_state{run="done",state="gave_up"}', values: '0 0 1x18'}
      - {series: 'trainbox_last_progress_timestamp_seconds{run="done"}', values: '0x20'}
    alert_rule_test:
      - {eval_time: 9m, alertname: TrainboxNoProgress, exp_alerts: []}
      - eval_time: 11m
        alertname: TrainboxNoProgress
        exp_alerts:
          - exp_labels: {severity: warning, run: stuck}
            exp_annotations: {summary: "trainbox run stuck: no progress for 10 minutes"}
      - {eval_time: 1m, alertname: TrainboxGaveUp, exp_alerts: []}
      - eval_time: 3m
        alertname: TrainboxGaveUp
        exp_alerts:
          - exp_labels: {severity: critical, run: done, state: gave_up}
            exp_annotations: {summary: "trainbox run done ended without finishing (gave_up)"}
"""


def documented_rules() -> str:
    """The ``yaml`` block of the Alerting section of docs/watching.md."""
    section = (REPO / "docs" / "watching.md").read_text().split("### Alerting", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_documented_alert_rules_pass_promtool_and_fire_when_they_should(tmp_path: Path) -> None:
    promtool = program("promtool", package="prometheus")
    (tmp_path / "rules.yml").write_text(documented_rules())
    (tmp_path / "tests.yml").write_text(RULE_TESTS)
    for check in (["check", "rules", "rules.yml"], ["test", "rules", "tests.yml"]):
        done = subprocess.run([promtool, *check], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    names = {metric.name for metric in metrics.METRICS}
    assert {"trainbox_last_progress_timestamp_seconds", "trainbox_state"} <= names


NAME_BYTES = st.binary(min_size=1, max_size=40).filter(
    lambda name: b"/" not in name and b"\0" not in name and name not in (b".", b"..")
)


@settings(max_examples=30, deadline=None)
@given(NAME_BYTES)
def test_a_run_directory_named_in_any_bytes_gets_its_textfile(name: bytes) -> None:
    """A folder's name is bytes: one that is not UTF-8 (``run-\\xe9``) is labelled with ``?`` for what UTF-8 cannot say."""
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(os.fsdecode(os.path.join(os.fsencode(folder), name)))
        run_dir.mkdir()
        out = Path(folder) / "run.prom"
        metrics.write_textfile(run_dir, out)
        families = list(text_string_to_metric_families(out.read_bytes().decode("utf-8")))
        labels = {sample.labels["run"] for family in families for sample in family.samples}
        assert labels == {metrics.run_name(run_dir)}, "the name, as one line UTF-8 can hold"


def test_metrics_textfile_of_a_run_directory_whose_name_is_not_utf8(tmp_path: Path) -> None:
    run_dir = Path(os.fsdecode(os.fsencode(tmp_path) + b"/run-\xe9"))
    run_dir.mkdir()
    out = tmp_path / "run.prom"
    done = subprocess.run(
        [sys.executable, "-m", "trainbox", "metrics", os.fsencode(run_dir), "--textfile", str(out)],
        capture_output=True,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr.decode()
    assert 'run="run-?"' in out.read_text()
