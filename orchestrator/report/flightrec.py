"""What a hung run's flight recorder dumps say: which rank missed which collective.
A dump is torch's pickle, from a node: it is read by an unpickler that builds plain
data only, under a size cap."""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, Mapping

from ..agent.stackgroups import rank_span

MAX_DUMP_BYTES = 64 << 20  # engine/results.MAX_FLIGHT_RECORD_BYTES: what comes home
TRACE_DIR = "nccl_trace"


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data only: torch's writer names no class; a dump that does is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names {module}.{name}")


def read_dump(data: bytes) -> dict | None:
    """A flight recorder dump, or None where it is not one that can be read."""
    if len(data) > MAX_DUMP_BYTES:
        return None
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 (a truncated or foreign file is just unreadable)
        return None
    return dump if isinstance(dump, dict) and isinstance(dump.get("entries"), list) else None


def read_run(run_path: str) -> dict[int, dict | None]:
    """{global rank: its dump (None: unreadable)} of every dump brought home."""
    out: dict[int, dict | None] = {}
    root = os.path.join(run_path, TRACE_DIR)
    try:
        nodes = sorted(os.listdir(root))
    except OSError:
        return out
    for node in nodes:
        try:
            names = sorted(os.listdir(os.path.join(root, node)))
        except OSError:
            continue
        for name in names:
            rank = name[len("rank-"):] if name.startswith("rank-") else ""
            if not rank.isdigit():
                continue
            path = os.path.join(root, node, name)
            try:
                with open(path, "rb") as fh:
                    out[int(rank)] = read_dump(fh.read(MAX_DUMP_BYTES + 1))
            except OSError:
                out[int(rank)] = None
    return out


def _groups(dump: dict) -> dict[str, dict]:
    """{process group id: {"name", "last", "completed", "names": {seq: collective}}}
    of a dump's entries; its pg_status, where torch wrote one, wins."""
    groups: dict[str, dict] = {}
    for entry in dump.get("entries") or ():
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int) or isinstance(seq, bool):
            continue
        pg = str(entry.get("pg_id"))
        group = groups.setdefault(pg, {"name": _pg_name(entry), "last": 0, "completed": 0,
                                       "names": {}})
        group["last"] = max(group["last"], seq)
        group["names"][seq] = str(entry.get("profiling_name") or "?")
        if entry.get("state") == "completed":
            group["completed"] = max(group["completed"], seq)
    status = dump.get("pg_status")
    for pg, said in (status.items() if isinstance(status, dict) else ()):
        last = said.get("last_enqueued_collective") if isinstance(said, dict) else None
        if isinstance(last, int) and str(pg) in groups:
            groups[str(pg)]["last"] = last
        done = said.get("last_completed_collective") if isinstance(said, dict) else None
        if isinstance(done, int) and str(pg) in groups:
            groups[str(pg)]["completed"] = max(groups[str(pg)]["completed"], done)
    return groups


def _pg_name(entry: dict) -> str:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and len(group) == 2 and group[1]:
        return f"{group[0]} ({group[1]})"
    return str(entry.get("pg_id"))


def missing_collective(dumps: Mapping[int, dict | None], world_size: int | None = None
                       ) -> list[str]:
    """One line per finding: ranks that never issued a process group's next collective,
    a collective every rank issued and none completed, and ranks with no dump."""
    lines: list[str] = []
    readable = {rank: dump for rank, dump in dumps.items() if dump is not None}
    groups = {rank: _groups(dump) for rank, dump in readable.items()}
    for pg in sorted({pg for found in groups.values() for pg in found}):
        seen = {rank: found[pg] for rank, found in groups.items() if pg in found}
        ahead = max(group["last"] for group in seen.values())
        behind = sorted(rank for rank, group in seen.items() if group["last"] < ahead)
        name = next(group["name"] for group in seen.values())
        if behind:
            nxt = min(seen[rank]["last"] for rank in behind) + 1
            what = next((group["names"][nxt] for group in seen.values() if nxt in group["names"]),
                        "?")
            issued = sorted(rank for rank, group in seen.items() if group["last"] >= nxt)
            lines.append(f"{rank_span(behind)} never issued collective #{nxt} ({what}) of "
                         f"process group {name}, which {rank_span(issued)} issued")
        elif all(group["completed"] < ahead for group in seen.values()):
            what = next((group["names"].get(ahead) for group in seen.values()
                         if ahead in group["names"]), "?")
            lines.append(f"collective #{ahead} ({what}) of process group {name} was issued by "
                         f"every rank that dumped and completed on none: it hangs inside the "
                         f"collective (the network between the nodes, or P2P within one)")
    expected = set(range(world_size)) if world_size else set(dumps)
    silent = sorted(expected - set(readable))
    if silent and readable:
        lines.append(f"{rank_span(silent)} left no readable dump (gone, or never in a "
                     "process group)")
    return lines
