"""What runs inside every rank: the worker shim (``shim``, shipped in the
bundle as ``code/ddp_orch_shim.py``)."""
