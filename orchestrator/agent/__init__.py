"""The node agent: everything that runs on a node, shipped with every run.

Every module is standard library only (``tests/unit/agent/test_agent_stdlib.py``
holds it to that), because a node has nothing of ddp-orch installed:
``wire/bootstrap.py`` sends this package over the node's exec channel and
imports it from memory. The controller imports ``wire.protocol``,
``gangrule`` and ``stackgroups`` from here too, so framing, message checks,
the gang's stop rule and the grouping of stacks exist once.

Sub-packages: ``wire/`` the protocol and transfers, ``node/`` one node's
run, ``kept/`` a run its nodes keep, ``worker/`` the shim every rank runs in.
"""
