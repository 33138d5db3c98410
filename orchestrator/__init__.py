"""ddp-orch: launch PyTorch DDP jobs with torchrun on a few machines. The
controller (this package) never imports torch: it starts fast; only nodes need it."""

__version__ = "0.1.0"
