"""Before a ``gpu_wait`` stall's retry: wait until the killed tree's GPU memory is released.

A process killed while it waited on the GPU can hold its device memory after it
is gone: the driver frees it when the context is torn down, and a wedged kernel
delays that. An attempt started meanwhile finds the memory taken and fails with
out-of-memory, or hangs on the same queue. So the retry waits, polling
``nvidia-smi``/``rocm-smi`` (:mod:`trainbox.system.gpu_memory`) for the killed
pids, until they hold nothing, for at most ``RELEASE_WAIT_S``; the ``restart``
event records how it went.

Inside a container the tools name processes by their pids on the host, so what
the killed pids hold is unknown (not 0: issue 33 item 11, where the wait said
"released" at once while 10 GiB were held). Then the devices' used memory
stands in: the wait ends when it is back at what it was before the attempt
started (:func:`baseline`, taken as the attempt starts) or under
:data:`RELEASED_UNDER_MIB`, as NVIDIA's nvidia-resiliency-ext judges a GPU free.
Host-side, no torch.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from trainbox.system import gpu_memory

#: The longest wait: a driver that has not freed a dead context's memory in two minutes will not soon, and
#: the retry (then FP32/native convolutions) is the better bet than waiting on.
RELEASE_WAIT_S = 120.0
#: Between two looks: each one runs an SMI tool (tens of milliseconds).
POLL_S = 2.0
#: How long one look may take (a hung driver does not answer).
QUERY_TIMEOUT_S = 3.0
#: Device memory below this counts as released when the pids are unknown (a CUDA context alone is ~500 MiB; NVRx's
#: ``gpu_health_check`` uses the same bound).
RELEASED_UNDER_MIB = 512


def baseline() -> Optional[int]:
    """The devices' used memory now (before an attempt starts); None without a GPU tool that answers."""
    return gpu_memory.device_used_mib(QUERY_TIMEOUT_S)


def held(pids: Iterable[int], before_mib: Optional[int]) -> Optional[Tuple[bool, str]]:
    """(released, what is held, in words); None when no GPU tool answers (nothing to wait for then)."""
    memory = gpu_memory.read(QUERY_TIMEOUT_S)
    if memory is None:
        return None
    if memory.by_pid is not None:
        wanted = set(pids)
        mib = sum(mib for pid, mib in memory.by_pid.items() if pid in wanted)
        return mib == 0, f"{mib} MiB"
    used = memory.used_mib
    if used is None:
        return None
    floor = max(before_mib or 0, RELEASED_UNDER_MIB - 1)
    return used <= floor, f"{used} MiB on the GPU (per-process memory unknown: the tool's pids are the host's)"


def wait(
    pids: Iterable[int], sleep: Callable[[float], bool], limit_s: float = RELEASE_WAIT_S, before_mib: Optional[int] = None
) -> Dict[str, Any]:
    """Wait until ``pids`` hold no GPU memory (see the module's docstring), at most ``limit_s``; the ``restart``
    event's fields. ``before_mib``: the devices' use before the attempt (:func:`baseline`).

    ``sleep(seconds)`` returns True when a stop signal came (the wait ends there).
    """
    pids = list(pids)
    started = time.monotonic()
    while True:
        look = held(pids, before_mib)
        waited = round(time.monotonic() - started, 3)
        if look is None:
            return {"gpu_release": "no GPU tool answered: nothing to wait for", "gpu_release_s": waited}
        released, what = look
        if released:
            return {"gpu_release": "released" + ("" if what == "0 MiB" else f" ({what})"), "gpu_release_s": waited}
        if waited >= limit_s:
            return {"gpu_release": f"{what} still held after {limit_s:g} s", "gpu_release_s": waited}
        if sleep(min(POLL_S, limit_s - waited)):
            return {"gpu_release": f"stopped while {what} were held", "gpu_release_s": waited}
