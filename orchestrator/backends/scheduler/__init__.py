"""The scheduler base: what every backend whose run is one scheduler job
shares (``backend``: ``SchedulerBackend`` and the job's handle), and a
job's state and each node's stream (``job``). A scheduler backend (Slurm,
``backends/slurm/``; one from outside the tree) fills in a few methods."""
