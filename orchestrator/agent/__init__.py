"""The node agent: everything that runs on a node, shipped with every run.

Standard library only (``tests/unit/agent/test_agent_stdlib.py`` holds it to that),
because a node has nothing of ddp-orch installed: ``wire/bootstrap.py`` sends
this package, sub-packages included, over the node's exec channel and
imports it from memory. The controller imports ``wire.protocol``,
``gangrule`` and ``stackgroups`` from here too, so framing, message checks,
the gang's stop rule and the grouping of stacks exist once.

* ``wire/``      the protocol (control words, events, framing), the bootstrap,
                 the request loop, checked and atomic file transfer
* ``node/``      one node's run: the typed supervisor spec, the supervisor of
                 torchrun and its teardown, the guardian, the run's processes,
                 failures, logs, probes, routes, setup, outputs, stacks, a
                 node a scheduler started (``jobnode``) and its job file
                 (``jobfile``)
* ``kept/``      a run its nodes keep: the keeper daemon and its spec, what
                 every keeper does, node 0's role (the head) and the others' (members),
                 the attempts' record, the gang's links, restarts, checked
                 records
* ``worker/``    the shim every rank runs in
* ``gangrule``   when a gang must stop (pure; the controller's gang and the
                 keepers' head both ask it)
* ``stackgroups`` where each rank's stack stands, and the odd one out
* ``layout``     every file name a node keeps
"""
