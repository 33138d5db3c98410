"""``OMP_NUM_THREADS`` for every rank: the node's cores shared among its ranks.

torchrun sets 1 for every rank of a node that runs several, and prints a
banner on every node saying so; a node with one rank gets torch's default,
every core. Neither is what a user of a shared box wants: the plan sets the
variable itself, the node's usable cores over its ranks (at least 1), as
Accelerate does, so each rank gets its share and torchrun has no reason to
speak. A user's own value (``env: {OMP_NUM_THREADS: ...}``) wins.

The cores are a launch-time fact, like the GPUs chosen: the plan holds
``AT_LAUNCH`` until the node's agent has said how many it has (its hello,
``usable_cores``), and the launch fills it in (``plan.build.resolve_plan``;
under a scheduler, the node itself, ``jobnode``). Pure apart from
``usable_cores``, and stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

import os
from typing import Mapping

OMP_VAR = "OMP_NUM_THREADS"
AT_LAUNCH = "<cores / ranks, at launch>"  # the plan's value until the node's cores are known
MAX_CORES = 1 << 16  # more than any node has: a count beyond it is not a node's


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity: what a container or a
    scheduler's task was given), as ``nproc`` counts them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def per_rank(cores: int, nproc: int) -> int:
    """Each of ``nproc`` ranks' share of ``cores`` (as a node said them: at
    most ``MAX_CORES``), at least one thread."""
    return max(1, min(cores, MAX_CORES) // max(1, nproc))


def resolve_threads(env: Mapping[str, str], cores: int | None, nproc: int) -> dict[str, str]:
    """``env`` with ``OMP_NUM_THREADS`` filled in where the plan left it to
    the launch (``AT_LAUNCH``) and the node's ``cores`` are known."""
    out = dict(env)
    if cores is not None and out.get(OMP_VAR) == AT_LAUNCH:
        out[OMP_VAR] = str(per_rank(cores, nproc))
    return out
