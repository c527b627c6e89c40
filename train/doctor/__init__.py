"""``python -m trainbox doctor``: what stands between this machine and a training run, each failure with its fix.

Host side (``kfd``, ``devices``, ``nvidia``, ``host``, ``checkup``, ``report``, ``cli``)
never imports torch or ultralytics; every check takes a ``root`` path so it
runs against the real ``/`` or a recorded sysfs/dev tree
(``tests/fixtures/hosts/``). ``inside`` runs in the image
(``python -m trainbox doctor --inside``) and imports torch inside its functions.
"""
