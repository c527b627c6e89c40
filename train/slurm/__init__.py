"""trainbox as a Slurm job step: one supervisor on every node of a job, and the job seen as one thing.

``srun --ntasks-per-node=1 python -m trainbox supervise -- torchrun --nnodes $SLURM_NNODES ...`` starts one
supervisor per node. The modules here are what only such a job needs, each in a room of its own; the supervisor
itself does not know it runs under Slurm (the CLI wires these in):

* :mod:`trainbox.slurm.env`: the job as Slurm describes it (``SLURM_*``), validated; where the job's run
  directory is, with a folder per node; the rendezvous endpoint;
* :mod:`trainbox.slurm.shared`: whether the nodes see the same job directory, found out at the start;
* :mod:`trainbox.slurm.step`: what the CLI asks of all that before the supervisor starts.

What any job of several nodes shares, Slurm's or not (the job-level incident, the job's view), is
:mod:`trainbox.job`'s, one layer below.
"""
