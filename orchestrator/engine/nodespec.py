"""What a node's supervisor runs: the dry-run's env and argv, verbatim, as
the ``SupervisorSpec`` the agent checks on arrival. Apart from the live
``NodeHandle`` so that a scheduler writes its job files without loading
what follows a run."""

from __future__ import annotations

from ..agent import layout
from ..agent.node.spec import SupervisorSpec
from ..agent.wire.owner import Owner
from ..agent.wire.protocol import HEARTBEAT_S
from ..plan.build import setup_path_first
from ..plan.dryrun import NodeLaunch
from ..plan.secrets import secret_values

BUNDLE_NAME = layout.BUNDLE  # in each node's run directory


def supervisor_spec(launch: NodeLaunch, run_id: str, master_port: int,
                    grace_s: float, owner: Owner = Owner()) -> SupervisorSpec:
    """What the node supervisor runs: the dry-run's env and argv, verbatim."""
    node = launch.node
    return SupervisorSpec(
        run_id=run_id, node_rank=node.node_rank, run_dir=node.run_dir,
        cwd=node.code_root,  # torchrun's and so every worker's working directory
        first_rank=node.first_rank, nproc=node.nproc, master_port=master_port,
        argv=tuple(launch.argv), env=dict(launch.env), unset_env=tuple(launch.unset_env),
        bundle=BUNDLE_NAME, grace_s=grace_s, heartbeat_s=HEARTBEAT_S,
        secrets=tuple(value.decode() for value in secret_values(launch.env)),
        setup={"commands": [list(argv) for argv in launch.setup], "cwd": node.code_root,
               "timeout_s": launch.setup_timeout_s, "path_first": setup_path_first(node.python),
               **({"when_changed": {"paths": list(launch.setup_when_changed),
                                    "env": [k for k in node.user_env if k in launch.env]}}
                  if launch.setup_when_changed else {})}
        if launch.setup else None,
        owner=owner)
