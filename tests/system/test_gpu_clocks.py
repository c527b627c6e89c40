"""GPU clocks from recorded nvidia-smi output (a real H100) and rocm-smi's documented format; real programs on PATH."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainbox.system import gpu_clocks
from trainbox.system.gpu_clocks import GpuClocks, parse_nvidia, parse_rocm, reasons_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "smi"
CLOCKS = FIXTURES / "clocks"


def test_the_recorded_h100_reads_idle_then_at_its_power_cap() -> None:
    """The header, the `###` notes and the timing lines are skipped; units or none, the same GPU is read."""
    readings = parse_nvidia((CLOCKS / "h100-recorded.txt").read_text())
    idle = GpuClocks(0, 44.0, 345.0, 1980.0, 75.71, 700.0, ("GPU_IDLE",))
    assert readings[:2] == [idle, idle]
    assert readings[2] == GpuClocks(0, 44.0, 345.0, 1980.0, 75.69, 700.0, ("GPU_IDLE",))  # nounits, a moment later
    busy = readings[3]
    assert busy == GpuClocks(0, 68.0, 1365.0, 1980.0, 699.8, 700.0, ("SW_POWER_CAP",))
    assert busy.slowdowns == ()  # at the power cap under full load: normal, not a slowdown
    assert len(readings) == 4


def test_a_thermal_throttle_is_named() -> None:
    (hot,) = parse_nvidia((CLOCKS / "h100-thermal.csv").read_text())
    assert hot.temperature_c == 91.0 and hot.clock_mhz == 645.0 and hot.max_clock_mhz == 1980.0
    assert hot.reasons == ("HW_SLOWDOWN", "SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN")
    assert hot.slowdowns == hot.reasons


def test_another_query_s_lines_are_not_misread() -> None:
    """The older recordings have 14 fields (name, utilisation, memory): not this query's lines."""
    assert parse_nvidia((FIXTURES / "h100" / "idle-queries.txt").read_text()) == []


def test_unsupported_fields_are_none_and_flags_alone_still_name_reasons() -> None:
    text = "0, [N/A], 1365 MHz, [N/A], [Not Supported], 700.00 W, [N/A], Active, Not Active, [N/A]\n"
    (gpu,) = parse_nvidia(text)
    assert (gpu.temperature_c, gpu.max_clock_mhz, gpu.power_w) == (None, None, None)
    assert gpu.reasons == ("HW_SLOWDOWN",)


def test_several_gpus() -> None:
    line = "{i}, 60, 1700 MHz, 1980 MHz, 400.00 W, 700.00 W, 0x0000000000000000, Not Active, Not Active, Not Active"
    gpus = parse_nvidia("\n".join(line.format(i=i) for i in range(4)))
    assert [gpu.index for gpu in gpus] == [0, 1, 2, 3]


def test_reason_bits() -> None:
    assert reasons_of(0) == ()
    assert reasons_of(0x4 | 0x40) == ("SW_POWER_CAP", "HW_THERMAL_SLOWDOWN")
    assert reasons_of(0x1000) == ("0x1000",)  # a bit this code does not know yet is kept, as hex


def test_rocm_smi_steady_and_hot() -> None:
    (steady,) = parse_rocm((CLOCKS / "rocm-gfx1010-steady.txt").read_text())
    assert steady == GpuClocks(0, 71.0, 1905.0, 1905.0, 172.0, 180.0)
    (hot,) = parse_rocm((CLOCKS / "rocm-gfx1010-hot.txt").read_text())
    assert hot == GpuClocks(0, 94.0, 1180.0, 1905.0, 121.0, 180.0)


def test_rocm_smi_variants() -> None:
    """``--showclocks`` spells the level ``sclk clock level: 1: (1180Mhz)``; a GPU without an edge sensor reports
    its junction; newer GPUs report socket power; two GPUs."""
    text = (
        "GPU[0]\t\t: Temperature (Sensor junction) (C): 88.0\n"
        "GPU[0]\t\t: sclk clock level: 1: (1180Mhz)\n"
        "GPU[0]\t\t: Current Socket Graphics Package Power (W): 350.0\n"
        "GPU[1]\t\t: Temperature (Sensor edge) (C): 40.0\n"
        "GPU[1]\t\t: sclk clock level: S (100Mhz)\n"
    )
    first, second = parse_rocm(text)
    assert (first.temperature_c, first.clock_mhz, first.power_w) == (88.0, 1180.0, 350.0)
    assert (second.index, second.temperature_c, second.clock_mhz) == (1, 40.0, 100.0)


def test_rocm_smi_errors_give_no_gpu() -> None:
    assert parse_rocm("ERROR: GPU[0] : Unable to open /dev/kfd\nWARNING: No AMD GPUs specified\n") == []


def _program(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of only this folder (and /bin for sh, cat, sleep), so neither tool is found unless put here."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}/bin")
    return directory


def test_query_asks_nvidia_smi_first_with_the_query(bin_dir: Path) -> None:
    _program(bin_dir, "nvidia-smi", f'echo "$@" > {bin_dir}/argv; cat {CLOCKS / "h100-thermal.csv"}')
    _program(bin_dir, "rocm-smi", f"cat {CLOCKS / 'rocm-gfx1010-hot.txt'}")
    reading = gpu_clocks.query()
    assert reading is not None and reading.source == "nvidia-smi" and reading.error is None
    assert reading.gpus[0].slowdowns == ("HW_SLOWDOWN", "SW_THERMAL_SLOWDOWN", "HW_THERMAL_SLOWDOWN")
    assert (bin_dir / "argv").read_text().split() == list(gpu_clocks.NVIDIA_QUERY[1:])


def test_query_falls_back_to_rocm_smi(bin_dir: Path) -> None:
    _program(bin_dir, "rocm-smi", f"cat {CLOCKS / 'rocm-gfx1010-hot.txt'}")
    reading = gpu_clocks.query()
    assert reading is not None and reading.source == "rocm-smi"
    assert reading.gpus == (GpuClocks(0, 94.0, 1180.0, 1905.0, 121.0, 180.0),)


def test_query_without_a_tool_is_none(bin_dir: Path) -> None:
    assert gpu_clocks.query() is None


def test_a_hung_tool_is_given_up_on(bin_dir: Path) -> None:
    _program(bin_dir, "nvidia-smi", "sleep 30")
    started = time.monotonic()
    reading = gpu_clocks.query(timeout=0.5)
    assert time.monotonic() - started < 5
    assert reading is not None and reading.hung and reading.gpus == ()
    assert "no answer within" in (reading.error or "")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9", "failed"),
        ("printf '\\377\\376 not text\\n'", "nvidia-smi"),
    ],
)
def test_a_failing_tool_says_why_in_one_line(bin_dir: Path, body: str, expected: str) -> None:
    _program(bin_dir, "nvidia-smi", body)
    reading = gpu_clocks.query()
    assert reading is not None and not reading.hung and reading.gpus == ()
    assert reading.error is not None and expected in reading.error and "\n" not in reading.error


@given(st.text())
def test_parsers_never_raise_on_any_text(text: str) -> None:
    for gpu in parse_nvidia(text) + parse_rocm(text):
        assert isinstance(gpu.index, int)


#: Any field text but commas and what str.splitlines() ends a line at (control characters, line separators).
_FIELD = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters=","), max_size=12),
    st.sampled_from(["[N/A]", "Active", "Not Active", "0xzz", "0x" + "f" * 20, "1e999 W", "-5 MHz", "12"]),
)


@given(st.lists(_FIELD, min_size=9, max_size=9), st.integers(0, 10**30))
def test_parse_nvidia_never_raises_on_any_fields(fields: list, index: int) -> None:
    (gpu,) = parse_nvidia(", ".join([str(index), *fields]))
    assert gpu.index == index


@given(
    st.lists(
        st.sampled_from(
            [
                "Temperature (Sensor edge) (C): ",
                "sclk clock level: 1 (",
                "Supported sclk frequencies on GPU0",
                "0: ",
                "Max Graphics Package Power (W): ",
                "Mhz)",
                "Mhz",
                "N/A",
                "9" * 400,
                "",
                "*",
            ]
        ),
        max_size=8,
    )
)
def test_parse_rocm_never_raises_on_its_own_words(words: list) -> None:
    parse_rocm("".join(f"GPU[0]\t\t: {word}\n" for word in words) + "GPU[0]\t\t: " + "".join(words))
