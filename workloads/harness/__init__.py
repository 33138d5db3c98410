"""Shared machinery for the built-in workloads (imports torch).

Every workload follows the same shape (nanoGPT's train.py is the model):
read the distributed context from the environment once
(``context.read_context``), open the process group around the work
(``context.process_group``), build data and model, train with
``train.Trainer``, then gather correctness evidence and write the result
(``report.finish``). The pieces are small modules so that a workload file
shows only what is particular to its experiment:

* ``context``  -- who am I (rank, node, device, backend), process group life
* ``data``     -- batch splitting, lr scaling, samplers, per-rank seeding
* ``datasets`` -- MNIST/CIFAR-10 from disk (torchvision's readers), or
  synthetic stand-ins, shipped as stored uint8; the device-side pipeline
* ``speed``    -- the GPU's speed-ups (amp, TF32, channels_last, cuDNN's
  benchmark) and the tutorials' own settings
* ``timing``   -- per-step data/compute/all-reduce clocks that never wait
  for the device, capped series
* ``train``    -- the training loop, the step function, distributed eval
* ``evidence`` -- rank table and parameter checksums gathered from all ranks
* ``report``   -- rank-0 logging and the result JSON (``workloads.contract``)

Nothing here is imported by the controller; ``workloads/__init__``,
``catalog`` and ``contract`` stay torch-free.
"""
