"""collective: a tiny all-reduce between every pair of nodes, then across the
whole gang; the smoke test ``ddp-orch check --collective`` and ``up
--preflight collective`` run before anything is trained.

Each pair of nodes is tried on a process group of its own: the first rank of
each node, on the rendezvous store torchrun already holds (never the gang's
group, whose first collective would wait for every pair at once), so a pair
that cannot connect fails alone and is named, within ``--bound`` seconds.
Every pair of a node is tried at once (one thread each: built one after the
other, two pairs could wait for each other). Then, if every pair passed, the
whole gang's group on the run's real layout (every rank, every GPU): one
all-reduce, as training's first. Each is timed, and on NCCL the transport
it chose is read from its own ``NCCL_DEBUG=INFO`` lines (``NCCL_DEBUG_FILE``):
``NET/IB``, ``NET/Socket``, ``P2P``, ``SHM``.

Rank 0 waits for every answer until ``--bound`` has passed, writes what it
has (a pair with no answer hangs: named as such), and every rank then ends
at once: a collective that hangs in a thread must not hold the process.
The pure parts (``transports``, ``bus_bandwidth``) import no torch.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import socket
import threading
import time
from typing import Any, Iterable

PREFIX = "ddp-orch-collective/"
# An NCCL INFO line naming a connection's transport, as NCCL prints them:
# "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read", "... [send] via NET/Socket/0",
# "... via NET/IB/0/GDRDMA", "... via SHM/direct/direct", and NCCL 2.4's
# "Ring 00 : 2[3d000] -> 3[3e000] via direct shared memory".
_VIA = re.compile(r"(?:Channel|Ring) \d+(?:/\d+)? : .* via (?P<via>\S+(?: shared memory| pointer)?)")
_NETWORK = re.compile(r"Using network (?P<net>\w+)|Initialized NET plugin (?P<plugin>\w+)")


def transports(lines: Iterable[str]) -> list[str]:
    """The transports NCCL says it chose, each once, in a user's words:
    ``IB`` or ``socket`` (or a plugin's name) between nodes, ``P2P`` and
    ``SHM`` within one."""
    out: dict[str, None] = {}
    for line in lines:
        found = _VIA.search(line)
        if not found:
            continue
        via = found.group("via")
        if via.startswith("NET/"):
            kind = via.split("/")[1]
            out["socket" if kind == "Socket" else kind] = None
        elif via.startswith("P2P") or via == "direct pointer":
            out["P2P"] = None
        elif via.startswith("SHM") or via == "direct shared memory":
            out["SHM"] = None
        else:
            out[via.split("/")[0]] = None
    return list(out)


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: what each link
    carries, ``nbytes / seconds * 2 (n - 1) / n``; None when unmeasured."""
    if seconds <= 0 or ranks < 2:
        return None
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def main(argv: list[str] | None = None) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from workloads.contract import write_json_atomic
    from workloads.harness.job import start

    job = start("collective", argv)
    ctx, args = job.ctx, job.args
    bound = float(args.bound)
    nbytes = int(args.megabytes * (1 << 20)) // 4 * 4
    launched = ctx.launched
    if launched:
        store = dist.PrefixStore(PREFIX, dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=datetime.timedelta(seconds=bound * 3 + 30)))
    else:
        store = dist.HashStore()
    store.set(f"rank/{ctx.rank}", json.dumps({"node": ctx.node_rank, "host": ctx.hostname}))
    places = {r: json.loads(store.get(f"rank/{r}")) for r in range(ctx.world_size)}
    nodes: dict[int, list[int]] = {}
    for rank, place in sorted(places.items()):
        nodes.setdefault(place["node"], []).append(rank)
    leaders = {node: ranks[0] for node, ranks in nodes.items()}
    pairs = list(itertools.combinations(sorted(nodes), 2))
    device = ctx.torch_device()

    def group(name: str, rank: int, size: int, timeout_s: float):
        """A process group of its own on the run's store (its own prefix)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        pair_store = dist.PrefixStore(name + "/", store)
        if ctx.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            options.is_high_priority_stream = False
            return dist.ProcessGroupNCCL(pair_store, rank, size, options)
        return dist.ProcessGroupGloo(pair_store, rank, size, timeout=timeout)

    def reduce(pg, size: int) -> float:
        """One small all-reduce (the connections), then a timed one of nbytes."""
        for elements in (1, nbytes // 4):
            x = torch.ones(max(elements, 1), device=device)
            t0 = time.perf_counter()
            pg.allreduce([x]).wait()
            if ctx.is_cuda:
                torch.cuda.synchronize(device)
            took = time.perf_counter() - t0
            if float(x[0]) != size:
                raise RuntimeError(f"all_reduce of ones gave {float(x[0])}, expected {size}")
        return took

    def try_pair(a: int, b: int) -> None:
        name = f"pair/{a}-{b}"
        try:
            t0 = time.perf_counter()
            pg = group(name, 0 if ctx.node_rank == a else 1, 2, bound)
            took = reduce(pg, 2)
            said = {"ok": True, "seconds": time.perf_counter() - t0,
                    "busbw_gbps": bus_bandwidth(nbytes, took, 2)}
        except Exception as exc:  # noqa: BLE001 (the pair's own failure is its answer)
            said = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        store.set(f"{name}/said/{ctx.rank}", json.dumps(said))

    if ctx.rank == leaders.get(ctx.node_rank):
        for a, b in pairs:
            if ctx.node_rank in (a, b):
                threading.Thread(target=try_pair, args=(a, b), daemon=True).start()

    deadline = time.monotonic() + bound + 5
    result: dict[str, Any] = {}
    if ctx.rank == 0:
        result = {"workload": "collective", "backend": ctx.backend, "device": ctx.device,
                  "world_size": ctx.world_size, "bound_s": bound, "bytes": nbytes,
                  "nodes": [{"node": node, "host": places[ranks[0]]["host"], "ranks": ranks}
                            for node, ranks in sorted(nodes.items())],
                  "pairs": [], "config": dict(vars(args))}
        for a, b in pairs:
            keys = [f"pair/{a}-{b}/said/{leaders[n]}" for n in (a, b)]
            said = [_wait_key(store, key, deadline) for key in keys]
            entry: dict[str, Any] = {"nodes": [a, b], "ranks": [leaders[a], leaders[b]]}
            if any(s is None for s in said):
                silent = [n for n, s in zip((a, b), said) if s is None]
                entry.update(ok=False, hang=True,
                             error=f"no answer within {bound:g}s from node "
                                   f"{' and '.join(map(str, silent))}")
            else:
                failed = next((s for s in said if not s["ok"]), None)
                entry.update(ok=failed is None, error=failed and failed["error"],
                             seconds=max(s.get("seconds") or 0 for s in said),
                             busbw_gbps=min((s.get("busbw_gbps") or 0 for s in said),
                                            default=None))
            result["pairs"].append(entry)
        go = all(p["ok"] for p in result["pairs"])
        store.set("gang/go", "1" if go else "0")
    elif _wait_key(store, "gang/go", deadline + 5) is None:
        os._exit(0)  # rank 0 went away: its result is the run's

    if store.get("gang/go") == b"1":
        gang_store = dist.PrefixStore("gang/", store)
        gang: dict[str, Any]
        try:
            t0 = time.perf_counter()
            dist.init_process_group(ctx.backend, store=gang_store, rank=ctx.rank,
                                    world_size=ctx.world_size,
                                    timeout=datetime.timedelta(seconds=bound))
            took = reduce(dist.distributed_c10d._get_default_group(), ctx.world_size)
            gang = {"ok": True, "seconds": time.perf_counter() - t0,
                    "busbw_gbps": bus_bandwidth(nbytes, took, ctx.world_size)}
        except Exception as exc:  # noqa: BLE001
            gang = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        gang["transports"] = _my_transports()
        store.set(f"gang/said/{ctx.rank}", json.dumps(gang))
    if ctx.rank == 0:
        result["pair_transports"] = _my_transports()
        if store.get("gang/go") == b"1":
            said = {r: _wait_key(store, f"gang/said/{r}", time.monotonic() + bound + 5)
                    for r in range(ctx.world_size)}
            silent = [r for r, s in said.items() if s is None]
            failed = next((s for s in said.values() if s and not s["ok"]), None)
            result["gang"] = {
                "ok": not silent and failed is None,
                "error": (failed or {}).get("error") or (
                    f"no answer within {bound:g}s from rank(s) "
                    f"{', '.join(map(str, silent))}" if silent else None),
                "hang": bool(silent),
                "seconds": max((s.get("seconds") or 0 for s in said.values() if s), default=None),
                "busbw_gbps": min((s.get("busbw_gbps") or 0 for s in said.values()
                                   if s and s.get("busbw_gbps")), default=None),
                "transports": sorted({t for s in said.values() if s
                                      for t in s.get("transports") or ()})}
        else:
            result["gang"] = {"ok": None, "error": "not tried: a pair of nodes failed, and the "
                                                   "whole gang's all-reduce would wait on it"}
        path = args.result_file or ctx.result_file
        if path:
            write_json_atomic(path, result)
        job.log("collective " + json.dumps({"pairs": result["pairs"], "gang": result["gang"]},
                                           sort_keys=True))
    # A collective that hangs holds its thread inside the library: end here, as
    # the answers are in; torchrun's exit code is this rank's.
    os._exit(0)


def _wait_key(store, key: str, deadline: float) -> dict | bool | None:
    """The JSON under ``key`` once set, None if it is not by ``deadline``."""
    while True:
        if store.check([key]):
            return json.loads(store.get(key))
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _my_transports() -> list[str]:
    """What NCCL chose in this process, from its debug file (``NCCL_DEBUG_FILE``:
    ``nccl-debug.%h.%p``, this host and pid)."""
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    if not pattern:
        return []
    path = pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
    lines: list[str] = []
    for name in glob.glob(path):
        try:
            with open(name, encoding="utf-8", errors="replace") as fh:
                lines += fh.readlines()
        except OSError:
            continue
    return transports(lines)


if __name__ == "__main__":
    main()
