"""What a finished run brings home, for every backend.

Rank 0's ``result.json``, the torchrun error files of failed ranks, and the
NCCL flight recorder's dumps of failed GPU nodes. ``wanted_files`` lists
them per node, each with its size cap; a backend moves the bytes (over the
agent's channel, or from the shared directory under Slurm) and ``keep``
writes them into the run directory with the node's secrets masked. An
error file named by a node's report must lie inside that node's run
directory (``inside``); a missing file is simply not there.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from ..plan.dryrun import DryRun
from ..plan.model import NodePlan
from ..plan.secrets import scrub, secret_values
from ..records.outcome import NodeState, RunOutcome
from ..records.rundir import RunDir

MAX_RESULT_BYTES = 16 << 20  # rank 0's result.json
MAX_ERROR_FILE_BYTES = 1 << 20  # one torchrun error file
MAX_FLIGHT_RECORD_BYTES = 64 << 20  # one rank's NCCL flight recorder dump


@dataclass(frozen=True)
class WantedFile:
    remote: str  # on the node
    local: str  # relative to the run directory
    limit: int  # bytes


def wanted_files(info: DryRun, outcome: RunOutcome) -> dict[int, list[WantedFile]]:
    """{node rank: files to bring home} for a run that has ended."""
    plan = info.plan
    wanted: dict[int, list[WantedFile]] = {
        0: [WantedFile(plan.nodes[0].result_file, "result.json", MAX_RESULT_BYTES)]}
    for node_outcome in outcome.nodes:
        node = plan.nodes[node_outcome.node_rank]
        if node_outcome.state is not NodeState.SUCCEEDED:
            wanted.setdefault(node.node_rank, []).extend(flight_recorder_files(node))
        for failure in node_outcome.failures:
            source = inside(node.run_dir, failure.get("error_file"))
            local_rank = failure.get("local_rank")
            if source and isinstance(local_rank, int) and 0 <= local_rank < node.nproc:
                rank = node.first_rank + local_rank
                wanted.setdefault(node.node_rank, []).append(WantedFile(
                    source, f"errors/node-{node.node_rank}/rank-{rank}.json",
                    MAX_ERROR_FILE_BYTES))
    return wanted


def flight_recorder_files(node: NodePlan) -> list[WantedFile]:
    """The NCCL flight recorder's dumps a failed GPU node may have left
    (``plan.build.flight_recorder_env``), one per rank."""
    prefix = node.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        return []
    return [WantedFile(f"{prefix}{rank}", f"nccl_trace/node-{node.node_rank}/rank-{rank}",
                       MAX_FLIGHT_RECORD_BYTES) for rank in node.ranks]


def inside(directory: str, name: object) -> str | None:
    """``directory/name`` if, as a path, it stays inside ``directory``; None
    for anything else a node's report might name (absolute paths, ``..``)."""
    if not isinstance(name, str) or not name:
        return None
    path = posixpath.normpath(posixpath.join(directory, name))
    root = posixpath.normpath(directory)
    return path if path.startswith(root.rstrip("/") + "/") else None


def keep(run: RunDir, info: DryRun, node_rank: int, wanted: WantedFile, data: bytes) -> None:
    """Write a fetched file into the run directory, the node's secrets masked."""
    data = scrub(data, secret_values(info.nodes[node_rank].env))
    path = run.file(wanted.local)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
