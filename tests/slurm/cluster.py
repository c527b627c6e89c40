"""A real Slurm cluster on this one machine: munged, slurmctld and two slurmd nodes, ``n1`` and ``n2``.

Debian builds Slurm with ``--enable-multiple-slurmd``, so ``slurmd -N n1`` and ``slurmd -N n2`` are two nodes of one
host, each on a port of its own. Everything lives in one temporary folder: the configuration, munge's key and socket,
the controller's state, each node's spool and every log, so the cluster touches nothing of the machine's own set-up
(``/etc/slurm``, ``/etc/munge`` and the system's munged are left alone). Processes are tracked by ``linuxproc`` and
no task plugin binds them (no cgroups here); each node has one CPU, so one task a node. ``JobRequeue=1`` makes a
batch job requeueable by default, ``SlurmdTimeout`` is short so that a killed ``slurmd`` (a lost node) is
noticed in seconds, not minutes, and a requeued job starts again after about 10 s instead of 2 minutes
(``cred_expire``, and the scheduler's pass every 2 s instead of every 60).

Job ids start at a random number: a job's rendezvous port derives from its id (:mod:`trainbox.slurm.env`), and two
clusters on one machine (two test sessions) must not hand out the same ids.

The client commands (``sbatch``, ``scontrol``, ``squeue``, ``srun`` inside a job) find this cluster through
``SLURM_CONF``, which :attr:`Cluster.env` carries; a batch job inherits it (``sbatch`` exports the environment).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

#: The daemons and clients the cluster needs (Debian 12: slurmctld, slurmd, slurm-client, munge).
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "srun")
NODES = ("n1", "n2")
#: A node that stops answering is DOWN after this many seconds (Slurm's minimum sensible value is a few seconds; the
#: controller pings every SlurmdTimeout/3).
SLURMD_TIMEOUT_S = 10
#: A requeued job waits this long before it starts again (Slurm's job credential lifetime, 120 s by default).
CRED_EXPIRE_S = 10
#: How long the daemons get to come up, on a machine whose two cores are shared with other tests.
START_S = 60.0

CONF = """\
ClusterName=trainbox
FirstJobId={first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire={cred_expire}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MpiDefault=none
JobRequeue=1
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
SlurmctldTimeout=10
MessageTimeout=5
KillWait=30
InactiveLimit=0
MinJobAge=600
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""
NODE = "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=1000 State=UNKNOWN"


def missing() -> List[str]:
    """The programs this machine lacks (``.ci/slurm-setup.sh`` installs them)."""
    return [name for name in PROGRAMS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Cluster:
    """A cluster under ``root``: :meth:`start` it, submit with :meth:`sbatch`, :meth:`stop` it."""

    root: Path
    processes: Dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> Dict[str, str]:
        """The environment of a client command (and so of every job submitted with it)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write(self) -> None:
        for folder in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld, slurmd, *node_ports = _free_ports(2 + len(NODES))
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(NODE.format(name=n, host=host, port=p) for n, p in zip(NODES, node_ports))
        self.conf.write_text(
            CONF.format(
                host=host,
                ctld_port=ctld,
                slurmd_port=slurmd,
                user=_user(),
                root=self.root,
                slurmd_timeout=SLURMD_TIMEOUT_S,
                cred_expire=CRED_EXPIRE_S,
                first_job_id=random.randrange(1000, 1_000_000),
                nodes=nodes,
                node_names=",".join(NODES),
            )
        )

    def _spawn(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115  (the daemon's own stdout, kept for a failure)
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()

    def start(self) -> None:
        """Write the configuration and start munged, slurmctld and every slurmd (foreground, so they are our children)."""
        self.write()
        munge = self.root / "munge"
        self._spawn(
            "munged",
            [_program("munged"), "--foreground", "--force", f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
             f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"],
        )  # fmt: skip
        _wait(lambda: (munge / "munge.socket").exists(), "munged's socket")
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        _wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld to answer")
        for node in NODES:
            self.start_node(node)
        _wait(lambda: self.idle() == set(NODES), "both nodes idle")

    def start_node(self, node: str) -> None:
        self._spawn(f"slurmd-{node}", [_program("slurmd"), "-D", "-N", node, "-f", str(self.conf)])

    def kill_node(self, node: str) -> None:
        """SIGKILL the node's slurmd: a lost node (its job's processes go on until the controller gives up on it)."""
        process = self.processes.pop(f"slurmd-{node}")
        process.kill()
        process.wait()

    def lose_node(self, node: str) -> int:
        """A lost machine: SIGKILL the node's slurmd and every process of its job steps, the slurmstepd that runs each
        task and the tasks' own trees (all of them carry the node's name, ``SLURMD_NODENAME``); how many processes."""
        self.kill_node(node)
        tasks = [
            pid
            for pid, environ in _processes()
            if environ.get("SLURM_CONF") == str(self.conf) and environ.get("SLURMD_NODENAME") == node
        ]
        steps = {parent for parent in map(_parent, tasks) if parent is not None and _name(parent) == "slurmstepd"}
        for pid in (*steps, *tasks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(steps) + len(tasks)

    def scontrol(self, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *words], env=self.env, capture_output=True, text=True, timeout=30)

    def scancel(self, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scancel", *words], env=self.env, capture_output=True, text=True, timeout=30)

    def states(self) -> Dict[str, str]:
        """Each node's state, as ``sinfo -N`` prints it (``idle``, ``alloc``, ``down*``...)."""
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True, timeout=30
        ).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def idle(self) -> set:
        return {node for node, state in self.states().items() if state == "idle"}

    def sbatch(self, script: Path, *options: str, cwd: Optional[Path] = None) -> str:
        """Submit ``script``; the job's id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)], env=self.env, capture_output=True, text=True, timeout=30,
            cwd=cwd,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Dict[str, str]:
        """The job's fields as ``scontrol show job`` gives them (``JobState``, ``ExitCode``, ``Restarts``...)."""
        out = self.scontrol("show", "job", "-o", job_id).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float) -> Dict[str, str]:
        """Wait until the job is in one of ``states``; its fields then (the last seen, on timeout: the caller asserts)."""
        deadline = time.monotonic() + timeout
        fields = self.job(job_id)
        while fields.get("JobState") not in states and time.monotonic() < deadline:
            time.sleep(0.5)
            fields = self.job(job_id)
        return fields

    def stop(self) -> None:
        """End every daemon and every job process left behind (their sessions), newest first."""
        for name in reversed(list(self.processes)):
            process = self.processes.pop(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        _kill_leftovers(self.root)

    def logs(self) -> str:
        """Every daemon's log, for a failure's message."""
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in sorted((self.root / "log").glob("*")))


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _wait(ready, what: str, timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Slurm cluster did not come up: no {what} within {timeout:.0f} s")
        time.sleep(0.2)


def _processes() -> Iterator[Tuple[int, Dict[str, str]]]:
    """(pid, environment) of every process this user can read."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                words = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            yield int(proc.name), dict(word.split("=", 1) for word in words if "=" in word)


def _parent(pid: int) -> Optional[int]:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _name(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _kill_leftovers(root: Path) -> None:
    """SIGKILL any process whose command line names this cluster's folder (a slurmstepd, a job's children that left
    their session): nothing of the cluster outlives it."""
    mine = str(root)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if mine in cmdline or f"SLURM_CONF={mine}/slurm.conf" in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


@contextlib.contextmanager
def running(root: Path) -> Iterator[Cluster]:
    """A cluster started under ``root`` for the ``with`` block, stopped after it; one that does not start is a
    RuntimeError with its daemons' logs, and nothing of it is left running."""
    cluster = Cluster(root)
    try:
        cluster.start()
    except BaseException:
        logs = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"the Slurm cluster did not start:\n{logs}") from None
    try:
        yield cluster
    finally:
        cluster.stop()
