"""The SONAME of a shared library, read from its ELF dynamic section (64-bit little-endian, as on x86-64).

Tells which MIOpen a process loaded when the path alone does not: the
ROCm image may put ROCm's ``libMIOpen.so.1`` in the wheel's place under the
wheel's file name (Dockerfile.rocm, ``MIOPEN=rocm``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Optional

_SHT_DYNAMIC = 6
_DT_NULL, _DT_SONAME = 0, 14


def soname(path: Path) -> Optional[str]:
    """The DT_SONAME string, or None (no SONAME, not a 64-bit little-endian ELF, unreadable)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, entsize or 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == _DT_NULL:
                break
            if tag == _DT_SONAME:
                start = strtab_offset + value
                return data[start : data.index(b"\0", start)].decode()
    return None
