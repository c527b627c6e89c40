"""Child entry: ``python -m trainbox.yolo --profile NAME [KEY=VALUE ...]`` (see ``trainbox.yolo.runner``).

Spawn-started DataLoader workers import this module as ``__mp_main__``: it
must do nothing at import time beyond importing the (light) runner.
"""

from trainbox.yolo.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
