"""The run directory: its files, and the words they use.

Everything a run leaves behind lives under one folder, and every reader of it (the supervisor, the child,
``status``, ``report``, ``health``, the containers) meets it here: the layout (:mod:`.layout`, every path named
once), the history (:mod:`.events`), the supervisor's published state (:mod:`.state`), the sampled progress
(:mod:`.progress`), the one-supervisor lock (:mod:`.lock`) and a container's exit record (:mod:`.exit_record`).
Standard library only: a module here may import the top-level ``errors`` and ``atomic`` and nothing else of
trainbox, so any process can read a run without pulling in the supervisor.
"""
