"""DataLoader workers that start in a fraction of a second from a clean process: a preloaded forkserver.

Spawn-started workers are safe (nothing of the training process's threads, locks or GPU runtime is copied into
them), but each one imports torch and Ultralytics again before it can unpickle the dataset, and PyTorch starts them
one after another: the parent writes each worker's pickled dataset into a pipe that holds 64 KiB, so it waits for
that worker's imports before it starts the next (pytorch #131931). That is 1 to 3 s a worker, 8 workers 10 to 25 s
before the first batch, and the same again for validation's workers.

The ``forkserver`` start method keeps what makes spawn safe: the server is a new program (fork and exec from the
training process), and every worker is forked from that server, never from the training process. The server
imports the modules a worker needs (:data:`PRELOAD`) once, so a worker is a fork of a process that has them
already and starts in tens of milliseconds.

:func:`start` is called by the runner as soon as the profile is known, before this process imports Ultralytics,
so the server's imports run alongside the training process's own and the rest of its set-up (the trainer calls it
again, for a DDP rank that Ultralytics started; a second call does nothing). The server imports modules only:
torch initialises CUDA or HIP at the first device call, never at import, so no GPU runtime runs in it. It sets
``OMP_NUM_THREADS=1`` where it is unset, as Ultralytics' import does a moment later anyway
(``ultralytics/__init__.py``), before the server starts: numpy's BLAS then starts no thread pool in the server,
and the server forks from a single thread. A module that fails to import there is skipped by Python's forkserver;
the worker then imports it itself, as a spawn-started one would.

The server is started by the training process's main thread (the thread whose end kills it: the runner, or the
trainer in a DDP rank), and it and its workers die with that process however it dies
(:mod:`trainbox.yolo.forkserver_tie`); under ``supervise``, everything in the attempt's session also ends with the
supervisor (:mod:`trainbox.system.guard`).
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
from typing import Sequence

#: What a training or validation worker unpickles and runs: torch, Ultralytics' datasets and augmentations,
#: trainbox's loader pieces (worker init, per-sample seeds, heartbeats for the stack-dump handler); first, the module
#: that ties the server to the training process and each worker to the server (they end when it dies, by any signal).
PRELOAD = (
    "trainbox.yolo.forkserver_tie",
    "torch",
    "ultralytics.data.dataset",
    "ultralytics.data.augment",
    "trainbox.yolo.loader",
    "trainbox.yolo.position",
)


def start(preload: Sequence[str] = PRELOAD) -> None:
    """Start this process's forkserver (once; later calls do nothing) with ``preload`` imported in it."""
    if not os.environ.get("OMP_NUM_THREADS"):
        os.environ["OMP_NUM_THREADS"] = "1"  # Ultralytics' own default, set at its import
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    forkserver.ensure_running()
