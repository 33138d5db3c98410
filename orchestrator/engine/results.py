"""What a finished run brings home, for every backend, after a success and a
failure alike. A backend moves the bytes; what lands in the run directory
has the node's secrets masked, and a path a node names must stay inside its
run directory."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import OrchestratorError
from ..plan.dryrun import DryRun
from ..plan.model import NodePlan
from ..plan.secrets import scrub, secret_values
from ..records.outcome import NodeState, RunOutcome
from ..records.rundir import OUTPUTS_DIR, OUTPUTS_RECORD, RunDir

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
            source = inside(node.run_dir, failure.error_file)
            local_rank = failure.local_rank
            if source and 0 <= local_rank < node.nproc:
                rank = node.first_rank + local_rank
                wanted.setdefault(node.node_rank, []).append(WantedFile(
                    source, f"errors/node-{node.node_rank}/rank-{rank}.json",
                    MAX_ERROR_FILE_BYTES))
    return wanted


# The dump's path prefix, by the name torch >= 2.8 reads first, then the old one
# (``plan.build.flight_recorder_env`` sets both; a user may have set either).
FLIGHT_RECORDER_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def flight_recorder_files(node: NodePlan) -> list[WantedFile]:
    """The NCCL flight recorder's dumps a failed GPU node may have left, one per rank."""
    prefix = next((node.env[name] for name in FLIGHT_RECORDER_FILE_VARS if node.env.get(name)),
                  None)
    if not prefix:
        return []
    return [WantedFile(f"{prefix}{rank}", f"nccl_trace/node-{node.node_rank}/rank-{rank}",
                       MAX_FLIGHT_RECORD_BYTES) for rank in node.ranks]


def inside(directory: str, name: object) -> str | None:
    """``directory/name`` if it stays inside ``directory``, else None."""
    if not isinstance(name, str) or not name:
        return None
    path = posixpath.normpath(posixpath.join(directory, name))
    root = posixpath.normpath(directory)
    return path if path.startswith(root.rstrip("/") + "/") else None


def store_fetched(run: RunDir, info: DryRun, node_rank: int, wanted: WantedFile, data: bytes) -> None:
    """Write a fetched file into the run directory, the node's secrets masked."""
    data = scrub(data, secret_values(info.nodes[node_rank].env))
    path = run.file(wanted.local)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


# --- outputs: ----------------------------------------------------------------

MAX_OUTPUT_FILE_BYTES = 256 << 20  # one file of a run's ``outputs:``
MAX_OUTPUTS_BYTES = 1 << 30  # all of them together


def fetch_outputs(info: DryRun, run: RunDir, listing: Callable[..., dict],
                  get: Callable[[str, int], bytes | None]) -> dict | None:
    """Bring node 0's ``outputs:`` into ``<run dir>/outputs/``, recorded in
    ``outputs.json``. Nothing a node names is trusted: each path must be
    plain and relative, and lands below ``outputs/``, secrets masked."""
    plan = info.plan
    if not plan.outputs:
        return None
    node = plan.nodes[0]
    record: dict[str, Any] = {"dir": OUTPUTS_DIR, "patterns": list(plan.outputs),
                              "code_root": node.code_root, "files": [], "refused": [],
                              "unmatched": []}
    try:
        found = listing(root=node.code_root, patterns=list(plan.outputs),
                        max_file=MAX_OUTPUT_FILE_BYTES, max_total=MAX_OUTPUTS_BYTES)
        if not found.get("ok"):
            raise OSError(str(found.get("error") or "no answer"))
    except (OrchestratorError, OSError) as exc:
        record["error"] = f"cannot list them on node 0: {getattr(exc, 'message', None) or exc}"
        run.write_outputs(record)
        return record
    record["refused"] = [{"path": str(r.get("path"))[:300], "why": str(r.get("why"))[:300]}
                         for r in _list(found.get("refused")) if isinstance(r, dict)]
    if isinstance(found.get("refused_more"), int) and found["refused_more"] > 0:
        record["refused_more"] = found["refused_more"]
    record["unmatched"] = [str(p)[:300] for p in _list(found.get("unmatched"))]
    total = 0
    for entry in _list(found.get("files"))[:MAX_OUTPUT_FILES]:
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not _plain_relative(rel):
            record["refused"].append({"path": str(rel)[:300], "why": "not a plain relative path"})
            continue
        try:
            data = get(f"{node.code_root}/{rel}", MAX_OUTPUT_FILE_BYTES)
        except (OrchestratorError, OSError) as exc:
            record["refused"].append({"path": rel, "why": str(
                getattr(exc, "message", None) or exc)[:300]})
            continue
        if data is None:
            record["refused"].append({"path": rel, "why": "gone before it was fetched"})
            continue
        if total + len(data) > MAX_OUTPUTS_BYTES:
            record["refused"].append({"path": rel, "why": "over the total cap"})
            continue
        total += len(data)
        data = scrub(data, secret_values(info.nodes[0].env))
        path = os.path.join(run.file(OUTPUTS_DIR), *rel.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        record["files"].append({"path": rel, "size": len(data)})
    record["total"] = total
    run.write_outputs(record)
    return record


MAX_OUTPUT_FILES = 1000


def _plain_relative(rel: object) -> bool:
    """A relative posix path of plain names (no ``..``, backslash or control character)."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096:
        return False
    if any(ord(ch) < 32 for ch in rel) or "\\" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _list(value: object) -> list:
    return list(value) if isinstance(value, list) else []


def outputs_lines(record: object, run_path: str) -> list[str]:
    """What the summary, ``status`` and ``logs`` say of a run's outputs."""
    if not isinstance(record, dict):
        return []
    where = os.path.join(run_path, OUTPUTS_DIR)
    fetched = [f for f in _list(record.get("files")) if isinstance(f, dict)]
    size = sum(f.get("size", 0) for f in fetched if isinstance(f.get("size"), int))
    names = ", ".join(str(f.get("path")) for f in fetched[:5])
    more = f" and {len(fetched) - 5} more" if len(fetched) > 5 else ""
    out = [f"outputs: {len(fetched)} file(s), {_human(size)} in {where}/"
           + (f" ({names}{more})" if fetched else "")]
    if record.get("error"):
        out.append(f"  not fetched: {record['error']}")
    refused = [r for r in _list(record.get("refused")) if isinstance(r, dict)]
    for r in refused[:5]:
        out.append(f"  refused: {r.get('path')}: {r.get('why')}")
    left = len(refused) - 5 + int(record.get("refused_more") or 0)
    if left > 0:
        out.append(f"  refused: {left} more (see {os.path.join(run_path, OUTPUTS_RECORD)})")
    unmatched = _list(record.get("unmatched"))
    if unmatched:
        out.append("  no match on node 0: " + ", ".join(map(str, unmatched[:10])))
    return out


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    return f"{n} B"
