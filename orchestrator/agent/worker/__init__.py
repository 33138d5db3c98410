"""What runs inside every rank: the worker shim (``shim``, shipped in the
bundle as ``code/ddp_orch_shim.py``) and the step report a user's program
may call (``progress``, shipped as ``code/ddp_orch_progress.py``)."""
