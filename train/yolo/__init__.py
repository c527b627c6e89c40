"""The Ultralytics training child: offline, profiled, beating, resumable, with atomic checkpoints.

``python -m trainbox.yolo --profile NAME [KEY=VALUE ...]`` is what ``python -m
train run`` starts per attempt. Only this package (apart from ``args``, which
the host uses to validate ``KEY=VALUE``) imports torch and Ultralytics.
"""
