"""``OMP_NUM_THREADS`` for every rank: the node's cores shared among its ranks.

torchrun sets 1 where a node runs several ranks (with a banner saying so)
and leaves torch's default, every core, where it runs one: neither suits a
shared box. So the node's usable cores are shared over its ranks, as
Accelerate does; a user's own value wins.
"""

from __future__ import annotations

import os
from typing import Mapping

OMP_VAR = "OMP_NUM_THREADS"
AT_LAUNCH = "<cores / ranks, at launch>"  # the plan's value until the node's cores are known
MAX_CORES = 1 << 16  # more than any node has: a count beyond it is not a node's


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), as ``nproc`` counts them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def task_cores(allocated: str | None) -> int:
    """The cores a scheduler's task may use: its affinity, but no more than
    the CPUs the scheduler ``allocated`` to it. A site that does not bind
    tasks to their CPUs leaves every core in the affinity, and a rank that
    used them all would take CPUs the scheduler gave to other jobs."""
    cores = usable_cores()
    return min(cores, int(allocated)) if allocated and allocated.isdigit() \
        and int(allocated) > 0 else cores


def per_rank(cores: int, nproc: int) -> int:
    """Each of ``nproc`` ranks' share of ``cores`` (``MAX_CORES`` at most), at least 1."""
    return max(1, min(cores, MAX_CORES) // max(1, nproc))


def resolve_threads(env: Mapping[str, str], cores: int | None, nproc: int) -> dict[str, str]:
    """``env`` with ``AT_LAUNCH`` filled in, once the node's ``cores`` are known."""
    out = dict(env)
    if cores is not None and out.get(OMP_VAR) == AT_LAUNCH:
        out[OMP_VAR] = str(per_rank(cores, nproc))
    return out
