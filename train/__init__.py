"""trainbox: supervised, self-healing training runs (see README.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

#: The folder that holds ``train/``, ``env/`` and ``compose.yaml``: this checkout, or the image's /app.
SOURCE_ROOT = Path(__file__).resolve().parent.parent

#: ``python -c`` program that runs ``sys.argv[1]`` as ``python -m`` would, without the working directory
#: on sys.path (what Python 3.11's ``-P`` does, for every Python trainbox supports).
_RUN_MODULE = (
    "import runpy, sys\n"
    "if sys.path[:1] == ['']: del sys.path[0]\n"
    "module = sys.argv.pop(1)\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def module_command(module: str, *args: str) -> List[str]:
    """The command line of a child that trainbox starts itself: ``python -m MODULE ARGS``, immune to shadowing.

    ``python -m`` puts the working directory first on sys.path, so a user's ``trainbox.py`` (or any module
    the child imports, ``yaml.py`` say) in the folder they train from would be imported instead of ours.
    """
    return [sys.executable, "-c", _RUN_MODULE, module, *args]
