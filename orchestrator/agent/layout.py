"""Every file ddp-orch keeps in a node's run directory, named once.

The supervisor, its guardian, a kept run's keeper and follower, a Slurm
job's agents and the controller all read what the others write; each
name here is the one they agree on. A node's run directory holds:

* ``SUPERVISOR_STATE``: the supervisor's pids, exit code and teardown record;
* ``GUARDIAN_RECORD``: the guardian's teardown, had it to do one;
* ``KEEPER_STATE``: a kept run's keeper: its pid, state and every attempt;
* ``FOLLOWER_LOCK``: held (shared) by every attached follower of a kept run;
* ``STREAM``: the node's output and control lines, where nobody holds a
  channel to it (a kept run, a Slurm job);
* ``BUNDLE``: the run's code, unpacked in place, with the worker shim as
  ``SHIM_MODULE`` in its ``code/``;
* ``TORCHRUN_LOGS`` (``attempt_logs``): torchrun's --log-dir, one per attempt;
* ``PROGRESS_DIR``: each rank's last step (``rank-N``), for heartbeats
  (the step report ``worker/progress.py`` keeps its own copy of this name);
* ``STACKS_DIR``: each rank's stack dump (the worker shim keeps its own copy
  of this name: it runs in the workers, without the agent package).

A Slurm job's directory, shared by its nodes, also holds ``RENDEZVOUS``
(node 0's address and port) and one ``SETUP_DONE_PREFIX`` + rank file per
node whose ``setup:`` is done.

Beside the runs, in the runs directory that holds them, ``SETUP_STAMPS``
keeps each host's stamp of its last successful ``setup:`` with
``when_changed`` (``node/setupstamp.py``): it outlives every run.

Stdlib only, like the rest of the agent package (it imports nothing).
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
    """torchrun's --log-dir for one attempt of a kept run (the first: the
    run's own), under the node's run directory: every attempt's is kept."""
    return TORCHRUN_LOGS if attempt == 0 else f"{TORCHRUN_LOGS}.attempt-{attempt}"
