"""``plan/torchrun.py``: a node's whole torchrun command, word by word."""

from __future__ import annotations

import textwrap

from orchestrator.config.loader import load_cluster_text
from orchestrator.plan.build import build_plan
from orchestrator.plan.torchrun import torchrun_argv


def test_the_torchrun_command_of_a_node_word_by_word():
    spec = load_cluster_text(textwrap.dedent("""\
        nodes:
          - {host: a, gpus: [0, 1]}
          - {host: b, gpus: [2, 3, 5], python: /opt/py/bin/python}
        workload: {name: linear}
        """), source="c.yaml")
    plan = build_plan(spec, run_id="r9", local_run_dir="/l")
    argv = torchrun_argv(plan, plan.nodes[1])
    head = ("/opt/py/bin/python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
            "--nproc-per-node", "3", "--master-addr", "a", "--master-port", "auto",
            "--rdzv-backend", "static", "--rdzv-id", "r9", "--max-restarts", "0",
            "--log-dir", "~/.ddp-orch/runs/r9/node-1/torchrun", "--redirects", "3",
            "-m", "ddp_orch_shim", "-m", "workloads.linear")
    assert argv[:len(head)] == head
