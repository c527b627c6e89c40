"""Prometheus metrics of one run, read from its run directory alone.

A workstation or a rented GPU often runs a monitoring stack already: node_exporter and Prometheus,
Grafana, Alertmanager. NVIDIA's fault-tolerance launcher, Kubeflow and the GPU device exporters
(DCGM, AMD's device-metrics exporter) all speak Prometheus; a trainbox run should too, so "no progress
for ten minutes" and "gave up" become ordinary alert rules. Two ways out, both from the run directory
alone (so they work from outside a container, and while no supervisor runs):

* :func:`write_textfile`: node_exporter's *textfile collector* format (the text exposition format
  0.0.4, without timestamps, which that collector refuses), written atomically (temp file in the same
  folder, rename: :mod:`trainbox.atomic`) so node_exporter never reads half a file. Not fsynced: it is
  rewritten every few seconds and says nothing after a power cut that the run directory does not. Each run
  writes its own ``NAME.prom`` and every sample carries a ``run`` label (the run directory's name), so
  several runs share one textfile directory. ``trainbox metrics --textfile`` writes it once; the supervisor
  keeps it with ``--metrics-textfile`` (:class:`Keeper`, the CLI's ``SupervisorSpec.on_publish``: the core
  never imports this module).
* :func:`serve`: ``/metrics`` over HTTP with the ``prometheus_client`` library, whose collector reads
  the run directory afresh at every scrape (a ``host`` extra; the textfile path needs only the
  standard library and PyYAML, so the supervisor can keep a textfile inside the container).

Names follow Prometheus' naming rules (https://prometheus.io/docs/practices/naming/): the
``trainbox_`` prefix, base units in the name (``_seconds``, ``_timestamp_seconds``), ``_total`` on
counters, ``_info`` on a metric that carries text in its labels. The choices:

* ``trainbox_state`` is one gauge per supervisor state with the value 1 for the current one and 0 for
  the others, all of them always present: the *StateSet* of OpenMetrics, and what node_exporter's
  systemd collector does for unit states (``node_systemd_unit_state{state="failed"}``). An alert is
  then ``trainbox_state{state="gave_up"} == 1``, and no series appears or disappears as the state
  changes (an info-style ``{state="..."} 1`` alone would make "not gave_up" an absent series).
* The profile (or ladder rung), the phase and the budget in force are text: labels of
  ``trainbox_run_info`` (always 1), joined to other metrics with ``* on(run) group_left(profile)``;
  as labels of every metric they would start new series on each change.
* Counters count the events in ``events.jsonl``, the whole directory's history, which only grows:
  they never go down (``state.json`` counts only its own supervisor's). ``trainbox_stalls_total`` has
  one series per cause (:class:`trainbox.rundir.events.Cause`, all present from 0), so ``increase()`` works
  from the first stall.
* ``trainbox_steps_per_second`` is the pace over the last :data:`PACE_WINDOW_S` of the current
  attempt's progress samples (``progress.jsonl``); 0 when no step was made within that window.
* ``trainbox_slow_ratio`` is the ``ratio`` of the latest ``slow`` event (issue 29: the rate against
  this run's own baseline) until a ``recovered``, a new attempt or the end; 1 when the run is at pace.
* ``trainbox_eta_seconds`` is :meth:`trainbox.view.runview.RunView.eta_s` (the same as ``status``);
  ``trainbox_deadline_timestamp_seconds`` is there when a deadline is given, so an alert is
  ``time() + trainbox_eta_seconds > trainbox_deadline_timestamp_seconds``.

The run directory is input that anything inside the run may have written (issue 33): nothing here raises on
it. It is read as ``status`` reads it, through :mod:`trainbox.rundir.safe` and typed by
:mod:`trainbox.rundir.records` (no link followed, regular files only, so a FIFO cannot block a scrape; bounded:
the newest :data:`trainbox.rundir.events.EVENTS_BYTES` of the history, so past that size the counters count only
that much); what cannot be used is skipped, and a value that is not a finite number leaves its metric out. A
missing directory renders as state ``unknown``. The textfile is written where the person said, never through the
run directory.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import os
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple
from wsgiref import simple_server

from trainbox import interrupt
from trainbox.atomic import remove_stale_temps, write_text_atomic
from trainbox.errors import UserError, say
from trainbox.rundir import records
from trainbox.rundir.events import Cause
from trainbox.rundir.layout import JobDir, RunDir
from trainbox.rundir.progress import MAX_SAMPLES, SAMPLE, SAMPLE_LINE_BYTES
from trainbox.rundir.records import parse_records, rank_files, read_beat
from trainbox.rundir.state import State
from trainbox.supervise.settings import METRICS_TEXTFILE
from trainbox.view import status
from trainbox.view.runview import RunView

#: The most read of progress.jsonl, from its end: about 40 minutes of samples (100 KB an hour,
#: trainbox.rundir.progress), far more than :data:`PACE_WINDOW_S` needs.
PROGRESS_BYTES = 64 << 10
#: The pace is measured over this much of the latest samples: a minute holds about twelve samples
#: (one every 5 s, trainbox.rundir.progress.SAMPLE_S), enough to smooth one slow batch, short enough to
#: show a slowdown within a scrape or two.
PACE_WINDOW_S = 60.0
#: Label values are cut to this length: a cause, a profile or a phase is a word; the rest is garbage.
LABEL_CHARS = 128
#: Distinct stall causes shown at most; any beyond (only a hostile events.jsonl has them) count as "other".
MAX_CAUSES = 32
#: Where ``--serve PORT`` listens without an address: this machine only (a run's metrics are nobody else's
#: business unless the person says so); ``:PORT`` is every interface, as in node_exporter's ``--web.listen-address``.
LOCALHOST = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"
MAX_PORT = 65535
#: The state shown when state.json is missing or says nothing readable.
UNKNOWN = "unknown"

#: One sample: its labels (besides ``run``) and its value.
Sample = Tuple[Dict[str, str], float]


@dataclass(frozen=True)
class Family:
    """One metric as the exposition format writes it: ``# HELP``, ``# TYPE`` and its samples."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: Tuple[Sample, ...]


@dataclass(frozen=True)
class _Run:
    """What the metrics are read from: the run's view, its recent progress samples, a deadline if given."""

    view: RunView
    samples: List[Dict[str, Any]]
    deadline_ts: Optional[float]


@dataclass(frozen=True)
class Metric:
    """A metric's name, type and help, and how to read its samples from a run (None or []: unknown)."""

    name: str
    kind: str
    help: str
    read: Callable[[_Run], Optional[Sequence[Sample]]]


# -- reading the run directory: never raises ------------------------------------------------------------
def read_run(run_dir: Path, now: float, deadline_ts: Optional[float] = None) -> _Run:
    """The run directory as the metrics read it: what ``status`` reads (:func:`trainbox.view.status.snapshot`,
    typed, through :mod:`trainbox.rundir.safe`) and the newest :data:`PROGRESS_BYTES` of its progress samples."""
    run = RunDir(Path(run_dir))
    got = run.files.read_objects(run.progress, SAMPLE_LINE_BYTES, PROGRESS_BYTES, MAX_SAMPLES)
    return _Run(RunView(run=run, snapshot=status.snapshot(run), now=now), parse_records(got, SAMPLE).records, deadline_ts)


# -- what each metric says -----------------------------------------------------------------------------------
def _number(value: Any) -> Optional[float]:
    """A finite number, else None (a bool, a string, NaN or infinity from a hostile file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _one(value: Any) -> List[Sample]:
    number = _number(value)
    return [] if number is None else [({}, number)]


def _label(value: Any) -> str:
    """A label value: one line of text that UTF-8 can hold (a run directory's name may hold any bytes: those that are
    not UTF-8 read as ``?``, as :func:`trainbox.rundir.records.text` has it)."""
    return "" if value is None else records.text(" ".join(str(value).split())[:LABEL_CHARS])


def _state(run: _Run) -> List[Sample]:
    current = _label(run.view.state.get("state")) or UNKNOWN
    names = [state.value for state in State] + [UNKNOWN]
    if current not in names:  # a newer supervisor's state: shown too
        names.append(current)
    return [({"state": name}, 1.0 if name == current else 0.0) for name in names]


def _info(run: _Run) -> List[Sample]:
    starts = run.view.of("start")
    last = starts[-1] if starts else {}
    budget = run.view.state.get("budget")
    return [
        (
            {
                "profile": _label(last.get("profile")),
                "rung": _label(last.get("rung")),
                "phase": _label(run.view.beat.get("phase")),
                "budget": _label(budget.get("name") if isinstance(budget, dict) else None),
            },
            1.0,
        )
    ]


def _last_progress(run: _Run) -> List[Sample]:
    published = _number(run.view.state.get("last_progress_ts"))
    if published is not None:
        return [({}, published)]
    times = [ts for ts in (_number(s.get("ts")) for s in run.samples) if ts is not None]
    return _one(max(times)) if times else []


def _rank_beats(run: _Run) -> List[Sample]:
    """Each rank's last beat (unix time), labelled ``rank``: under torchrun, one series per rank of this node."""
    found = []
    for rank in rank_files(run.view.run):
        ts = _number(read_beat(run.view.run.files, run.view.run.rank_heartbeat(rank)).get("ts"))
        if ts is not None:
            found.append(({"rank": str(rank)}, ts))
    return found


def _pace(run: _Run) -> List[Sample]:
    """Steps per second over the last :data:`PACE_WINDOW_S` of the latest attempt's samples; 0 when silent that long."""
    if run.view.finished or not run.samples:
        return []
    attempt = run.samples[-1].get("attempt")
    points = [
        (ts, step)
        for ts, step in ((_number(s.get("ts")), _number(s.get("step"))) for s in run.samples if s.get("attempt") == attempt)
        if ts is not None and step is not None
    ]
    if not points:
        return []
    newest_ts, newest_step = points[-1]
    if run.view.now - newest_ts > PACE_WINDOW_S:
        return [({}, 0.0)]
    first_ts, first_step = next(point for point in points if point[0] >= newest_ts - PACE_WINDOW_S)
    if newest_ts <= first_ts:
        return []
    return [({}, max(0.0, (newest_step - first_step) / (newest_ts - first_ts)))]


def _counter(kind: str) -> Callable[[_Run], List[Sample]]:
    return lambda run: [({}, float(run.view.count(kind)))]


def _stalls(run: _Run) -> List[Sample]:
    counts: Dict[str, float] = collections.OrderedDict((cause.value, 0.0) for cause in Cause)
    for stall in run.view.of("stall"):
        cause = _label(stall.get("cause")) or Cause.UNKNOWN.value
        if cause not in counts and len(counts) >= MAX_CAUSES:
            cause = "other"
        counts[cause] = counts.get(cause, 0.0) + 1
    return [({"cause": cause}, count) for cause, count in counts.items()]


def _silence(key: str) -> Callable[[_Run], List[Sample]]:
    def read(run: _Run) -> List[Sample]:
        silence = run.view.silence()
        return _one(silence[key]) if silence else []

    return read


def _slow_ratio(run: _Run) -> List[Sample]:
    ratio = 1.0
    for event in run.view.events:
        slow = _number(event.get("ratio")) if event.get("event") == "slow" else None
        if slow is not None:
            ratio = slow
        elif event.get("event") in ("recovered", "start", "exit"):
            ratio = 1.0
    return [({}, ratio)]


METRICS: Tuple[Metric, ...] = (
    Metric("trainbox_state", "gauge", "The supervisor's state (state.json): 1 for the current one, 0 for the others.", _state),
    Metric(
        "trainbox_run_info",
        "gauge",
        "Always 1: the profile or ladder rung of the latest attempt, the child's phase and the silence budget in force.",
        _info,
    ),
    Metric("trainbox_epoch", "gauge", "The epoch of the child's last beat.", lambda run: _one(run.view.beat.get("epoch"))),
    Metric(
        "trainbox_step",
        "gauge",
        "The step (batches since the start) of the child's last beat.",
        lambda run: _one(run.view.beat.get("step")),
    ),
    Metric("trainbox_last_progress_timestamp_seconds", "gauge", "When the child last made progress (unix time).", _last_progress),
    Metric(
        "trainbox_rank_last_beat_timestamp_seconds", "gauge", "Under torchrun: when each rank last beat (unix time).", _rank_beats
    ),
    Metric("trainbox_steps_per_second", "gauge", "Steps per second over the last minute of progress samples.", _pace),
    Metric("trainbox_restarts_total", "counter", "Restarts of the child in this run directory.", _counter("restart")),
    Metric("trainbox_crashes_total", "counter", "Attempts that exited non-zero in this run directory.", _counter("crash")),
    Metric(
        "trainbox_stalls_total", "counter", "Stalls found in this run directory, by the cause they were judged to have.", _stalls
    ),
    Metric("trainbox_silence_seconds", "gauge", "How long the child has been silent in its current phase.", _silence("s")),
    Metric(
        "trainbox_budget_seconds", "gauge", "The silence budget of the current phase: past it, a stall.", _silence("budget_s")
    ),
    Metric("trainbox_slow_ratio", "gauge", "The pace against this run's own baseline while it is slow; 1 at pace.", _slow_ratio),
    Metric(
        "trainbox_eta_seconds", "gauge", "Seconds of training left at the current throughput.", lambda run: _one(run.view.eta_s())
    ),
    Metric(
        "trainbox_deadline_timestamp_seconds",
        "gauge",
        "The deadline the run should finish by (unix time), where one is set.",
        lambda run: _one(run.deadline_ts),
    ),
    Metric(
        "trainbox_checkpoint_timestamp_seconds",
        "gauge",
        "When the last epoch-end checkpoint (last.pt) was written (unix time).",
        lambda run: _one(run.view.snapshot.checkpoint_mtime),
    ),
    Metric(
        "trainbox_supervisor_updated_timestamp_seconds",
        "gauge",
        "When the supervisor last wrote state.json (unix time): about every second while it runs.",
        lambda run: _one(run.view.state.get("updated_ts")),
    ),
)


def _known(metric: Metric, run: _Run) -> Sequence[Sample]:
    """The metric's samples; none when the run directory holds something it cannot use (an odd type)."""
    try:
        return metric.read(run) or []
    except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, RecursionError, OSError):
        return []


def run_name(run_dir: Path) -> str:
    """The ``run`` label: the run directory's name (``runs/exp1`` -> ``exp1``)."""
    return _label(Path(os.path.abspath(run_dir)).name) or "/"


def job_labels(run_dir: Path) -> Dict[str, str]:
    """``job`` and ``node`` of a node's run directory in a job's (``<job>/node-<n>/`` beside ``job.json``), else none."""
    where = Path(os.path.abspath(run_dir))
    job = JobDir(where.parent)
    node = job.node.number_of(where.name)
    if node is None or job.files.stat(job.job).value is None:
        return {}
    return {"job": _label(where.parent.name), "node": str(node)}


def collect(
    run_dir: Path, now: Optional[float] = None, deadline_ts: Optional[float] = None, run: Optional[str] = None
) -> List[Family]:
    """The run's metrics now, each sample labelled ``run`` (default :func:`run_name`), and ``job`` and ``node`` for a
    node of a job; a job's directory gives every node's; never raises on its files."""
    job = JobDir(Path(run_dir))
    if job.files.stat(job.job).value is not None:
        return _merged([collect(job.node(node), now, deadline_ts, run) for node in job.nodes()])
    read = read_run(Path(run_dir), time.time() if now is None else now, deadline_ts)
    name = _label(run) if run else run_name(Path(run_dir))
    extra = job_labels(Path(run_dir))
    families = []
    for metric in METRICS:
        samples = tuple(({"run": name, **extra, **labels}, value) for labels, value in _known(metric, read))
        if samples:
            families.append(Family(metric.name, metric.kind, metric.help, samples))
    return families


def _merged(per_node: Sequence[List[Family]]) -> List[Family]:
    """Every node's families as one list: a metric's samples from all nodes together, in the metrics' order."""
    by_name: Dict[str, Family] = {}
    for families in per_node:
        for family in families:
            known = by_name.get(family.name)
            by_name[family.name] = (
                family if known is None else Family(known.name, known.kind, known.help, known.samples + family.samples)
            )
    order = [metric.name for metric in METRICS]
    return sorted(by_name.values(), key=lambda family: order.index(family.name))


# -- the text exposition format 0.0.4 -------------------------------------------------------------------------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(number: float) -> str:
    return str(int(number)) if number.is_integer() and abs(number) < 1e15 else repr(number)


def render(families: Sequence[Family]) -> str:
    """The families in the text exposition format (no timestamps: node_exporter's textfile collector refuses them)."""
    lines: List[str] = []
    for family in families:
        lines += [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
        for labels, number in family.samples:
            pairs = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
            lines.append(f"{family.name}{{{pairs}}} {_value(number)}")
    return "\n".join(lines) + "\n"


def write_textfile(
    run_dir: Path, path: Path, now: Optional[float] = None, deadline_ts: Optional[float] = None, run: Optional[str] = None
) -> None:
    """Write the run's metrics to ``path`` for node_exporter (name it ``*.prom``), atomically; OSError if it cannot."""
    # not the run directory: the textfile is where the person said (--textfile, --metrics-textfile); what a writer
    # killed mid-write left is removed first (never read: not *.prom)
    remove_stale_temps(path)  # not the run directory: see above
    write_text_atomic(path, render(collect(run_dir, now, deadline_ts, run)), fsync=False)  # not the run directory: see above


class Keeper:
    """``--metrics-textfile PATH``: the supervisor's ``on_publish``, rewriting the textfile from the run directory.

    Best-effort by design, as the HTML report: metrics must never change how a run goes, so a failure (the
    folder gone, a full disk) is one line, said once, and the run goes on; the next rewrite tries again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._said = False

    def __call__(self, run: RunDir) -> None:
        try:
            write_textfile(run.root, self.path)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            if not self._said:
                self._said = True
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
                say(f"metrics: cannot write {self.path}: {why} (said once; the run goes on)")


# -- /metrics over HTTP (prometheus_client: the host extra) ---------------------------------------------------------
class _Collector:
    """prometheus_client's custom collector: reads the run directory again at every scrape."""

    def __init__(self, run_dir: Path, deadline_ts: Optional[float], run: Optional[str]) -> None:
        self.run_dir, self.deadline_ts, self.run = run_dir, deadline_ts, run

    def describe(self) -> List[Any]:
        return []  # nothing is read when the collector is registered, only when scraped

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family in collect(self.run_dir, deadline_ts=self.deadline_ts, run=self.run):
            keys = list(family.samples[0][0])
            made = (CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily)(family.name, family.help, labels=keys)
            for labels, number in family.samples:
                made.add_metric([labels[key] for key in keys], number)
            yield made


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape every 15 s is not news


class _Server(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True  # a slow scraper never holds up the end


class MetricsServer:
    """``/metrics`` for one run directory on ``host``:``port`` (0: any free port); OSError if it cannot listen."""

    def __init__(self, run_dir: Path, host: str, port: int, deadline_ts: Optional[float] = None, run: Optional[str] = None):
        from prometheus_client import CollectorRegistry, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)  # this run's metrics only, not the process's own
        registry.register(_Collector(Path(run_dir), deadline_ts, run))
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("_Bound", (_Server,), {"address_family": family})
        self._server: simple_server.WSGIServer = simple_server.make_server(
            host, port, make_wsgi_app(registry), server_class, _QuietHandler
        )
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host, port = str(self._server.server_address[0]), int(self._server.server_address[1])
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> MetricsServer:
        """Serve from a background thread (the supervisor's, or a test's)."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="trainbox-metrics", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def serve(run_dir: Path, host: str, port: int, deadline_ts: Optional[float] = None, run: Optional[str] = None) -> int:
    """Serve the run's ``/metrics`` until a stop signal (Ctrl-C, SIGTERM: exit 0); a UserError if it cannot listen."""
    try:
        server = MetricsServer(run_dir, host, port, deadline_ts, run)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    except ModuleNotFoundError as missing:
        if missing.name != "prometheus_client":
            raise
        raise UserError("--serve needs prometheus_client: pip install prometheus_client (trainbox[host] has it)") from None
    try:
        print(f"serving the metrics of {run_dir} on {server.url}", flush=True)
        with interrupt.stop_requests():
            server.serve_forever()
    except interrupt.StopRequested:
        return 0
    finally:
        server.close()
    return 0


# -- `trainbox metrics RUN_DIR --textfile PATH | --serve [ADDR:]PORT` ---------------------------------------------------
def parse_address(text: str) -> Tuple[str, int]:
    """``9101`` (127.0.0.1), ``127.0.0.1:9101``, ``[::1]:9101`` or ``:9101`` (every interface, as node_exporter's)."""
    host, colon, port = text.rpartition(":")
    if not port.isdigit() or int(port) > MAX_PORT:
        raise UserError(f"--serve {text!r}: give [ADDR:]PORT, e.g. 127.0.0.1:9101 (PORT alone listens on 127.0.0.1)")
    if not colon:
        return LOCALHOST, int(port)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or ANY_ADDRESS, int(port)


def _textfile(text: str) -> Path:
    return Path(str(METRICS_TEXTFILE.from_text(text)))  # the supervisor's --metrics-textfile rule: *.prom


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--textfile", type=_textfile, metavar="PATH", help="write node_exporter's textfile (*.prom), then exit")
    where.add_argument(
        "--serve", metavar="[ADDR:]PORT", help="serve /metrics over HTTP until Ctrl-C (PORT alone: on 127.0.0.1 only)"
    )
    parser.add_argument("--deadline", help=f"{status.DEADLINE_FORMATS}: also export it, to alert on an ETA past it")
    parser.add_argument("--run-name", help="the run label (default: RUN_DIR's name)")


def main(args: argparse.Namespace) -> int:
    """``trainbox metrics``: one textfile written, or /metrics served until Ctrl-C."""
    deadline = status.parse_deadline(args.deadline, datetime.datetime.now()) if args.deadline else None
    deadline_ts = deadline.timestamp() if deadline else None
    if args.serve is not None:
        return serve(args.run_dir, *parse_address(args.serve), deadline_ts=deadline_ts, run=args.run_name)
    try:
        write_textfile(args.run_dir, args.textfile, deadline_ts=deadline_ts, run=args.run_name)
    except OSError as exc:
        raise UserError(f"cannot write {args.textfile}: {exc.strerror or exc}") from None
    return 0
