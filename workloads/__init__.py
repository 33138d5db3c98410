"""Training programs that ddp-orch launches under torchrun.

This package's ``__init__``, ``catalog`` and ``contract`` modules are
stdlib-only (the controller imports them); the workload modules themselves
import torch and run on the nodes, on top of the shared ``harness``
package. ``make_tiny_datasets`` (numpy only) writes a tiny MNIST/CIFAR-10 in
the genuine on-disk formats for smoke tests of the real-data path.
"""
