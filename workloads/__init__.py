"""Training programs that ddp-orch launches under torchrun.

This package's ``__init__``, ``catalog`` and ``contract`` modules are
stdlib-only (the controller imports them); the workload modules themselves
import torch and run on the nodes.
"""
