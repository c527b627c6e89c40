"""SONAME from real shared libraries mapped into this process."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from trainbox.doctor.elf import soname
from trainbox.doctor.inside import loaded_libraries


def test_soname_of_the_loaded_libc() -> None:
    """The file may be libc.so.6 or libc-2.31.so (Debian 11): the SONAME is libc.so.6 either way."""
    mapped = loaded_libraries(Path("/proc/self/maps").read_text(), "libc")
    (libc,) = [p for p in mapped if re.fullmatch(r"libc(\.so\.6|-[0-9.]+\.so)", Path(p).name)]
    assert soname(Path(libc)) == "libc.so.6"


def test_no_soname(tmp_path: Path) -> None:
    assert soname(Path(sys.executable)) is None  # an executable has no SONAME
    text = tmp_path / "not-elf.so"
    text.write_text("not an ELF file")
    assert soname(text) is None
    assert soname(tmp_path / "absent.so") is None
