"""trainbox as a Slurm job step: one supervisor on every node of a job, and the job seen as one thing.

``srun --ntasks-per-node=1 python -m trainbox supervise -- torchrun --nnodes $SLURM_NNODES ...`` starts one
supervisor per node. The modules here are what only such a job needs, each in a room of its own; the supervisor
itself does not know it runs under Slurm (the CLI wires these in):

* :mod:`trainbox.slurm.env`: the job as Slurm describes it (``SLURM_*``), validated; where the job's run
  directory is, with a folder per node; the rendezvous endpoint;
* :mod:`trainbox.slurm.signals`: Slurm's warning before the time limit, a stop at the next checkpoint;
* the job-level incident and the job's view (the first silent rank across nodes, every node in one table).
"""
