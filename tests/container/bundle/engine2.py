"""A second Docker Engine on this machine, playing the second machine of a bundle/restore.

Its own data root, exec root (with its own managed containerd), pid file,
unix socket and an empty daemon.json, so it shares no state with the
machine's engine; no bridge and no iptables rules, like .ci/docker-setup.sh.
Needs root and the ``dockerd`` binary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import docker
from docker.errors import DockerException

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0


class SecondEngine:
    """Start with :meth:`start`, always :meth:`stop` (which also removes its data)."""

    def __init__(self, base: Optional[Path] = None) -> None:
        # Short paths: unix socket paths are limited to 108 bytes.
        self.base = Path(base or tempfile.mkdtemp(prefix="tb-e2-", dir="/tmp"))
        self.data_root = self.base / "data"
        self.exec_root = self.base / "exec"
        self.pidfile = self.base / "dockerd.pid"
        self.socket = self.base / "docker.sock"
        self.config = self.base / "daemon.json"
        self.log = self.base / "dockerd.log"
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def command(self, dockerd: str) -> List[str]:
        return [
            dockerd,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.url,
            "--config-file",
            str(self.config),
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
        ]

    def client(self) -> docker.APIClient:
        return docker.APIClient(base_url=self.url, version="auto", timeout=600)

    def start(self) -> docker.APIClient:
        """Start dockerd and wait until it answers; on failure, stop it and raise with its last log lines."""
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise RuntimeError("dockerd not found: run .ci/docker-setup.sh")
        if os.geteuid() != 0:
            raise RuntimeError("a second Docker Engine needs root")
        self.config.write_text("{}\n")
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command(dockerd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                client = self.client()
                client.ping()
                return client
            except DockerException:
                time.sleep(0.5)
        tail = self.log.read_text(errors="replace").splitlines()[-15:]
        self.stop()
        raise RuntimeError("second dockerd did not start:\n" + "\n".join(tail))

    def stop(self) -> None:
        """SIGTERM dockerd (it stops its containers and containerd), wait, then remove its directories."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.unmount_left_behind()
        shutil.rmtree(self.base)

    def unmount_left_behind(self) -> None:
        """Unmount what dockerd left mounted under its directories: a build with the host network binds the host's
        network namespace at exec/netns/default and a stopped dockerd leaves it there (rmtree: 'Device or resource
        busy'). Deepest first."""
        prefix = str(self.base) + "/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", mount], check=False)
