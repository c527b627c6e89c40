"""The Ultralytics training child: offline, profiled, beating, resumable, with atomic checkpoints.

``python -m trainbox.yolo --profile NAME [KEY=VALUE ...]`` is what ``trainbox run``
starts per attempt. Only this package (apart from ``args`` and ``dataset``, which
the host uses to validate ``KEY=VALUE`` and the dataset) imports torch and Ultralytics.
"""
