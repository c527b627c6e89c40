"""``python -m trainbox``: the CLI, with the working directory taken off sys.path first.

``python -m`` puts the folder it was started from first on sys.path. trainbox itself is already
imported by then; what follows (the host side's look-up of Ultralytics, say) must not find a
user's ``ultralytics.py`` or ``yaml.py`` there either.

A folder named ``trainbox/`` there (the clone's own folder, seen from its parent) is worse: without an
``__init__.py`` it is a namespace package, and Python's path finder, which runs before the editable
install's finder, takes it for ``trainbox``; only this module comes from the real package, found inside
it, and the first ``from trainbox import SOURCE_ROOT`` failed. With the working directory off sys.path,
that stand-in is dropped and the real package imported in its place.
"""

import importlib
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()) and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

if getattr(sys.modules.get("trainbox"), "__file__", None) is None:  # a namespace package: see the docstring
    del sys.modules["trainbox"]
    importlib.import_module("trainbox")

from trainbox.cli import main  # noqa: E402 - after the sys.path fix above

raise SystemExit(main())
