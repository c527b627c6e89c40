"""GPU state for incident reports: SMI output and recent kernel messages about the GPU.

Host-side (no torch). The one reader of the kernel log (dmesg, else journalctl).
Every source that cannot be read says so in one line, so an incident's
``gpu.txt`` and ``kernel.txt`` always explain their own gaps.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Set, Tuple

#: Kernel messages worth keeping: the AMD driver and its compute interface, DRM, GPU resets and ring
#: timeouts, hung tasks (a process stuck in the driver), NVIDIA's NVRM/Xid reports.
KERNEL_PATTERN = re.compile(
    r"amdgpu|\bkfd\b|\[drm|gpu (reset|hang|fault)|ring \S+ timeout|hung_task|blocked for more than|nvrm|\bxid\b",
    re.IGNORECASE,
)
SMI_COMMANDS: Tuple[Tuple[str, ...], ...] = (("rocm-smi",), ("rocm-smi", "--showpids"), ("nvidia-smi",))
KERNEL_COMMANDS: Tuple[Tuple[str, ...], ...] = (
    ("dmesg", "--time-format", "iso"),
    ("journalctl", "-k", "-b", "--no-pager", "-n", "5000"),
)
KERNEL_LINES = 100

#: Tools given up on after a timeout and not waited for (see :func:`abandoned`).
_abandoned: Set[int] = set()


def _run(argv: Sequence[str], timeout: float) -> Tuple[bool, str]:
    """(True, stdout) or (False, one line saying why there is no output).

    On timeout the command's process group is killed and not waited for: a tool
    stuck in the driver (uninterruptible sleep) cannot be reaped and must not
    hold up the report. Its pid is remembered (:func:`abandoned`).
    """
    shown = " ".join(argv)
    if timeout <= 0:
        return False, f"{shown}: skipped, the time budget is spent"
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]}: not installed"
    try:
        process = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True
        )
    except OSError as exc:
        return False, f"{shown}: cannot run ({exc.strerror})"
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        _abandoned.add(process.pid)
        return False, f"{shown}: no answer within {timeout:.1f} s (the driver may be hung)"
    if process.returncode != 0:
        reason = (stderr.strip() or stdout.strip() or f"exit status {process.returncode}").splitlines()[-1]
        return False, f"{shown}: failed: {reason}"
    return True, stdout


def abandoned() -> Set[int]:
    """The tools this process gave up on that are not reaped yet (reaping those that have ended now).

    A supervisor is a child subreaper and counts its other children as part of
    the training tree (:mod:`trainbox.system.proctree`); a ``rocm-smi`` stuck in a hung
    driver is its own diagnostic tool, not the next attempt's process.
    """
    for pid in list(_abandoned):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid  # reaped already (by subprocess's own clean-up of forgotten Popens)
        if done == pid:
            _abandoned.discard(pid)
    return set(_abandoned)


def gpu_kernel_lines(text: str, limit: int = KERNEL_LINES) -> List[str]:
    """The last ``limit`` lines of a kernel log that mention the GPU driver, its resets or hangs."""
    return [line for line in text.splitlines() if KERNEL_PATTERN.search(line)][-limit:]


@dataclass(frozen=True)
class GpuState:
    """What an incident records about the GPU: ``gpu.txt`` and ``kernel.txt``."""

    smi: str
    kernel: str


def _kernel_messages(deadline: float) -> str:
    reasons = []
    for argv in KERNEL_COMMANDS:
        done, text = _run(argv, deadline - time.monotonic())
        if done:
            lines = gpu_kernel_lines(text)
            body = "\n".join(lines) if lines else "no messages about the GPU"
            return f"from `{' '.join(argv)}`:\n{body}\n"
        reasons.append(text)
    return "not available: " + "; ".join(reasons) + "\n"


def _smi_output(deadline: float) -> str:
    sections = []
    for argv in SMI_COMMANDS:
        if len(argv) > 1 and shutil.which(argv[0]) is None:
            continue
        _, text = _run(argv, deadline - time.monotonic())
        sections.append(f"== {' '.join(argv)}\n{text.rstrip()}\n")
    return "\n".join(sections)


#: The longest :func:`read` takes (a hung ``rocm-smi`` is given up on then).
READ_TIMEOUT_S = 10.0


def read(timeout: float = READ_TIMEOUT_S) -> GpuState:
    """rocm-smi / nvidia-smi output when installed, and recent GPU kernel messages; never raises.

    ``timeout`` bounds the whole call: each command gets what is left of it, so a
    hung driver (rocm-smi blocks on a wedged GPU) cannot stall an incident report.
    """
    deadline = time.monotonic() + timeout
    smi = _smi_output(deadline)
    kernel = "== kernel messages (amdgpu, kfd, DRM, resets, hangs)\n" + _kernel_messages(deadline)
    return GpuState(smi=smi, kernel=kernel)


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    text: str  # stdout when ok, else one line saying why there is none
    hung: bool  # it did not answer within its time (the driver may be hung)


def query(argv: Sequence[str], timeout: float) -> Optional[ToolResult]:
    """Run one GPU tool with :func:`_run`'s timeout and clean-up; None when it is not installed."""
    if shutil.which(argv[0]) is None:
        return None
    given_up_before = set(_abandoned)
    ok, text = _run(argv, timeout)
    return ToolResult(ok, text, hung=bool(_abandoned - given_up_before))
