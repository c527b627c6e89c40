"""Until the package restructuring (issue 27) turns ``train/rundir.py`` into the ``train/rundir/`` package, the
module ``trainbox.rundir`` is given that folder as its package path, so ``trainbox.rundir.safe`` imports as it
will afterwards. Delete this file when ``train/rundir/__init__.py`` exists."""

from __future__ import annotations

from pathlib import Path

import trainbox.rundir

if not hasattr(trainbox.rundir, "__path__"):
    trainbox.rundir.__path__ = [str(Path(trainbox.rundir.__file__).with_suffix(""))]  # type: ignore[attr-defined]
