"""Imported in the forkserver alone, first of its preload (:mod:`trainbox.yolo.forkserver`): the server dies with
the training process that started it, and each worker with the server (:func:`trainbox.system.proctree.tie_to_parent`).

Python's forkserver and torch's DataLoader workers each watch only their own parent, and the server lives as long as
a worker holds its "alive" pipe: a training process killed with SIGKILL (the OOM killer) left the server, its workers
and the resource tracker running for ever. Importing this module is what ties them; nothing else imports it.
"""

from __future__ import annotations

from trainbox.system import proctree

proctree.tie_to_parent()
