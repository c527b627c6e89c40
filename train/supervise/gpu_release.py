"""Before a ``gpu_wait`` stall's retry: wait until the killed tree's GPU memory is released.

A process killed while it waited on the GPU can hold its device memory after it
is gone: the driver frees it when the context is torn down, and a wedged kernel
delays that. An attempt started meanwhile finds the memory taken and fails with
out-of-memory, or hangs on the same queue. So the retry waits, polling
``nvidia-smi``/``rocm-smi`` for the killed pids, until they hold nothing, for at
most ``RELEASE_WAIT_S``; the ``restart`` event records how it went. Host-side,
no torch.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Optional

from trainbox.diagnose import evidence

#: The longest wait: a driver that has not freed a dead context's memory in two minutes will not soon, and
#: the retry (then FP32/native convolutions) is the better bet than waiting on.
RELEASE_WAIT_S = 120.0
#: Between two looks: each one runs an SMI tool (tens of milliseconds).
POLL_S = 2.0


def held_mib(pids: Iterable[int]) -> Optional[int]:
    """MiB of GPU memory ``pids`` hold, or None when no GPU tool answers (nothing to wait for then)."""
    memory = evidence.gpu_memory_by_pid()
    if memory is None:
        return None
    wanted = set(pids)
    return sum(mib for pid, mib in memory.items() if pid in wanted)


def wait(pids: Iterable[int], sleep: Callable[[float], bool], limit_s: float = RELEASE_WAIT_S) -> Dict[str, Any]:
    """Wait until ``pids`` hold no GPU memory, at most ``limit_s``; the ``restart`` event's fields.

    ``sleep(seconds)`` returns True when a stop signal came (the wait ends there).
    """
    pids = list(pids)
    started = time.monotonic()
    while True:
        held = held_mib(pids)
        waited = round(time.monotonic() - started, 3)
        if held is None:
            return {"gpu_release": "no GPU tool answered: nothing to wait for", "gpu_release_s": waited}
        if held == 0:
            return {"gpu_release": "released", "gpu_release_s": waited}
        if waited >= limit_s:
            return {"gpu_release": f"{held} MiB still held after {limit_s:g} s", "gpu_release_s": waited}
        if sleep(min(POLL_S, limit_s - waited)):
            return {"gpu_release": f"stopped while {held} MiB were held", "gpu_release_s": waited}
