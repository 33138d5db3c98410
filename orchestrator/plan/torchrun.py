"""The torchrun command line, built from plan facts in this one place.

Whoever needs the port, the run directory or the process count reads the
plan, not the argv. One reader edits it: a kept run's keeper swaps the
values of ``--master-port`` and ``--log-dir`` for each restart
(``keeper.attempt_spec``), by flag, before ``-m ddp_orch_shim``.
"""

from __future__ import annotations

from ..agent.layout import SHIM_MODULE
from .model import NodePlan, RunPlan

TORCHRUN = ("-m", "torch.distributed.run")
# Every rank runs the user's program through the worker shim (agent/worker/shim.py,
# shipped in the bundle as code/ddp_orch_shim.py): error files and stack dumps.
SHIM = SHIM_MODULE
# A node's process count before its agent has chosen ``gpus: all`` or ``free``.
NPROC_AT_LAUNCH = "<chosen at launch>"


def torchrun_argv(plan: RunPlan, node: NodePlan) -> tuple[str, ...]:
    """``python -m torch.distributed.run ...`` for ``node``, static rendezvous.

    Each node passes its own ``--node-rank`` and ``--nproc-per-node``, which
    is what makes heterogeneous layouts (3 + 4) number their ranks as prefix
    sums. Workers write to files (``--redirects 3``), which the node agent
    follows and relays as whole, rank-prefixed lines. Each worker runs the
    user's program through the shim (``SHIM``), transparently, in the node's
    code root (torchrun's working directory: ``node.code_root``), so the
    program's words are the user's own (``train.py``, ``-m pkg.train``);
    every path of ddp-orch's own here is absolute. A process count only
    the launch knows is said so (``NPROC_AT_LAUNCH``), never a 0.
    """
    return (node.python, *TORCHRUN,
            "--nnodes", str(len(plan.nodes)), "--node-rank", str(node.node_rank),
            "--nproc-per-node", str(node.nproc) if node.nproc_known else NPROC_AT_LAUNCH,
            "--master-addr", plan.master_addr, "--master-port", str(plan.master_port),
            "--rdzv-backend", "static", "--rdzv-id", plan.run_id, "--max-restarts", "0",
            "--log-dir", f"{node.run_dir}/torchrun", "--redirects", "3",
            "-m", SHIM, *plan.entrypoint.argv())
