"""How fast the output reader lays out what a child prints: MB/s of CPU for a bar's bytes and for hostile streams.

    python bench/terminal.py [--repeats 5]

Each stream (256 KiB, or a recorded program's bytes) is fed to ``TerminalLines`` in the reader's 64 KiB chunks and
every display state to ``OutputProgress``, as the supervisor's reader thread does; the figure is bytes over the
process CPU time it took, median [min–max] of the repeats. The module promises about 10 MB/s for a tqdm bar's bytes
and at least 0.3 MB/s for a stream made of control characters (``trainbox.supervise.output.terminal``).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Dict

from common import REPO, machine, span, summary, write_results

from tests.reading import read_stream
from trainbox.supervise.output.terminal import MAX_LINE_CHARS

#: The size of each synthetic stream.
SIZE = 256 << 10
LONG = b"x" * MAX_LINE_CHARS


def streams() -> Dict[str, bytes]:
    bar = (REPO / "tests" / "fixtures" / "output" / "tqdm_loop.raw").read_bytes()
    return {
        "a tqdm bar (recorded, repeated)": bar * (SIZE // len(bar) + 1),
        "cursor-up after a 4 KiB line": LONG + b"\x1b[A" * (SIZE // 3),
        "cursor-up and newline under 30 long lines": (LONG + b"\n") * 30 + b"\x1b[A\n" * (SIZE // 4),
        "erase to the start of a 4 KiB line": LONG + b"\x1b[1K" * (SIZE // 4),
        "carriage returns over a 4 KiB line": LONG + b"\rX" * (SIZE // 2),
        "backspaces over a 4 KiB line": LONG + b"\bX" * (SIZE // 2),
        "empty lines": b"\n" * SIZE,
    }


def rate(data: bytes) -> float:
    """MB/s of CPU time to read ``data`` as the reader does."""
    return len(data) / max(read_stream(data, time.process_time), 1e-9) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    figures = {name: summary([rate(data) for _ in range(args.repeats)]) for name, data in streams().items()}
    rows = "\n".join(f"| {name} | {span(stat)} |" for name, stat in figures.items())
    host = machine()
    load = os.getloadavg()[0]
    markdown = (
        "# Reading a child's output: MB/s of CPU\n\n"
        f"`python bench/terminal.py --repeats {args.repeats}`: each stream fed in 64 KiB chunks to TerminalLines, every "
        "state to OutputProgress; median [min–max] of the repeats. "
        f"{host['cpu']}, {host['cores']} cores, load average {load:.0f}, {host['date']}.\n\n"
        "| stream | MB/s |\n|---|---|\n" + rows + "\n"
    )
    print(markdown)
    write_results("terminal", {"repeats": args.repeats, "mb_per_s": figures}, markdown)


if __name__ == "__main__":
    main()
