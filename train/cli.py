"""``python -m trainbox``: supervised training, demo data, health, doctor and MIOpen warm-up.

Host-side module: never imports torch or ultralytics. User mistakes end with
one line on stderr and exit status 2, never a traceback (:mod:`trainbox.errors`).

The profile and ladder models (pydantic, about a third of this module's import time) are imported by the commands
that read them (``run``, ``demo``, ``supervise --ladder``): ``supervise``, ``health`` and ``status`` start without
them, and a supervisor, its health checks and the test suite start this module many times.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Callable, List, NoReturn, Optional, Sequence, Tuple

from trainbox import errors
from trainbox.doctor import cli as doctor_cli
from trainbox.errors import ExitCode, UserError
from trainbox.job import incident as job_incident
from trainbox.rundir import exit_record, layout, owner
from trainbox.rundir.layout import RunDir
from trainbox.slurm import env as slurm_env
from trainbox.slurm import step as slurm_step
from trainbox.supervise.planner import Launch, Planner
from trainbox.supervise.resume.resumer import Resumer
from trainbox.supervise.settings import LAUNCH_SETTINGS, NOTIFY, NOTIFY_ON, STALL_TIMEOUT, SupervisorSettings
from trainbox.supervise.settings import add_arguments as add_supervisor_arguments
from trainbox.supervise.settings import given as given_options
from trainbox.supervise.supervisor import Supervisor, SupervisorSpec
from trainbox.view import job as job_view
from trainbox.view import metrics as run_metrics
from trainbox.view import status as run_status
from trainbox.yolo import kernels, offline
from trainbox.yolo.demo_data import DEMO_IMAGES, DEMO_TRAIN_ARGS

#: Where every route keeps its runs: runs/<command>-<time> (supervise, run, demo), runs/<profile>-<time> (invoke train),
#: runs/demo (compose); see trainbox.rundir.layout.
RUNS_DIR = str(layout.RUNS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see '{self.prog} --help')")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_supervisor_options(parser: argparse.ArgumentParser, budgets_from_profile: bool) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--run-dir",
        type=Path,
        default=Path(os.environ["TRAIN_RUN_DIR"]) if os.environ.get("TRAIN_RUN_DIR") else None,
        help="events, heartbeat, incidents and checkpoints go here; the same directory again resumes its run "
        f"(default: $TRAIN_RUN_DIR, else a new {RUNS_DIR}/<command>-<YYYYmmdd-HHMMSS>)",
    )
    where.add_argument("--name", help=f"the run's name: its directory is {RUNS_DIR}/NAME (the same name again resumes it)")
    where.add_argument("--resume", action="store_true", help=f"go on with the newest run of the same command under {RUNS_DIR}/")
    add_supervisor_arguments(parser, profile_defaults=budgets_from_profile)
    parser.add_argument("--quiet", action="store_true", help="do not echo the child's output (it is still logged)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainbox", description="Supervised, self-healing training (trainbox).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    supervise = sub.add_parser("supervise", help="supervise any command: python -m trainbox supervise [options] -- CMD ...")
    _add_supervisor_options(supervise, budgets_from_profile=False)
    supervise.add_argument(
        "--slurm",
        action="store_true",
        help="run as this node's supervisor of a Slurm job (automatic under srun): the job's run directory is "
        f"{RUNS_DIR}/<command>-<jobid>/ (or --run-dir), with a folder per node; torchrun's rendezvous is the job's "
        "(docs/slurm.md)",
    )
    supervise.add_argument(
        "--ladder",
        type=Path,
        metavar="FILE",
        help="YAML rungs from fast to careful ({name, args, env}): each attempt appends its rung's args to CMD and "
        "adds its env; a stall steps down by its cause (docs/your-own-script.md: 'A ladder for any command')",
    )

    run = sub.add_parser("run", help="supervised Ultralytics training with a profile")
    run.add_argument("--profile", required=True, help="profile name from env/profiles (safe, balanced, fast, ...)")
    run.add_argument("--profiles-dir", type=Path, default=None, help="where profiles live (default: env/profiles)")
    _add_supervisor_options(run, budgets_from_profile=True)
    run.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="Ultralytics train arguments (data=, epochs=, imgsz=, ...)"
    )

    demo = sub.add_parser("demo", help="train the demo: a synthetic dataset in RUN_DIR/demo-data, nothing downloaded")
    demo.add_argument("--profile", default="safe", help="profile name from env/profiles (default: safe)")
    demo.add_argument("--profiles-dir", type=Path, default=None, help="where profiles live (default: env/profiles)")
    _add_supervisor_options(demo, budgets_from_profile=True)
    over = f"Ultralytics train arguments over the demo's {' '.join(DEMO_TRAIN_ARGS)}"
    demo.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=over)

    data = sub.add_parser("demo-data", help="write a small synthetic detection dataset (DIR/data.yaml)")
    data.add_argument("directory", type=Path)
    for flag, what in (("--train", "training images"), ("--val", "validation images"), ("--imgsz", "image side in pixels")):
        default = getattr(DEMO_IMAGES, flag[2:])
        data.add_argument(flag, type=_count, default=default, help=f"{what} (default: {default})")

    doctor = sub.add_parser("doctor", help="check this host (--inside: the image) and say how to fix each failure")
    doctor_cli.add_arguments(doctor)
    warm = sub.add_parser("warmup", help="compile and cache MIOpen kernels at a run's shapes before training")
    kernels.add_arguments(warm)
    _add_run_readers(sub)
    return parser


def _add_run_readers(sub: argparse._SubParsersAction[_Parser]) -> None:
    """The commands that read a run directory: health, status, report, metrics."""
    health = sub.add_parser("health", help="exit 0 while the supervised run makes progress within budget")
    health.add_argument(
        "--run-dir",
        type=Path,
        default=os.environ.get("TRAIN_RUN_DIR"),
        help=f"the run (default: $TRAIN_RUN_DIR, else the newest run under {RUNS_DIR}/)",
    )
    health.add_argument(
        "--act", action="store_true", help="end a hung supervisor: stack dump, supervisor_hung event, SIGKILL (HEALTHCHECK)"
    )
    for setting in (NOTIFY, NOTIFY_ON):  # --act tells of the hang itself: the hung supervisor cannot
        setting.add_to(health)

    status = sub.add_parser("status", help="where a run stands; --watch: a live view until Ctrl-C")
    status.add_argument(
        "--run-dir",
        type=Path,
        default=os.environ.get("TRAIN_RUN_DIR"),
        help=f"the run (default: $TRAIN_RUN_DIR, else the newest run under {RUNS_DIR}/: the latest last event)",
    )
    status.add_argument("--watch", action="store_true", help="refresh every second until Ctrl-C (plain lines without a terminal)")
    status.add_argument("--deadline", help=f"{run_status.DEADLINE_FORMATS}: does the run finish in time?")
    report = sub.add_parser("report", help="write the run's report: one self-contained HTML file with charts")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    report.add_argument("--out", type=Path, default=None, help="the HTML file to write (default: RUN_DIR/report.html)")
    report.add_argument("--deadline", help=f"{run_status.DEADLINE_FORMATS}, for the summary's verdict")
    metrics = sub.add_parser("metrics", help="the run's Prometheus metrics: a node_exporter textfile, or /metrics over HTTP")
    run_metrics.add_arguments(metrics)


def _settings(args: argparse.Namespace) -> SupervisorSettings:
    try:
        return SupervisorSettings.from_arguments(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _spec(args: argparse.Namespace, planner: Planner, settings: SupervisorSettings) -> SupervisorSpec:
    textfile = run_metrics.Keeper(Path(settings.metrics_textfile)) if settings.metrics_textfile else None
    return SupervisorSpec(
        run_dir=args.run_dir,
        planner=planner,
        settings=settings,
        echo=not args.quiet,
        on_end=lambda run: _refresh_report(run, shlex.join([*_head(), "report", str(run.root)])),
        on_publish=_Announce(textfile),
        command=args.command_name,
        resume=_resume_line(args.own, args.run_dir, args.child),
        listeners=job_incident.listeners(Path(args.run_dir)),
    )


def _place(args: argparse.Namespace, command: str) -> None:
    """The run directory of a supervising command (``args.run_dir``): the one named, or one chosen
    (:func:`trainbox.rundir.owner.choose`), refused when it holds another command's run; nothing is written."""
    if args.run_dir is None:
        args.run_dir = owner.choose(command, args.name, args.resume)
    owner.check(args.run_dir, command)
    args.command_name = command


#: The options that say where a run is: the resume line names the directory instead.
_WHERE_OPTIONS = ("--run-dir", "--name")


def _says_where(word: str) -> bool:
    """Whether ``word`` is one of :data:`_WHERE_OPTIONS` as argparse took it: whole, or cut short (``--na``: argparse
    takes a prefix of one option only, so a prefix of ``--name`` it accepted is ``--name``), with ``=VALUE`` or not."""
    name = word.split("=", 1)[0]
    return len(name) > 2 and name.startswith("--") and any(option.startswith(name) for option in _WHERE_OPTIONS)


def _resume_line(own: Sequence[str], run_dir: Path, command: Sequence[str]) -> str:
    """The command line that goes on with this run: the one given, with its directory named (Ctrl-C says it)."""
    words: List[str] = []
    skip = False
    for word in own:
        if skip or word == "--resume" or _says_where(word):
            skip = not skip and _says_where(word) and "=" not in word  # the option's value is the next word
            continue
        words.append(word)
    tail = ["--", *command] if command else []
    return shlex.join([*_head(), *words[:1], "--run-dir", str(run_dir), *words[1:], *tail])


def _head() -> List[str]:
    """How this command was called: ``trainbox``, or ``python -m trainbox``."""
    return ["trainbox"] if Path(sys.argv[0]).name == "trainbox" else ["python", "-m", "trainbox"]


class _Announce:
    """The run's first line, said at its first ``state.json`` (the run directory is locked, and can be watched):
    where the run is and the command that watches it. Then the metrics textfile's refresh, when there is one."""

    def __init__(self, then: Optional[Callable[[RunDir], None]]) -> None:
        self.then = then
        self.said = False

    def __call__(self, run: RunDir) -> None:
        if not self.said:
            self.said = True
            watch = shlex.join([*_head(), "status", "--run-dir", str(run.root), "--watch"])
            errors.say(f"the run is in {run.root}; to watch it: {watch}")
        if self.then is not None:
            self.then(run)


def _refresh_report(run: RunDir, rewrite: str) -> None:
    """The HTML report, rewritten as the run ends (presentation: imported only here, when needed)."""
    from trainbox.view import html_report

    html_report.refresh(run, rewrite)


def _split_command(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def _supervise(args: argparse.Namespace, command: List[str]) -> int:
    if not command:
        raise UserError("no command to supervise: python -m trainbox supervise [options] -- CMD [ARGS...]")
    launch = Launch(
        argv=command,
        **{s.field: getattr(args, s.dest) for s in LAUNCH_SETTINGS},
        stall_given=STALL_TIMEOUT.dest in given_options(args),
    )
    settings = _settings(args)
    step = None
    if args.slurm or slurm_env.in_job_step(os.environ):
        launch, step = _slurm_step(args, launch)
    _place(args, layout.command_name(command))
    planner = _command_planner(args, launch, settings)
    resumer = Resumer(settings, args.run_dir, 0.0)
    for problem in filter(None, map(resumer.problem, planner.launches())):
        raise UserError(problem)
    offline_advice = offline.advice(command, os.environ)
    if offline_advice is not None:
        errors.say(offline_advice)
    supervisor = Supervisor(_spec(args, planner, settings))
    return supervisor.run() if step is None else step.supervise(supervisor.run)


def _slurm_step(args: argparse.Namespace, launch: Launch) -> Tuple[Launch, slurm_step.Step]:
    """Place this node's run in the Slurm job's directory (``args.run_dir``); the launch with the job's rendezvous."""
    if args.resume:
        raise UserError("--resume is for runs on one machine: a Slurm job goes on with its own run when it is requeued")
    given = args.run_dir if args.run_dir is not None else (Path(RUNS_DIR) / args.name if args.name else None)
    step = slurm_step.prepare(launch.argv, layout.command_name(launch.argv), given, Path(RUNS_DIR), os.environ)
    args.run_dir = step.run_dir
    return dataclasses.replace(launch, env={**launch.env, **step.child_env}), step


def _command_planner(args: argparse.Namespace, launch: Launch, settings: SupervisorSettings) -> Planner:
    """``--ladder FILE``'s rungs, else the built-in rungs of a program trainbox knows, else the same command."""
    from trainbox.supervise.ladder import defaults

    rungs = [] if args.ladder else defaults.rungs_for(launch.argv)
    if not args.ladder and not rungs:
        return Planner(launch)
    from trainbox.supervise.ladder import command as command_ladder  # pydantic: imported only where used (module doc)

    if args.ladder:
        return command_ladder.CommandLadder(launch, command_ladder.load(args.ladder), settings)
    errors.say(f"built-in rungs for {Path(launch.argv[0]).name}: {', '.join(r.name for r in rungs)} ({defaults.WHEN})")
    return command_ladder.CommandLadder(launch, rungs, settings, causes=defaults.CAUSES, unapplied=defaults.unapplied)


def _run(args: argparse.Namespace) -> int:
    _place(args, "run")
    return _train(args)


def _train(args: argparse.Namespace) -> int:
    """``run`` in its run directory (placed already)."""
    from trainbox.yolo import profiles
    from trainbox.yolo.args import validate_overrides
    from trainbox.yolo.ladder import ProfileLadder

    directory = args.profiles_dir or profiles.default_profiles_dir()
    profile = profiles.load(args.profile, directory)
    chain = profiles.fallback_chain(profile, directory)
    validate_overrides(args.overrides)
    settings = _settings(args)
    launch = {s.field: getattr(args, s.dest) for s in LAUNCH_SETTINGS}
    ladder = ProfileLadder(chain, args.overrides, directory, launch, settings)
    return Supervisor(_spec(args, ladder, settings)).run()


def _write_demo_data(directory: Path, train: int, val: int, imgsz: int) -> Path:
    from trainbox.yolo.demo_data import write_demo_dataset

    try:
        return write_demo_dataset(directory, train=train, val=val, imgsz=imgsz)
    except OSError as exc:
        raise UserError(f"cannot write the demo dataset to {directory}: {exc.strerror or exc}") from None


def _demo_data(args: argparse.Namespace) -> int:
    print(_write_demo_data(args.directory, args.train, args.val, args.imgsz))
    return 0


def _demo(args: argparse.Namespace) -> int:
    """``run`` on the demo dataset, written into the run directory, with the demo's arguments under the user's."""
    from trainbox.yolo import profiles
    from trainbox.yolo.args import check_pairs

    given = check_pairs(args.overrides)  # bad input is refused before the dataset is written, as by `run`
    if "data" in given:
        raise UserError("demo trains its own dataset: for yours, `python -m trainbox run --profile NAME data=PATH`")
    profiles.load(args.profile, args.profiles_dir or profiles.default_profiles_dir())
    _place(args, "demo")
    data_yaml = _write_demo_data(RunDir(args.run_dir).demo_data, DEMO_IMAGES.train, DEMO_IMAGES.val, DEMO_IMAGES.imgsz)
    defaults = [pair for pair in DEMO_TRAIN_ARGS if pair.partition("=")[0] not in given]
    args.overrides = [*defaults, *args.overrides, f"data={data_yaml}"]
    return _train(args)


def _health(args: argparse.Namespace) -> int:
    from trainbox.supervise.health import Notify, check
    from trainbox.supervise.notify.events import parse_command, parse_events

    tell = Notify(parse_command(args.notify) if args.notify else (), parse_events(args.notify_on))
    healthy, why = check(Path(args.run_dir) if args.run_dir else run_status.newest_run(Path(RUNS_DIR)), act=args.act, tell=tell)
    print(("healthy: " if healthy else "unhealthy: ") + why)
    return 0 if healthy else 1


def _deadline(text: Optional[str]) -> Optional[datetime.datetime]:
    return run_status.parse_deadline(text, datetime.datetime.now()) if text else None


def _status(args: argparse.Namespace) -> int:
    deadline = _deadline(args.deadline)
    run_dir = Path(args.run_dir) if args.run_dir else run_status.newest_run(Path(RUNS_DIR))
    which = "" if args.run_dir else f" (the newest run under {RUNS_DIR}/; --run-dir for another)"
    if job_view.is_job(run_dir):
        if args.watch:
            raise UserError(f"{run_dir} is a job of several nodes: status --watch follows one, --run-dir {run_dir}/node-0")
        print("\n".join(job_view.render(run_dir)))
        return 0
    if args.watch:
        from trainbox.view import live as watch

        if which:
            errors.say(f"watching {run_dir}{which}")
        return watch.main(run_dir, deadline)
    lines = run_status.render(run_dir, run_status.read(run_dir), deadline=deadline)
    print("\n".join([lines[0] + which, *lines[1:]]))
    return 0


def _report(args: argparse.Namespace) -> int:
    from trainbox.view import html_report

    deadline = _deadline(args.deadline)
    if not args.run_dir.is_dir():  # not the run directory: its root, the user's own path
        raise UserError(f"RUN_DIR {args.run_dir} is not a directory: give the folder a run wrote (`run --run-dir`)")
    if job_view.is_job(args.run_dir):  # a job of several nodes: its table, linking to each node's own report
        print(job_view.write(args.run_dir, args.out))
        return 0
    try:
        print(html_report.write(args.run_dir, args.out, deadline))
    except ModuleNotFoundError as missing:
        if missing.name != "matplotlib":
            raise
        raise UserError("trainbox report needs matplotlib: pip install matplotlib (the host and yolo extras have it)") from None
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, command = _split_command(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(own, command)
        sys.stdout.flush()  # here, not at exit: a reader gone (`status | head -3`) is seen while it can be handled
    except BrokenPipeError:
        return _reader_gone()
    # In a container whose engine restarts on failure, a final outcome is reported as 0 (trainbox.rundir.exit_record);
    # a container names its run directory in $TRAIN_RUN_DIR.
    run_dir = os.environ.get("TRAIN_RUN_DIR")
    return exit_record.for_engine(own[0] if own else None, code, Path(run_dir)) if run_dir else code


def _reader_gone() -> int:
    """Whoever read stdout has gone (``| head -3``): end quietly, as a shell's own commands do, with SIGPIPE's status."""
    devnull = os.open(os.devnull, os.O_WRONLY)  # not the run directory: /dev/null
    os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere, and the exit's flush cannot fail
    os.close(devnull)
    return ExitCode.for_signal(signal.SIGPIPE)


def _parse(own: List[str], command: List[str]) -> argparse.Namespace:
    """The options, with the command after ``--``; a forgotten ``--`` is said (its words read as options)."""
    try:
        args = build_parser().parse_args(own)
    except UserError as exc:
        if own[:1] == ["supervise"] and not command and "unrecognized arguments" in str(exc):
            raise UserError(f"{exc}; put `--` before the command: python -m trainbox supervise [options] -- CMD ...") from None
        raise
    args.own, args.child = own, command
    return args


def _main(own: List[str], command: List[str]) -> int:
    try:
        args = _parse(own, command)
        if args.command == "supervise":
            return _supervise(args, command)
        if command:
            raise UserError(f"'--' is only for 'supervise'; {args.command} takes no command")
        handlers = {
            "run": _run,
            "demo": _demo,
            "demo-data": _demo_data,
            "health": _health,
            "doctor": doctor_cli.main,
            "warmup": kernels.main,
            "status": _status,
            "report": _report,
            "metrics": run_metrics.main,
        }
        return handlers[args.command](args)
    except UserError as exc:
        return errors.report(exc)
