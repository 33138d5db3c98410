"""ddp-orch: launch PyTorch DDP jobs with torchrun on a few machines.

The controller side (this package) never imports torch, so it starts fast
and runs on a laptop without it; torch is needed only on the nodes.
"""

__version__ = "0.1.0"
