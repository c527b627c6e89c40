"""A job of several nodes, one supervisor each, seen as one thing: what only the whole job knows.

Each node's supervisor watches its own ranks and writes its own run directory; the nodes share one job directory
(:class:`trainbox.rundir.layout.JobDir`). :mod:`.incident` puts their stall reports together and names the rank
the others wait for. Nothing here runs the job: the scheduler starts the supervisors and torchrun's agents restart
the ranks; this folder only reads and writes the job directory, and the supervisor only calls it (a listener on its
record), so the supervisor does not grow with it.
"""
