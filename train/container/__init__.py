"""Host side of the trainbox containers: pins, compose parsing, build, launch, status.

Runs on the host (invoke tasks, tests); never imports torch or ultralytics.
Every user-facing failure is a :class:`trainbox.errors.UserError` whose
message is one line that says what to do.
"""
