"""Is a rank waiting for its peers, or is it the one they wait for?

In a data-parallel job one hung rank silences all of them within a step: every other rank reaches the next
gradient all-reduce and waits there for it. Their silences start within a second of each other and their last
steps are the same, so neither the clock nor the counter tells the hung rank apart (Holmes and Mycroft localise it
from communication traces). The stacks do: a rank that waits for a peer sits in the collective machinery, and the
hung one sits anywhere else.

What waiting for a peer looks like in a Python stack (main thread, innermost frames first):

* **in backward** (``torch/autograd/graph.py:_engine_run_backward``, ``torch/autograd/__init__.py:backward``):
  DistributedDataParallel's reducer launches its bucket all-reduces from autograd hooks and waits for them in C++
  before backward returns, so a DDP rank blocked on a peer shows nothing below backward (seen here: gloo, two CPU
  ranks, one hung by ``trainbox.faults``; ``tests/fixtures/job/``);
* **in a collective call** of ``torch.distributed`` (``all_reduce``, ``barrier``, ``broadcast``, ``all_gather``,
  ``reduce_scatter``, a work's ``wait``, DDP's forward-time buffer sync, FSDP's unshard);
* **in the rendezvous** (``torch/distributed/elastic/rendezvous``, ``torch/distributed/rendezvous.py``): a rank
  restarted alone waits there for the others.

:func:`waiting_for_peers` says which, from one process's dump; :func:`where` names the frame that decided it.
Pure functions of the dump text, tested in milliseconds (``tests/diagnose/test_collective.py``).
"""

from __future__ import annotations

import re
from typing import Optional

from trainbox.diagnose.causes import Frame, ThreadStack, main_thread, parse_stacks

#: A frame where a rank waits for its peers (the module docstring says why each).
PEER_WAIT = re.compile(
    r"torch/autograd/(graph|__init__)\.py:(_engine_run_backward|backward)$"
    r"|torch/distributed/distributed_c10d\.py:"
    r"(all_reduce\w*|barrier|monitored_barrier|broadcast\w*|all_gather\w*|reduce_scatter\w*|all_to_all\w*|reduce|"
    r"gather|scatter|send|recv|wait\w*)$"
    r"|torch/distributed/(elastic/rendezvous/|rendezvous\.py)"
    r"|torch/nn/parallel/distributed\.py:\S*(_sync_buffers|_sync_module_buffers|_sync_params\w*|_pre_forward)$"
    r"|torch/distributed/fsdp/"
)


def _main(text: str, pid: int) -> Optional[ThreadStack]:
    threads = parse_stacks(text)
    return main_thread(threads, pid) or (threads[0] if threads else None)


#: Frames of torch itself and of the standard library's waiting: looked through, innermost first, for a peer wait.
#: The first frame outside them (the program's own code) ends the look: a rank hung in its own code inside an
#: FSDP- or DDP-wrapped forward has those wrappers further out, and is not waiting for a peer.
LIBRARY = re.compile(r"^(torch/|threading\.py|selectors\.py|socket\.py|multiprocessing/|<frozen)")


def where(text: str, pid: int) -> Optional[Frame]:
    """The frame of ``pid``'s main thread that waits for a peer (innermost first, through torch and the standard
    library's waiting only), or None when it waits for none."""
    thread = _main(text, pid)
    if thread is None:
        return None
    for frame in thread.frames:
        if PEER_WAIT.search(frame.where):
            return frame
        if not LIBRARY.search(frame.where):
            return None
    return None


def waiting_for_peers(text: str, pid: int) -> Optional[bool]:
    """Whether ``pid``'s main thread (in a py-spy or faulthandler dump) waits for the other ranks; None when the dump
    shows no frame of it (py-spy, sampling a thread between two frames of a busy wait, can list it with none)."""
    thread = _main(text, pid)
    if thread is None or not thread.frames:
        return None
    return where(text, pid) is not None


def doing(text: str, pid: int) -> Optional[str]:
    """What ``pid``'s main thread was doing: its innermost frame (``file:function``), None without a stack."""
    thread = _main(text, pid)
    return thread.top.where if thread is not None and thread.top is not None else None
