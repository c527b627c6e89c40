"""GPU clocks, temperature, power and throttle reasons, from ``nvidia-smi`` or ``rocm-smi``.

A GPU that throttles (too hot, at its power cap, or braked by its board) runs
its kernels at a fraction of its clock: the run slows down without anything
else changing. :mod:`trainbox.diagnose.slowness` compares these readings with
the ones taken while the run was at its pace.

Sources:

* **NVIDIA**: :data:`NVIDIA_QUERY` (``--format=csv,noheader``): one line per GPU,
  ``0, 68, 1365 MHz, 1980 MHz, 699.80 W, 700.00 W, 0x0000000000000004, Not Active,
  Not Active, Not Active`` (recorded on an H100, driver 580.159:
  ``tests/fixtures/smi/clocks``). ``clocks_event_reasons.active`` is NVML's
  bitmask (``nvmlClocksEventReasons``, NVML API reference): :data:`NVML_REASONS`.
  A field the GPU does not support reads ``[N/A]`` or ``[Not Supported]``: None.
* **AMD**: :data:`ROCM_QUERY`, rocm-smi's text log, one ``GPU[<n>]<tabs>: <metric>: <value>``
  line per reading, as ``python_smi_tools/rocm_smi.py`` (ROCm/rocm_smi_lib) prints
  them: ``Temperature (Sensor edge) (C): 68.0`` (``--showtemp``), ``sclk clock
  level: 1 (1180Mhz)`` (``--showgpuclocks``), ``Average Graphics Package Power
  (W): 35.0`` (``Current Socket ...`` on newer GPUs, ``--showpower``), ``Max
  Graphics Package Power (W): 180.0`` (``--showmaxpower``), and the supported sclk
  levels after ``Supported sclk frequencies on GPU0`` (``--showclkfrq``), whose
  highest is the maximum clock. rocm-smi reports no throttle reasons: on AMD a
  throttle shows as a lower clock at a higher temperature than the baseline's.
  The temperature is the edge sensor's (the junction's where there is no edge),
  the one comparable to NVIDIA's ``temperature.gpu``.

:func:`query` runs the first installed tool, with a timeout, through
:func:`trainbox.system.gpu_state.query` (a tool that hangs in the driver is killed and
not waited for) and never raises. The parsers are pure and total: any text
gives a list, of the GPUs it could read.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from trainbox.system import gpu_state

#: The nvidia-smi query: index, core temperature, SM clock now and at most, power now and its limit, the active
#: clock event reasons (a bitmask) and the three slowdown flags (the same bits, spelled out).
NVIDIA_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,temperature.gpu,clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_event_reasons.active,"
    "clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_thermal_slowdown",
    "--format=csv,noheader",
)
_NVIDIA_FIELDS = 10
#: The rocm-smi query: temperatures, the current sclk, power and its cap, the supported clock levels.
ROCM_QUERY = ("rocm-smi", "--showtemp", "--showgpuclocks", "--showpower", "--showmaxpower", "--showclkfrq")
#: How long one query may take: nvidia-smi answered this query in 28 ms on an H100; a driver that needs more
#: than 3 s is hung (trainbox.diagnose.evidence gives its GPU queries the same).
QUERY_TIMEOUT_S = 3.0

#: NVML's clock event reasons (nvmlClocksEventReason*, NVML API reference, "NvmlClocksEventReasons"; the last two
#: as cuda-python's ``nvml.ClocksEventReasons`` lists them for newer drivers).
NVML_REASONS = {
    0x1: "GPU_IDLE",
    0x2: "APPLICATIONS_CLOCKS_SETTING",
    0x4: "SW_POWER_CAP",
    0x8: "HW_SLOWDOWN",
    0x10: "SYNC_BOOST",
    0x20: "SW_THERMAL_SLOWDOWN",
    0x40: "HW_THERMAL_SLOWDOWN",
    0x80: "HW_POWER_BRAKE_SLOWDOWN",
    0x100: "DISPLAY_CLOCK_SETTING",
    0x200: "BOARD_LIMIT",
    0x400: "RELIABILITY",
}
#: The reasons that slow a busy GPU down against its will: heat and the board's brakes. SW_POWER_CAP is left
#: out: a busy GPU sits at its power cap as a matter of course (the H100 recording: 699.8 of 700 W, 0x4).
SLOWDOWN_REASONS = frozenset({"HW_SLOWDOWN", "SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN", "HW_POWER_BRAKE_SLOWDOWN"})
#: The spelled-out flags of NVIDIA_QUERY, in order after the bitmask.
_NVIDIA_FLAGS = ("HW_SLOWDOWN", "SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN")


@dataclass(frozen=True)
class GpuClocks:
    """One GPU's reading; None where the tool did not say."""

    index: int
    temperature_c: Optional[float]
    clock_mhz: Optional[float]
    max_clock_mhz: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    #: Active clock event reasons by NVML name (NVIDIA only; rocm-smi reports none).
    reasons: Tuple[str, ...] = ()

    @property
    def slowdowns(self) -> Tuple[str, ...]:
        return tuple(reason for reason in self.reasons if reason in SLOWDOWN_REASONS)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reading:
    """What a GPU tool answered: ``source`` (the tool), its GPUs, or why there are none."""

    source: str
    gpus: Tuple[GpuClocks, ...] = ()
    error: Optional[str] = None
    #: The tool did not answer in time: the driver may be hung, do not ask again.
    hung: bool = False


_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def _number(text: str) -> Optional[float]:
    """The leading number of ``68``, ``1365 MHz``, ``699.80 W``; None for ``[N/A]``, ``[Not Supported]``, text."""
    match = _NUMBER.match(text)
    return float(match.group(1)) if match else None


def reasons_of(mask: int) -> Tuple[str, ...]:
    """NVML reason names of a ``clocks_event_reasons.active`` bitmask, lowest bit first; unknown bits as hex."""
    names = [name for bit, name in sorted(NVML_REASONS.items()) if mask & bit]
    unknown = mask & ~sum(NVML_REASONS)
    return tuple(names + ([f"0x{unknown:x}"] if unknown else []))


def _nvidia_reasons(fields: List[str]) -> Tuple[str, ...]:
    mask_text = fields[6].strip()
    mask = int(mask_text, 16) if re.fullmatch(r"0[xX][0-9a-fA-F]{1,16}", mask_text) else 0
    flagged = [name for name, flag in zip(_NVIDIA_FLAGS, fields[7:10]) if flag.strip() == "Active"]
    named = reasons_of(mask)
    return named + tuple(name for name in flagged if name not in named)


def parse_nvidia(text: str) -> List[GpuClocks]:
    """The GPUs in :data:`NVIDIA_QUERY`'s output (``noheader`` or not, with or without units); others lines skipped."""
    gpus = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) != _NVIDIA_FIELDS or not fields[0].strip().isdigit():
            continue
        temperature, clock, max_clock, power, limit = (_number(f) for f in fields[1:6])
        gpus.append(GpuClocks(int(fields[0]), temperature, clock, max_clock, power, limit, _nvidia_reasons(fields)))
    return gpus


_ROCM_LINE = re.compile(r"^GPU\[(\d+)\]\s*:\s?(.*)$")
_ROCM_TEMPERATURE = re.compile(r"^Temperature \(Sensor (edge|junction)\) \(C\): (\S+)")
_ROCM_SCLK = re.compile(r"^sclk clock level:?[^(]*\((\d+(?:\.\d+)?)\s*Mhz\)", re.IGNORECASE)
_ROCM_POWER = re.compile(r"^(?:Average|Current Socket) Graphics Package Power \(W\): (\S+)")
_ROCM_MAX_POWER = re.compile(r"^Max Graphics Package Power \(W\): (\S+)")
_ROCM_SUPPORTED = re.compile(r"^Supported (\S+) frequencies on GPU\d+")
_ROCM_LEVEL = re.compile(r"^\S+: (\d+(?:\.\d+)?)\s*Mhz", re.IGNORECASE)
_ROCM_VALUES = (("sclk", _ROCM_SCLK), ("power", _ROCM_POWER), ("max_power", _ROCM_MAX_POWER))


def _rocm_gpu(index: int, lines: List[str]) -> GpuClocks:
    """One GPU from its rocm-smi lines (the text after ``GPU[n] :``)."""
    values: Dict[str, Optional[float]] = {}
    levels: List[float] = []
    listing = ""
    for line in lines:
        supported = _ROCM_SUPPORTED.match(line)
        if supported or not line.strip():
            listing = supported.group(1).lower() if supported else ""
            continue
        level = _ROCM_LEVEL.match(line)
        if listing == "sclk" and level:
            levels.append(float(level.group(1)))
        temperature = _ROCM_TEMPERATURE.match(line)
        if temperature:
            values[temperature.group(1)] = _number(temperature.group(2))
        for name, pattern in _ROCM_VALUES:
            match = pattern.match(line)
            if match:
                values[name] = _number(match.group(1))
    edge = values.get("edge")
    return GpuClocks(
        index,
        temperature_c=edge if edge is not None else values.get("junction"),
        clock_mhz=values.get("sclk"),
        max_clock_mhz=max(levels) if levels else None,
        power_w=values.get("power"),
        power_limit_w=values.get("max_power"),
    )


def parse_rocm(text: str) -> List[GpuClocks]:
    """The GPUs in :data:`ROCM_QUERY`'s output, by index; a GPU that said nothing useful is left out."""
    by_gpu: Dict[int, List[str]] = {}
    for line in text.splitlines():
        match = _ROCM_LINE.match(line.strip())
        if match:
            by_gpu.setdefault(int(match.group(1)), []).append(match.group(2))
    gpus = [_rocm_gpu(index, lines) for index, lines in sorted(by_gpu.items())]
    return [gpu for gpu in gpus if (gpu.temperature_c, gpu.clock_mhz, gpu.power_w) != (None, None, None)]


_TOOLS = ((NVIDIA_QUERY, parse_nvidia), (ROCM_QUERY, parse_rocm))


def query(timeout: float = QUERY_TIMEOUT_S) -> Optional[Reading]:
    """Ask the first installed tool (nvidia-smi, else rocm-smi); None when neither is installed. Never raises."""
    for argv, parse in _TOOLS:
        answer = gpu_state.query(argv, timeout)  # undecodable bytes come back replaced, never raised
        if answer is None:
            continue
        if not answer.ok:
            return Reading(argv[0], error=answer.text, hung=answer.hung)
        gpus = tuple(parse(answer.text))
        return Reading(argv[0], gpus=gpus, error=None if gpus else f"{argv[0]}: no GPU readings in its output")
    return None
