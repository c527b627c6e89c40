"""``trainbox report``: the report the supervisor leaves after a real run with a stall, opened in a real Chromium.

The run is real: ``python -m trainbox supervise`` over ``tests.epochs`` (a child that
trains like Ultralytics in seconds: epochs, results.csv, last.pt, resume), hung by
``trainbox.faults`` in epoch 2, noticed, reported, killed and resumed. The
Ultralytics version of the same is ``tests/yolo/test_report.py``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageStat

from tests.supervised import REPO, Finished, faulty_child, train_cli
from trainbox.errors import ExitCode
from trainbox.rundir.events import EVENTS
from trainbox.rundir.layout import IncidentDir, RunDir
from trainbox.view import html_report, runview

EPOCHS, BATCHES = 4, 5
#: The hang: attempt 0, epoch 2, after its 3rd batch (step 8); the restart resumes epoch 2 from step 5.
FAULT = "sleep@train_batch,attempt=0,epoch=2,batch=3"
OPTIONS = ["--stall-timeout", "2", "--startup-timeout", "20", "--grace", "1", "--backoff", "0.2", "--quiet"]


def epochs_child() -> List[str]:
    return [sys.executable, "-m", "tests.epochs", "--epochs", str(EPOCHS), "--batches", str(BATCHES), "--interval", "0.15"]


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """A finished supervised run: one stall in epoch 2, one restart, completed; its report written by the supervisor."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    # Every beat written (not once a second): the stall's last beat is the batch the hang came after.
    env = {"TRAIN_FAULT": FAULT, "TRAIN_HEARTBEAT_INTERVAL": "0.01"}
    done = train_cli(["supervise", "--run-dir", str(run_dir), *OPTIONS, "--", *epochs_child()], run_dir, env)
    assert done.code == 0, done.stderr
    assert done.kinds() == ["start", "stall", "restart", "start", "exit"]
    return done


def shadowing(shadow: Path) -> Dict[str, str]:
    """The environment of a child whose imports find ``shadow``'s modules first (this checkout's trainbox still next)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))}


def images(page: str) -> List[Image.Image]:
    return [
        Image.open(io.BytesIO(base64.b64decode(data))) for data in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    ]


def test_the_supervisor_leaves_a_report_with_the_events_the_stall_and_the_figures(stalled_run: Finished) -> None:
    run = RunDir(stalled_run.run_dir)
    assert run.report.stat().st_mtime >= stalled_run.of("exit")[0]["ts"] - 1, "written as the run ended"
    last = stalled_run.stderr.splitlines()[-1]
    assert last == f"trainbox: report: {run.report} (written again by: python -m trainbox report {run.root})", last
    page = run.report.read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))

    charts = images(page)
    assert len(charts) == 3, "throughput, loss/mAP and silences"
    assert all(chart.format == "PNG" and chart.width >= 600 and chart.height >= 150 for chart in charts)
    assert 'src="http' not in page and "src='http" not in page, "self-contained: nothing to fetch"

    for event in stalled_run.events:  # the history: every event, at its time
        assert f"{event['event']}" in text
    assert len(re.findall(r"<tr><td>[^<]+</td><td>\d+</td><td>(start|stall|restart|exit)</td>", page)) == 5

    (stall,) = stalled_run.of("stall")
    assert f"stall {stall['budget_s']:g} s" in text and f"{stall['silent_s']:.1f} s" in text
    assert "3 steps done again" in text, "lost work: steps 6-8 of epoch 2 were trained again"
    for field in ("cause", "evidence"):  # recorded by supervisors that diagnose the stall; shown when there
        if stall.get(field):
            assert (stall[field] if isinstance(stall[field], str) else stall[field][0]) in text

    incident = Path(stall["incident"])
    link = os.path.relpath(IncidentDir(incident).summary, run.root)
    assert f'href="{link}"' in page and (run.root / link).is_file()
    assert re.search(r"restarts, stalls, crashes\s+1, 1, 0", text)
    assert re.search(rf"epochs in results.csv\s+{EPOCHS} of {EPOCHS}", text)
    assert re.search(r"time lost to stalls\s+0m0\ds", text) and "final profile" not in text, "a command has no profile"
    assert re.search(r"train\s+\d+\s+[\d.]+ s\s+stall 2 s", text), "the train phase's silences against the stall budget"


def test_the_view_resumes_where_the_checkpoint_was(stalled_run: Finished) -> None:
    view = runview.read(stalled_run.run_dir)
    (stall,) = view.stalls
    assert stall.last_beat["step"] == BATCHES + 3 and stall.phase == "train"
    loss = view.loss(stall)
    assert loss.steps == 3 and loss.regained and stall.silent_s < loss.seconds < 30
    assert [a.ended_by for a in view.attempts] == ["stall", "exit"]
    assert [row["epoch"] for row in view.results] == list(range(1, EPOCHS + 1))
    assert {s["attempt"] for s in view.samples} == {0, 1}
    assert "startup" in html_report.phase_silences(view) and "train" in html_report.phase_silences(view)


def test_the_stall_cause_and_its_first_evidence_line_are_shown(stalled_run: Finished) -> None:
    """The supervisor classifies every stall (trainbox.diagnose.causes): its stall event's cause and first evidence line."""
    stall = stalled_run.of("stall")[0]
    assert stall["cause"] and stall["evidence"], stall
    text = html.unescape(RunDir(stalled_run.run_dir).report.read_text())
    incidents = text.split("Incidents")[1].split("History")[0]
    assert stall["cause"] in incidents and stall["evidence"][0] in incidents


def test_cause_and_evidence_are_read_from_the_incident_when_the_event_lacks_them(stalled_run: Finished, tmp_path: Path) -> None:
    """An older supervisor's stall event has no cause: the report falls back to the incident's summary.json."""
    copy = tmp_path / "run"
    shutil.copytree(stalled_run.run_dir, copy)
    history = RunDir(copy).events
    records = [json.loads(line) for line in history.read_text().splitlines()]
    for record in records:
        if record["event"] == "stall":
            record.pop("cause"), record.pop("evidence")
    history.write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = IncidentDir(copy / "incidents" / Path(stalled_run.of("stall")[0]["incident"]).name).summary
    recorded = json.loads(summary.read_text())
    recorded.update(cause="dataloader worker deadlock", evidence=["worker 4711 blocked in hang_sleep (faults.py:39)", "more"])
    summary.write_text(json.dumps(recorded))
    text = html.unescape(html_report.write(copy).read_text())
    assert "dataloader worker deadlock" in text and "worker 4711 blocked in hang_sleep (faults.py:39)" in text
    assert "more" not in text.split("Incidents")[1].split("History")[0], "one line of evidence"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/docker-setup.sh does; in CI this fails)")
    return found


def test_the_report_renders_in_headless_chromium(stalled_run: Finished, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    page = RunDir(stalled_run.run_dir).report
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,1800"]
    done = subprocess.run(
        [*command, f"--screenshot={shot}", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=str(tmp_path)),  # its profile and crash reports go there
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    picture = Image.open(shot).convert("RGB")
    assert picture.size == (1100, 1800)
    spread = ImageStat.Stat(picture.convert("L")).stddev[0]
    assert spread > 20, f"the screenshot is (nearly) blank: grey-level spread {spread:.1f}"
    # The charts are drawn, not only the tables: the stall's red (#d62728) is on the page.
    reds = sum(1 for r, g, b in picture.getdata() if r > 180 and g < 80 and b < 80)
    assert reds > 50, f"no stall marker in the rendered charts ({reds} red pixels)"


def test_a_failing_report_does_not_change_how_the_run_ended(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.report.mkdir(parents=True)  # a directory where the report goes: it cannot be written
    done = train_cli(["supervise", "--run-dir", str(tmp_path), *OPTIONS, "--", *faulty_child("--steps", "3")], tmp_path)
    assert done.code == 0 and done.kinds() == ["start", "exit"]
    assert re.search(r"^trainbox: no report written: \w+Error: .+$", done.stderr, re.M), done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "{missing}"], "is not a directory"),
        (["report", "{run}", "--deadline", "tomorrow"], "--deadline 'tomorrow': use HH:MM"),
        (["status", "--run-dir", "{run}", "--deadline", "25:99"], "--deadline '25:99': use HH:MM"),
        (["status", "--run-dir", "{missing}", "--watch"], "not found"),
    ],
)
def test_mistakes_are_one_line(stalled_run: Finished, tmp_path: Path, args: List[str], message: str) -> None:
    given = [a.format(missing=tmp_path / "nope", run=stalled_run.run_dir) for a in args]
    done = train_cli(given, tmp_path, timeout=60)
    assert done.code == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_report_to_another_file_links_back_into_the_run(stalled_run: Finished, tmp_path: Path) -> None:
    out = tmp_path / "elsewhere" / "r.html"
    done = train_cli(["report", str(stalled_run.run_dir), "--out", str(out), "--deadline", "2000-01-01T00:00"], tmp_path)
    assert done.code == 0 and done.stdout.strip() == str(out), done.stderr
    text = html.unescape(out.read_text())
    assert re.search(r"deadline\s+2000-01-01 00:00: finished \d\d:\d\d, late by", re.sub(r"<[^>]+>", " ", text))
    for href in re.findall(r'href="([^"]+)"', text):
        assert (out.parent / href).exists(), href


def test_without_matplotlib_the_run_ends_as_it_would_with_one_line_saying_so(tmp_path: Path) -> None:
    """A Python without matplotlib (a plain `pip install trainbox`): here one whose matplotlib cannot be imported."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "matplotlib.py").write_text("raise ModuleNotFoundError('No module named matplotlib', name='matplotlib')\n")
    run_dir = tmp_path / "run"
    env = shadowing(shadow)
    done = train_cli(["supervise", "--run-dir", str(run_dir), *OPTIONS, "--", *faulty_child("--steps", "3")], run_dir, env)
    assert done.code == 0 and done.kinds() == ["start", "exit"], done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "trainbox: no report written: matplotlib is not installed (`pip install matplotlib`; the host and yolo extras have it)"
    )
    assert not RunDir(run_dir).report.exists()
    refused = train_cli(["report", str(run_dir)], run_dir, env)
    assert (
        refused.code == 2
        and refused.stderr
        == "trainbox: error: trainbox report needs matplotlib: pip install matplotlib (the host and yolo extras have it)\n"
    )


def test_the_host_extra_renders_a_report(stalled_run: Finished, tmp_path: Path) -> None:
    """`trainbox report` on a host with the `host` extra: matplotlib is in it, and nothing of the `yolo` extra is needed
    (here torch, torchvision, Ultralytics and OpenCV cannot be imported)."""
    host = re.search(r"^host = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert host and "matplotlib" in re.findall(r'"([A-Za-z0-9_.-]+)', host.group(1))
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for module in ("torch", "torchvision", "ultralytics", "cv2"):
        (shadow / f"{module}.py").write_text(f"raise ModuleNotFoundError('No module named {module}', name='{module}')\n")
    out = tmp_path / "report.html"
    done = train_cli(["report", str(stalled_run.run_dir), "--out", str(out)], stalled_run.run_dir, shadowing(shadow))
    assert done.code == 0 and done.stdout.strip() == str(out), done.stderr
    assert len(images(out.read_text())) == 3


@pytest.mark.parametrize(
    "span_s, unit, ticks",
    [
        (12.0, "seconds", 12),
        (179.0, "seconds", 179),
        (181.0, "minutes", 3.0),
        (2.5 * 3600, "minutes", 150),
        (9 * 3600, "hours", 9),
    ],
)
def test_the_time_axis_reads_in_the_unit_that_fits_its_span(span_s: float, unit: str, ticks: float) -> None:
    axis = html_report.time_axis(1_800_000_000.0, 1_800_000_000.0 + span_s)
    assert axis.unit == unit and axis.x(1_800_000_000.0 + span_s) == pytest.approx(ticks, rel=0.01)
    assert axis.label.startswith(f"{unit} since 20")


def test_the_timeline_ticks_are_plain_numbers_of_the_unit(stalled_run: Finished) -> None:
    figure = html_report.timeline_figure(runview.read(stalled_run.run_dir))
    axes = figure.axes[0]
    figure.canvas.draw()
    labels = [tick.get_text() for tick in axes.get_xticklabels() if tick.get_text()]
    assert axes.get_xlabel().startswith("seconds since "), "a run of seconds, in seconds"
    assert labels and all(re.fullmatch(r"[−-]?\d+", label) for label in labels), labels


def test_every_event_has_details_in_the_history(stalled_run: Finished) -> None:
    assert set(html_report.EVENT_DETAILS) == set(EVENTS)
    device = {"event": "device", "description": "CPU (2 cores)", "amp": False, "workers": 0, "pin_memory": False}
    assert html_report._event_detail(device) == "description CPU (2 cores), amp False, workers 0, pin_memory False"


def test_status_without_watch_is_the_snapshot(stalled_run: Finished) -> None:
    done = train_cli(["status", "--run-dir", str(stalled_run.run_dir), "--deadline", "2000-01-01T00:00"], stalled_run.run_dir)
    assert done.code == 0, done.stderr
    assert f"epoch {EPOCHS}/{EPOCHS}" in done.stdout and "restarts  1, stalls 1, crashes 0" in done.stdout
    assert "deadline  2000-01-01 00:00: finished" in done.stdout and "finished at" in done.stdout, "the run has ended"


def test_a_directory_supervised_twice_is_one_run(tmp_path: Path) -> None:
    """The first supervisor gives up after the stall; a second one (a rerun, a restarted container) finishes the run."""
    run_dir = tmp_path / "run"
    env = {"TRAIN_FAULT": FAULT, "TRAIN_HEARTBEAT_INTERVAL": "0.01"}
    first = train_cli(
        ["supervise", "--run-dir", str(run_dir), *OPTIONS, "--max-restarts", "0", "--", *epochs_child()], run_dir, env
    )
    assert first.code == ExitCode.HUNG, first.stderr
    calm = {"TRAIN_HEARTBEAT_INTERVAL": "0.01"}  # attempts count from 0 again: the fault would fire again
    second = train_cli(["supervise", "--run-dir", str(run_dir), *OPTIONS, "--", *epochs_child()], run_dir, calm)
    assert second.code == 0 and second.kinds() == ["start", "stall", "give_up", "exit", "start", "exit"], second.stderr

    view = runview.read(run_dir)
    assert [(a.index, a.number, a.ended_by) for a in view.attempts] == [(0, 0, "stall"), (1, 0, "exit")]
    assert sorted(view.samples_by_attempt()) == [0, 1] and view.finished
    (stall,) = view.stalls
    loss = view.loss(stall)
    assert loss.steps == 3 and loss.regained
    _, series = html_report._throughput(view)
    assert sorted(series) == [0, 1], "two lines: the attempts of both supervisors"
    text = html.unescape(re.sub(r"<[^>]+>", " ", RunDir(run_dir).report.read_text()))
    assert re.search(r"restarts, stalls, crashes\s+0, 1, 0", text) and re.search(rf"epochs in results.csv\s+{EPOCHS} of", text)


def _lines(path: Path, records: List[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_a_yolo_train_run_s_results_csv_is_drawn_from_its_own_save_dir(tmp_path: Path) -> None:
    """``yolo train`` writes results.csv beside the weights/ folder of the last.pt the supervisor found, not into the
    run directory: the report draws it (and only a file of that name, beside a ``weights/`` folder)."""
    save = tmp_path / "project" / "runs" / "detect" / "train"
    (save / "weights").mkdir(parents=True)
    header = "epoch,train/box_loss,val/box_loss,metrics/mAP50(B)\n"
    (save / "results.csv").write_text(header + "1,1.5,1.7,0.10\n2,1.2,1.4,0.25\n")
    run = tmp_path / "run"
    checkpoint = {"path": str(save / "weights" / "last.pt"), "mtime": 2.0, "step": None}
    (run / "state.json").parent.mkdir()
    (run / "state.json").write_text(json.dumps({"state": "succeeded", "checkpoint": checkpoint}))
    _lines(run / "events.jsonl", [{"event": "start", "attempt": 0, "ts": 1.0}, {"event": "exit", "attempt": 0, "ts": 9.0}])
    assert [row["epoch"] for row in runview.read(run).results] == [1.0, 2.0]
    page = html_report.write(run).read_text()
    assert "No results." not in page and "epochs in results.csv" in page
    for elsewhere in ("relative/weights/last.pt", str(save / "last.pt"), str(save / "weights" / ".." / "weights" / "x.pt")):
        (run / "state.json").write_text(json.dumps({"state": "succeeded", "checkpoint": {"path": elsewhere, "mtime": 2.0}}))
        assert runview.read(run).results == [], elsewhere


def test_the_loss_a_bar_showed_is_drawn_and_a_silence_of_no_phase_has_no_row(tmp_path: Path) -> None:
    samples = [
        {"ts": 10.0 + n, "attempt": 0, "step": 10 * n, "loss": 1.0 / (n + 1), "silences": {"": {"s": 0.5}, "train": {"s": 0.2}}}
        for n in range(4)
    ]
    _lines(tmp_path / "progress.jsonl", samples)
    _lines(tmp_path / "events.jsonl", [{"event": "start", "attempt": 0, "ts": 9.0}, {"event": "exit", "attempt": 0, "ts": 20.0}])
    view = runview.read(tmp_path)
    assert set(html_report.phase_silences(view)) == {"train"}, "no row without a name"
    assert html_report.curves_chart(view) is not None
    page = html_report.write(tmp_path).read_text()
    assert "No results." not in page and "<td></td><td>" not in page


#: A real tqdm loop whose bar shows the loss in its postfix, as most training loops' bars do.
TQDM_WITH_LOSS = """
import time
from tqdm import tqdm
with tqdm(total=14, mininterval=0) as bar:
    for step in range(14):
        time.sleep(0.5)
        bar.set_postfix(loss=round(2.0 / (step + 1), 3))
        bar.update(1)
"""


def test_the_loss_in_a_bar_s_postfix_is_read_from_a_real_tqdm_run_and_drawn(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["supervise", "--run-dir", str(run_dir), *OPTIONS, "--", sys.executable, "-c", TQDM_WITH_LOSS]
    done = train_cli(args, run_dir)
    assert done.code == 0, done.stderr
    view = runview.read(run_dir)
    # progress.jsonl samples every 5 s: the first beat (0/14, before any postfix) and one about step 11
    losses = {s["step"]: s["loss"] for s in view.samples if "loss" in s}
    assert losses and all(loss == round(2.0 / step, 3) for step, loss in losses.items()), view.samples
    assert "No results." not in RunDir(run_dir).report.read_text()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.none(), st.text(max_size=200), st.from_regex(r"/[a-z/.]{0,40}/weights/[a-z.]{0,8}\.pt", fullmatch=True)))
def test_any_checkpoint_path_in_state_json_gives_results_or_none(tmp_path: Path, path: object) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"state": "running", "checkpoint": {"path": path, "mtime": 1.0}}))
    results = runview.read(tmp_path).results
    assert isinstance(results, list) and all(isinstance(row, dict) for row in results)
