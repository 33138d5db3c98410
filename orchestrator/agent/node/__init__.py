"""One node's run: the supervisor of torchrun and its teardown, the guardian,
finding the run's processes, worker failures and logs, probes, the route to
the master, ``setup:``, ``outputs:``, stack dumps, pruning, and a node that a
scheduler started (``jobnode``)."""
