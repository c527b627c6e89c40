"""Which rank waits for its peers and which one they wait for, from real and written dumps, in milliseconds."""

from __future__ import annotations

from tests.paths import REPO
from trainbox.diagnose import collective

JOB = REPO / "tests" / "fixtures" / "job"


def test_a_ddp_rank_waiting_for_a_hung_peer_waits_in_backward_and_the_hung_one_does_not() -> None:
    """Recorded with py-spy from two gloo ranks of examples/plain_pytorch.py under torchrun, rank 1 hung by the fault
    injector at its third step: rank 0 sits in autograd's backward (DDP's reducer waits for the all-reduce there)."""
    waiting = (JOB / "rank0-waiting-in-backward.txt").read_text()
    hung = (JOB / "rank1-hung.txt").read_text()
    assert collective.waiting_for_peers(waiting, 14876)
    assert collective.where(waiting, 14876).function == "_engine_run_backward"  # type: ignore[union-attr]
    assert collective.waiting_for_peers(hung, 14877) is False
    assert collective.doing(hung, 14877) == "train/faults.py:hang_sleep"


def dump(*frames: str) -> str:
    """A py-spy text dump of one main thread, innermost frame first (``function (file:line)``)."""
    return 'Process 7: python t.py\n\nThread 7 (idle): "MainThread"\n' + "".join(f"    {f}\n" for f in frames)


def test_explicit_collectives_and_the_rendezvous_are_waits_for_peers() -> None:
    for frames in (
        (
            "all_reduce (torch/distributed/distributed_c10d.py:2801)",
            "wrapper (torch/distributed/c10d_logger.py:81)",
            "step (t.py:9)",
        ),
        ("barrier (torch/distributed/distributed_c10d.py:4100)", "main (t.py:3)"),
        (
            "_delay (torch/distributed/elastic/rendezvous/utils.py:240)",
            "next_rendezvous (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1100)",
        ),
        (
            "wait (threading.py:320)",
            "DistributedDataParallel._sync_buffers (torch/nn/parallel/distributed.py:1800)",
            "fwd (t.py:4)",
        ),
    ):
        assert collective.waiting_for_peers(dump(*frames), 7), frames


def test_a_rank_hung_in_its_own_code_inside_a_wrapped_forward_is_not_waiting() -> None:
    """The first frame of the program's own ends the look: FSDP or DDP further out does not make it a wait."""
    frames = (
        "sleep (time.py:1)",
        "Block.forward (model.py:40)",
        "FullyShardedDataParallel.forward (torch/distributed/fsdp/fully_sharded_data_parallel.py:850)",
        "train (t.py:12)",
    )
    assert not collective.waiting_for_peers(dump(*frames), 7)
    assert collective.doing(dump(*frames), 7) == "time.py:sleep"


def test_a_faulthandler_dump_is_read_too_and_no_stack_is_no_wait() -> None:
    faulthandler = (
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/v/lib/python3.11/site-packages/torch/autograd/graph.py", line 1113 in _engine_run_backward\n'
        '  File "/v/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward\n'
        '  File "/w/train.py", line 20 in train\n'
    )
    assert collective.waiting_for_peers(faulthandler, 7)
    assert collective.waiting_for_peers("no stack: py-spy failed\n", 7) is None
    assert collective.doing("", 7) is None


def test_a_main_thread_dumped_without_a_frame_is_unknown_not_a_suspect() -> None:
    """Seen here under load: py-spy listed a DDP rank waiting for its peer as ``active+gil`` with no frame at all."""
    frameless = 'Process 7: threads from py-spy dump --json\nThread 7 (active+gil): "MainThread"\n'
    assert collective.waiting_for_peers(frameless, 7) is None
