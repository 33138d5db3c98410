"""The run engine: what every backend shares once its nodes are reached.

* ``run``        follow a backend's running run to its end, collect its results
* ``channel``    the ``NodeChannel`` Protocol the gang reads and tells, and the keeper follower
* ``agentlink``  the controller's end of a node agent's channel (requests, files)
* ``nodehandle`` one node of a running gang: its channel, relay and outcome
* ``gang``       one gang under a mode (attached, kept, observed): watch, gang-stop, teardown
* ``keptgang``   the controller's side of a run its nodes' keepers hold
* ``fanout``     every node at once, per-node results
* ``results``    what a finished run brings home
* ``bundle``     what of a code directory is uploaded
* ``preflight``  ``check``: every check a launch depends on (``checknet``: its network half)
* ``stacks``     every rank's stack: dumps, grouping, the odd rank of a hang
"""
