"""CPU image figures: cold build, code-only rebuild, size, and ``invoke train`` to the first batch.

    python bench/images.py

Works in a fresh clone of this checkout (so the rebuild after a code change
does not touch the working tree), with the same environment the container
tests use: the locally bootstrapped base image (``trainbox-base:bullseye``,
from ``.ci/docker-setup.sh``) and this machine's extra CA certificates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

from common import REPO, events, write_results

LOCAL_BASE = "trainbox-base:bullseye"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


def build_env() -> Dict[str, str]:
    env = dict(os.environ)
    images = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
    if LOCAL_BASE in images.stdout.split():
        env.setdefault("TRAINBOX_CPU_BASE_IMAGE", LOCAL_BASE)
    if any(LOCAL_CAS.glob("*.crt")):
        env.setdefault("TRAINBOX_CA_CERTS", str(LOCAL_CAS))
    return env


def invoke(source: Path, args: list, env: Dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "invoke", *args], cwd=source, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> int:
    env = build_env()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src"
        subprocess.run(["git", "clone", "-q", str(REPO), str(source)], check=True)
        cold = invoke(source, ["build", "--flavor", "cpu", "--no-cache"], env)
        with (source / "train" / "__init__.py").open("a") as handle:
            handle.write("# code-only change for bench/images.py\n")
        rebuild = invoke(source, ["build", "--flavor", "cpu"], env)
        inspected = json.loads(subprocess.run(["docker", "image", "inspect", "trainbox:cpu"], capture_output=True,
                                              text=True, check=True).stdout)[0]  # fmt: skip
        runs = Path(tmp) / "runs"
        runs.mkdir()
        env_run = dict(env, TRAINBOX_RUNS_HOST=str(runs))
        started = time.time()
        invoke(source, ["train", "--profile", "safe", "--flavor", "cpu", "--name", "bench-first-batch", "--no-build"], env_run)
        exit_event = next(e for e in events(runs / "bench-first-batch") if e["event"] == "exit")
        first_batch = exit_event["first_step_ts"] - started
    result = {"cold_build_s": round(cold, 1), "code_rebuild_s": round(rebuild, 1), "size_bytes": inspected["Size"],
              "invoke_train_to_first_batch_s": round(first_batch, 1)}  # fmt: skip
    md = (
        "# CPU image (Dockerfile.cpu)\n\nCommand: `python bench/images.py`\n\n"
        "| cold build (no cache) s | code-only rebuild s | size GB | `invoke train` → first batch s |\n"
        "| --- | --- | --- | --- |\n"
        f"| {cold:.0f} | {rebuild:.1f} | {inspected['Size'] / 1e9:.2f} | {first_batch:.1f} |\n"
    )
    print(md)
    print(write_results("images", result, md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
