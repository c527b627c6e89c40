"""The supervisor, and what only it uses.

:class:`.supervisor.Supervisor` conducts: it runs attempts (:mod:`.attempt`), watches each one (:mod:`.monitor`:
beats, budgets and silences), turns a stall into its findings and a decision (:mod:`.stall`), records everything
(:mod:`.record`) and ends one way. The rules it follows are pure modules of their own: the settings table
(:mod:`.settings`), the restart policy (:mod:`.policy`), the budgets (:mod:`.budgets`), the silence judge
(:mod:`.silence`), which progress counts (:mod:`.progress_source`: beats, else counters read from the output), a
ladder file's rungs (:mod:`.command_ladder`). The rest serve the loop: per-rank heartbeats (:mod:`.ranks`), the
child's output on a pseudo-terminal (:mod:`.terminal`, :mod:`.output`) and the counters in it
(:mod:`.output_progress`), the watchdog contract with ``health`` (:mod:`.watchdog`, :mod:`.health`) and the GPU memory wait
(:mod:`.gpu_release`).
"""
