"""``python -m trainbox``: the CLI, with the working directory taken off sys.path first.

``python -m`` puts the folder it was started from first on sys.path. trainbox itself is already
imported by then; what follows (the host side's look-up of Ultralytics, say) must not find a
user's ``ultralytics.py`` or ``yaml.py`` there either.
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()) and not getattr(sys.flags, "safe_path", False):
    del sys.path[0]

from trainbox.cli import main  # noqa: E402 - after the sys.path fix above

raise SystemExit(main())
