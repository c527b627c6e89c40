"""Check the ROCm image on the workstation (RX 5600 XT): run inside the rocm service.

    docker compose run --rm rocm sh -c 'python /usr/local/lib/trainbox/verify_rocm.py'

Prints what it finds and exits 1 on the first failed check: the GPU is seen
as gfx1030 (HSA_OVERRIDE_GFX_VERSION), torch sees it, the kdb aliases exist,
which libMIOpen is loaded, and whether compiled kernels persist: the same
convolution runs in two fresh processes; with a working kernel cache the
second starts without compiling and its cache directory is not empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CONV = """
import time, torch
start = time.monotonic()
conv = torch.nn.Conv2d(3, 16, 3, padding=1).cuda()
x = torch.randn(8, 3, 64, 64, device="cuda", requires_grad=True)
conv(x).sum().backward()
torch.cuda.synchronize()
maps = open("/proc/self/maps").read()
miopen = sorted({line.split()[-1] for line in maps.splitlines() if "libMIOpen" in line})
print(f"{time.monotonic() - start:.1f}", *miopen)
"""


def check(ok: bool, message: str) -> None:
    print(("ok    " if ok else "FAIL  ") + message)
    if not ok:
        sys.exit(1)


def main() -> None:
    info = subprocess.run(["rocminfo"], capture_output=True, text=True)
    names = sorted({word for word in info.stdout.split() if word.startswith("gfx")})
    check("gfx1030" in names, f"rocminfo agents: {', '.join(names) or info.stderr.strip()[:200]}")
    import torch

    check(torch.cuda.is_available(), f"torch {torch.__version__} (HIP {torch.version.hip}) sees a GPU")
    print(f"      device: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).multi_processor_count} CUs/WGPs")
    db = Path(os.environ["MIOPEN_SYSTEM_DB_PATH"])
    kdbs = sorted(p.name for p in db.glob("*.kdb"))
    check("gfx1030_18.kdb" in kdbs and (db / "gfx1030_18.kdb").resolve().is_file(), f"kernel DBs in {db}: {kdbs}")
    cache = Path(os.environ["MIOPEN_CUSTOM_CACHE_DIR"])
    timings = []
    for run in (1, 2):
        out = subprocess.run([sys.executable, "-c", CONV], capture_output=True, text=True)
        check(out.returncode == 0, f"conv forward/backward, fresh process {run}: {out.stdout.strip() or out.stderr[-300:]}")
        timings.append(float(out.stdout.split()[0]))
    cached = [p for p in cache.rglob("*") if p.is_file()]
    print(f"      {len(cached)} files in {cache}; first run {timings[0]:.1f} s, second {timings[1]:.1f} s")
    check(bool(cached), "compiled kernels persist on disk (empty: the wheel's embedded MIOpen is in use)")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"all checks passed in {time.monotonic() - started:.0f} s")
