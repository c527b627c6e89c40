"""Build step: rewrite every .pyc under the given folders the way site-packages' are written.

Debian's Python packages byte-compile their modules when they are installed,
and ``python -m venv`` does the same for the pip and setuptools it bootstraps:
in several processes, and with the time of a file written a moment before in
the header (ensurepip). Two builds then differ in those .pyc files while every
.py is the same. This rewrites each .pyc that is there (no more, no fewer) from
its source: hash-based instead of timestamped, in one process, in a sorted
order, under a fixed string-hash seed (``PYTHONHASHSEED=0``, set by the caller:
frozenset constants are marshalled in set order), as the locked-packages step
does for site-packages. A .pyc whose source is gone, or that another Python
version wrote, is left as it is.

Usage: PYTHONHASHSEED=0 python hash-pycs.py DIR...
"""

import os
import py_compile
import sys
from pathlib import Path


def source_of(pyc: Path) -> Path:
    """``pkg/__pycache__/mod.cpython-39.opt-1.pyc`` -> ``pkg/mod.py``."""
    return pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")


def optimization(pyc: Path) -> int:
    marker = pyc.name.rsplit(".", 2)[-2]
    return int(marker[4:]) if marker.startswith("opt-") else 0


def main(folders):
    if os.environ.get("PYTHONHASHSEED") != "0":
        sys.exit("hash-pycs.py: run it with PYTHONHASHSEED=0")
    tag = "." + sys.implementation.cache_tag + "."
    rewritten = 0
    for folder in folders:
        for pyc in sorted(Path(folder).rglob("__pycache__/*.pyc")):
            source = source_of(pyc)
            if tag in pyc.name and source.is_file():
                py_compile.compile(
                    str(source),
                    cfile=str(pyc),
                    dfile=str(source),
                    doraise=True,
                    optimize=optimization(pyc),
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
                rewritten += 1
    print(f"hash-pycs.py: rewrote {rewritten} .pyc under {' '.join(folders)}")


if __name__ == "__main__":
    main(sys.argv[1:])
