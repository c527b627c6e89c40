"""Facts about this machine and its processes, read from /proc, /sys and the GPU tools.

A process tree and how to end it (:mod:`.proctree`), the GPU's state as its tools and the kernel report it
(:mod:`.gpu_state`), an AMD card's architecture and kernel database (:mod:`.kfd`), and where the kernel
compilers keep their caches (:mod:`.caches`). Nothing here decides anything: :mod:`trainbox.diagnose` and
:mod:`trainbox.supervise` do, from what these modules read.
"""
