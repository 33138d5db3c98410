"""The torchrun command line, built from plan facts in this one place: read the
plan, not the argv. Only a kept run's keeper edits it, swapping ``--master-port``
and ``--log-dir`` by flag for each restart (``keeper.attempt_spec``)."""

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
    Per-node ``--node-rank`` and ``--nproc-per-node`` make a mixed layout
    (3 + 4) number ranks as prefix sums. The program runs through ``SHIM`` in
    ``node.code_root``, so its words are the user's own; ours are absolute."""
    return (node.python, *TORCHRUN,
            "--nnodes", str(len(plan.nodes)), "--node-rank", str(node.node_rank),
            "--nproc-per-node", str(node.nproc) if node.nproc_known else NPROC_AT_LAUNCH,
            "--master-addr", plan.master_addr, "--master-port", str(plan.master_port),
            "--rdzv-backend", "static", "--rdzv-id", plan.run_id, "--max-restarts", "0",
            "--log-dir", f"{node.run_dir}/torchrun", "--redirects", "3",
            "-m", SHIM, *plan.entrypoint.argv())
