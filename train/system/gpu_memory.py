"""GPU memory as the vendor tools report it, and whose it is: per process here, or only the device's total.

``nvidia-smi`` and ``rocm-smi`` name the processes that hold GPU memory by pid. Inside a container (a pid
namespace) those are the host's pids (NVIDIA/nvidia-docker#1483: the driver sees the host's view), which name no
process here, or another one. ``NSpid`` in ``/proc/<pid>/status`` does not map them back: from inside the
namespace it lists the inner pid only (checked with ``unshare --pid --fork``), and compose gives the container no
``pid: host``. So a listed pid counts as a process of this machine's view only when ``/proc/<pid>`` exists and its
name is the listed process's name. When the tool lists processes and none of them is here, the per-process
figures are **unknown, not zero** (:attr:`GpuMemory.by_pid` is None), and the devices' used memory
(:attr:`GpuMemory.used_mib`: ``--query-gpu=memory.used``, ``rocm-smi --showmeminfo vram``) stands in: for what a
killed tree still holds (:mod:`trainbox.supervise.gpu_release`) and for whether an idle tree's busy GPU holds
memory (:mod:`trainbox.diagnose.causes`, rule 9). Issue 33 item 11: without this, inside the containers the
release wait found 0 MiB held and said "released" at once, and the busy-kernel rule never fired.

Host-side, no torch; the tools are run by :func:`trainbox.system.gpu_state.query` (time-limited, a hung one
abandoned). Tested against a real H100 recording (``tests/fixtures/smi/h100``) replayed by a stand-in tool.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from trainbox.system import gpu_state

#: ``rocm-smi --showpids`` rows: "PID  PROCESS NAME  GPU(s)  VRAM USED  SDMA USED  CU OCCUPANCY" (bytes; UNKNOWN
#: where the driver does not say), tab- or space-separated.
_ROCM_PID_ROW = re.compile(r"^(\d+)\s+(.*?)\s+(\d+)\s+(\d+|UNKNOWN|N/A)\s")
_ROCM_USED = re.compile(r"VRAM Total Used Memory \(B\)\s*:\s*(\d+)")
_ROCM_USE = re.compile(r"GPU use \(%\)\s*:\s*(\d+)")
_NVIDIA_NUMBER = re.compile(r"^\s*(\d+)\s*$", re.MULTILINE)
_MIB = 2**20
#: The kernel keeps the first 15 characters of a process's name (``comm``).
_COMM_LENGTH = 15


@dataclass(frozen=True)
class GpuProcess:
    """One row of a tool's process list: pid (in the tool's view), name, MiB held."""

    pid: int
    name: str
    mib: int


def nvidia_processes(text: str) -> List[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits``."""
    found = []
    for line in text.splitlines():
        pid, _, rest = line.partition(",")
        name, _, used = rest.rpartition(",")
        if pid.strip().isdigit() and used.strip().isdigit():
            found.append(GpuProcess(int(pid), name.strip(), int(used)))
    return found


def rocm_processes(text: str) -> List[GpuProcess]:
    """``rocm-smi --showpids`` (a process whose VRAM the driver does not report holds 0 here)."""
    found = []
    for line in text.splitlines():
        row = _ROCM_PID_ROW.match(line.strip() + " ")
        if row:
            found.append(GpuProcess(int(row[1]), row[2].strip(), int(row[4]) // _MIB if row[4].isdigit() else 0))
    return found


def by_pid(processes: Sequence[GpuProcess]) -> Dict[int, int]:
    """MiB per pid (a process with several contexts is listed once per context)."""
    memory: Dict[int, int] = {}
    for process in processes:
        memory[process.pid] = memory.get(process.pid, 0) + process.mib
    return memory


def nvidia_used(text: str) -> Optional[int]:
    """MiB used on all GPUs, from ``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits``."""
    numbers = [int(value) for value in _NVIDIA_NUMBER.findall(text)]
    return sum(numbers) if numbers else None


def rocm_used(text: str) -> Optional[int]:
    """MiB used on all GPUs, from ``rocm-smi --showmeminfo vram``."""
    numbers = [int(value) for value in _ROCM_USED.findall(text)]
    return sum(numbers) // _MIB if numbers else None


@dataclass(frozen=True)
class Tool:
    """One vendor tool's three questions and how to read its answers."""

    processes_argv: Tuple[str, ...]
    parse_processes: Callable[[str], List[GpuProcess]]
    used_argv: Tuple[str, ...]
    parse_used: Callable[[str], Optional[int]]
    use_argv: Tuple[str, ...]  # utilisation of each GPU
    use_pattern: re.Pattern[str]

    @property
    def name(self) -> str:
        return self.processes_argv[0]


TOOLS = (
    Tool(
        ("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"),
        nvidia_processes,
        ("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"),
        nvidia_used,
        ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"),
        _NVIDIA_NUMBER,
    ),
    Tool(
        ("rocm-smi", "--showpids"),
        rocm_processes,
        ("rocm-smi", "--showmeminfo", "vram"),
        rocm_used,
        ("rocm-smi", "--showuse"),
        _ROCM_USE,
    ),
)


def _proc(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""


def is_here(process: GpuProcess) -> bool:
    """Whether the listed process is the process of that pid in this machine's view: same pid, same name."""
    listed = os.path.basename(process.name)
    comm = _proc(process.pid, "comm").strip()
    program = os.path.basename(_proc(process.pid, "cmdline").split("\0", 1)[0])
    return bool(listed) and bool(comm) and (listed[:_COMM_LENGTH] == comm or listed == program)


@dataclass(frozen=True)
class GpuMemory:
    """What the first installed tool said about memory (see the module's docstring)."""

    source: str
    #: MiB per pid of this machine's view; None when the tool's pids are not (a container: the host's).
    by_pid: Optional[Dict[int, int]]
    #: MiB used on all devices; asked only when ``by_pid`` is None (then None when the tool did not say).
    used_mib: Optional[int]

    @property
    def host_pids(self) -> bool:
        return self.by_pid is None


def ask(timeout: float) -> Optional[Tuple[Tool, gpu_state.ToolResult]]:
    """The first installed tool and its answer to the process query; None when none is installed."""
    for tool in TOOLS:
        answer = gpu_state.query(tool.processes_argv, timeout)
        if answer is not None:
            return tool, answer
    return None


def used_mib(tool: Tool, timeout: float) -> Optional[int]:
    """The devices' used memory as ``tool`` says it; None when it does not answer."""
    answer = gpu_state.query(tool.used_argv, timeout)
    return tool.parse_used(answer.text) if answer is not None and answer.ok else None


def memory_from(tool: Tool, answer: gpu_state.ToolResult, timeout: float) -> GpuMemory:
    """The :class:`GpuMemory` of a process query's answer (``answer.ok``); asks for the devices' use when needed."""
    processes = tool.parse_processes(answer.text)
    here = [process for process in processes if is_here(process)]
    if processes and not here:
        return GpuMemory(tool.name, None, used_mib(tool, timeout))
    return GpuMemory(tool.name, by_pid(here), None)


def read(timeout: float) -> Optional[GpuMemory]:
    """GPU memory now; None when no tool is installed or it does not answer."""
    asked = ask(timeout)
    if asked is None or not asked[1].ok:
        return None
    return memory_from(asked[0], asked[1], timeout)


def device_used_mib(timeout: float) -> Optional[int]:
    """The devices' used memory (the first installed tool's); None when none is installed or it does not answer."""
    tool = next((tool for tool in TOOLS if shutil.which(tool.name)), None)
    return None if tool is None else used_mib(tool, timeout)
