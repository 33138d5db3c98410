"""The node agent: everything that runs on a node, shipped with every run.

Standard library only (``tests/unit/agent/test_agent_stdlib.py`` holds it to that),
because a node has nothing of ddp-orch installed: ``bootstrap.py`` sends
this package over the node's exec channel and imports it from memory.
The controller imports ``protocol`` from here too, so framing and message
checks exist once.

* ``protocol``   the wire: control lines, requests, line framing
* ``bootstrap``  the few lines that receive the package on a node
* ``serve``      the request loop (files, probes, down), then the supervisor
* ``supervisor`` runs torchrun and owns the teardown of everything it starts
* ``procs``      the run's processes through /proc; signalling and reaping
* ``workerlogs`` torchrun's per-rank log files, followed as whole lines
* ``files``      checked, atomic file transfer
* ``probes``     ports, Python/torch/GPUs, reaching the master
"""
