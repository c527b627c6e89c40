"""Whether this machine shows a GPU that a training program would use when it is not told a device.

Ultralytics (like most programs) trains on the first CUDA or HIP device when torch finds one, else on the CPU. The
supervisor must know which without importing torch (seconds, and a GPU runtime in the supervisor): the NVIDIA
driver lists its GPUs in ``/proc/driver/nvidia/gpus``, AMD's kernel driver its nodes in the KFD topology
(:func:`trainbox.system.kfd.gpu_nodes`), and ``CUDA_VISIBLE_DEVICES`` (or ``HIP_VISIBLE_DEVICES``) set to nothing or
``-1`` hides them from the program.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from trainbox.system import kfd

#: Where the NVIDIA driver lists one folder per GPU.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
#: What hides every GPU from a program: an empty list or an index no device has.
HIDDEN = ("", "-1")


def visible(environ: Optional[Mapping[str, str]] = None, root: Path = Path("/")) -> bool:
    """Whether a program started with ``environ`` (ours by default) would find a GPU on this machine."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name, "x").strip() in HIDDEN for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")):
        return False
    nvidia = root / NVIDIA_GPUS.relative_to("/")
    try:
        if nvidia.is_dir() and any(nvidia.iterdir()):
            return True
    except OSError:
        pass
    return bool(kfd.gpu_nodes(root))
