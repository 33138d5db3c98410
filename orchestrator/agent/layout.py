"""Every file ddp-orch keeps in a node's run directory, named once.

A run's processes and the controller read what the others write; each name
here is the one they agree on. The worker shim and ``worker/progress.py``
keep their own copies of ``STACKS_DIR`` and ``PROGRESS_DIR``: they run in
the workers, without the agent package.
"""

SUPERVISOR_STATE = "supervisor.json"
GUARDIAN_RECORD = "guardian.json"
KEEPER_STATE = "keeper.json"
FOLLOWER_LOCK = "follower.lock"
STREAM = "agent.out"
BUNDLE = "bundle.tar.gz"
SHIM_MODULE = "ddp_orch_shim"  # the worker shim, as the bundle ships it (code/ddp_orch_shim.py)
TORCHRUN_LOGS = "torchrun"
PROGRESS_DIR = "progress"
STACKS_DIR = "stacks"
RENDEZVOUS = "rendezvous.json"
SETUP_DONE_PREFIX = "setup-done-node-"  # + node rank
# Who asks the keeper to stop, and why, written before the SIGTERM that asks
# (``mailbox.signal_keeper``): a signal does not say who sent it.
STOP_REQUEST = "stop.request"
SETUP_STAMPS = ".setup-stamps"  # in the runs directory: one stamp per host and python


def attempt_logs(attempt: int) -> str:
    """torchrun's --log-dir for one attempt of a kept run: each keeps its own."""
    return TORCHRUN_LOGS if attempt == 0 else f"{TORCHRUN_LOGS}.attempt-{attempt}"
