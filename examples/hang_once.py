"""A training loop that knows nothing of trainbox and hangs once: the supervisor, tried in seconds.

It counts ``--steps`` steps of 0.1 s, printing ``step N/TOTAL``, the counter the supervisor reads as progress, and
saves the step it reached after each one (temporary file, then rename), so that a restart resumes there. In its
first attempt (``TRAIN_ATTEMPT`` is 0, or unset when it runs alone) it stops at step ``--hang-at`` and sleeps, as a
deadlocked loop would: no output, no CPU. Supervised with a short budget, the hang is found, the process ended
and restarted, and the second attempt finishes from the saved step::

    python -m trainbox supervise --run-dir runs/try --stall-timeout 5 -- python examples/hang_once.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

#: Seconds a step "works": short, so that the whole example takes seconds.
STEP_S = 0.1
#: How long the hang lasts: far longer than any budget it is tried with.
HANG_S = 3600


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A loop that prints step counters and hangs once, in its first attempt.")
    parser.add_argument("--steps", type=int, default=40, help="steps in all (default 40)")
    parser.add_argument("--hang-at", type=int, default=20, help="the step the first attempt hangs at (-1: never)")
    parser.add_argument("--checkpoint", type=Path, help="the saved step (default: hang_once.step in $TRAIN_RUN_DIR or here)")
    return parser.parse_args()


def save(checkpoint: Path, step: int) -> None:
    """Write the step reached so that a crash never leaves half a file."""
    partial = checkpoint.with_name(checkpoint.name + ".tmp")
    partial.write_text(str(step))
    os.replace(partial, checkpoint)


def main() -> None:
    args = arguments()
    checkpoint = args.checkpoint or Path(os.environ.get("TRAIN_RUN_DIR", ".")) / "hang_once.step"
    first = int(checkpoint.read_text()) if checkpoint.exists() else 0
    first_attempt = os.environ.get("TRAIN_ATTEMPT", "0") == "0"
    print(f"starting at step {first}", flush=True)
    for step in range(first, args.steps):
        if first_attempt and step == args.hang_at:
            time.sleep(HANG_S)
        time.sleep(STEP_S)
        print(f"step {step + 1}/{args.steps}", flush=True)
        save(checkpoint, step + 1)
    print("done", flush=True)


if __name__ == "__main__":
    main()
