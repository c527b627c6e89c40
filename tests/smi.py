"""Real ``nvidia-smi`` recordings replayed by a stand-in tool on PATH (no GPU here).

``tests/fixtures/smi/h100/*.txt`` were recorded on an H100 while ``bench/gpu.py`` trained (issue 33 item 11): each
``### busy N`` block is one moment, its query line (utilisation, memory used) and the compute processes
(``pid, MiB``), and the plain ``nvidia-smi`` table at the end names the process of each pid. Pid 4230 is the
training process as the driver saw it: a pid of the host, not of any namespace the tests run in.

:func:`recorded` reads the moments; :func:`install` puts an ``nvidia-smi`` on PATH that answers the three queries
trainbox asks (``--query-compute-apps=...``, ``--query-gpu=memory.used``, ``--query-gpu=utilization.gpu``) from one
moment after another: each process query moves on to the next moment (the other queries answer from the moment of
the last process query), and the last moment stays.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

from tests.paths import FIXTURES

H100 = FIXTURES / "smi" / "h100"
#: A process row of the plain nvidia-smi table: "|    0   N/A  N/A            4230      C   /opt/.../python3   10540MiB |".
_TABLE_ROW = re.compile(r"^\|\s+\d+\s+\S+\s+\S+\s+(\d+)\s+\S+\s+(\S+)\s+\d+MiB\s+\|$", re.M)
#: The query line's last three fields: "34 %, 10551 MiB, 81559 MiB" (utilisation, memory used, memory total).
_QUERY_TAIL = re.compile(r"(\d+) %, (\d+) MiB(?:, \d+ MiB)?$")


@dataclass(frozen=True)
class Moment:
    """What the GPU looked like once: utilisation (%), memory used (MiB) and the processes (pid, name, MiB)."""

    utilisation: int
    used_mib: int
    processes: Tuple[Tuple[int, str, int], ...]


def recorded(path: Path) -> List[Moment]:
    """The moments of a recording, in order (a query block followed by its compute processes)."""
    text = path.read_text()
    names = {int(pid): name for pid, name in _TABLE_ROW.findall(text)}
    moments: List[Moment] = []
    for block in re.split(r"^### (?:busy|idle)\b.*$", text, flags=re.M)[1:]:
        query, _, apps = block.partition("### compute-apps")
        tail = next((_QUERY_TAIL.search(line) for line in query.splitlines() if _QUERY_TAIL.search(line)), None)
        if tail is None:
            continue  # a header line only
        rows = [line.split(",") for line in apps.split("###", 1)[0].strip().splitlines() if "," in line]
        processes = tuple((int(pid), names.get(int(pid), "?"), int(mib)) for pid, mib in rows)
        moments.append(Moment(int(tail[1]), int(tail[2]), processes))
    return moments


_STAND_IN = """#!{python}
import json, sys
state = json.load(open({state!r}))
counter = {counter!r}
try:
    seen = int(open(counter).read())
except OSError:
    seen = 0
query = " ".join(sys.argv[1:])
asking = "--query-compute-apps=" in query
moment = state[min(seen if asking else max(seen - 1, 0), len(state) - 1)]
if asking:
    open(counter, "w").write(str(seen + 1))
    fields = query.split("--query-compute-apps=")[1].split()[0].split(",")
    for pid, name, mib in moment["processes"]:
        print(", ".join(str({{"pid": pid, "process_name": name, "used_memory": mib}}[f]) for f in fields))
elif "--query-gpu=memory.used" in query:
    print(moment["used_mib"])
elif "--query-gpu=utilization.gpu" in query:
    print(moment["utilisation"])
else:
    sys.exit("stand-in nvidia-smi: not recorded: " + query)
"""


def install(bin_dir: Path, moments: Sequence[Moment]) -> Path:
    """An ``nvidia-smi`` in ``bin_dir`` that replays ``moments`` (see the module's docstring); returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state = bin_dir / "nvidia-smi.moments.json"
    state.write_text(json.dumps([asdict(moment) for moment in moments]))
    tool = bin_dir / "nvidia-smi"
    tool.write_text(_STAND_IN.format(python=sys.executable, state=str(state), counter=str(bin_dir / "nvidia-smi.count")))
    tool.chmod(0o755)
    return tool
