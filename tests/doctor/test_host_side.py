"""Host-side modules import neither torch nor ultralytics."""

from __future__ import annotations

import subprocess
import sys

from tests.supervised import REPO

HOST_MODULES = (
    "trainbox.doctor.cli",
    "trainbox.doctor.checkup",
    "trainbox.doctor.inside",
    "trainbox.system.gpu_state",
    "trainbox.yolo.warmup",
)


def test_host_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in HOST_MODULES)
        + "from trainbox.yolo import warmup\n"
        + "warmup.kernel_cache_state(warmup.run_key({}))\n"
        + "heavy = sorted(m for m in ('torch', 'ultralytics') if m in sys.modules)\n"
        + "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
