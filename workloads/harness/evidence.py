"""Evidence that the job ran as intended, gathered from every rank.

* the rank table: what each process saw (rank, local rank, node, host,
  CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, device, and on CUDA the model
  and UUID of its GPU as the worker itself sees it, in nvidia-smi's form) --
  proves placement, not just the count;
* parameter checksums: DDP's promise is that all replicas hold identical
  parameters after every step. Each rank hashes its own parameters
  independently (sha256 of the float64 bytes, names included) and the
  hashes are compared for exact equality. Nothing is synchronised before
  hashing, so a divergence would show.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import nn

from workloads.harness.context import DistContext, gpu_identity


def rank_row(ctx: DistContext) -> dict:
    """This process's line of the rank table (gpu_name/gpu_uuid null on CPU)."""
    name, uuid = gpu_identity(ctx.torch_device()) if ctx.is_cuda else (None, None)
    return {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "hostname": ctx.hostname,
        "pid": os.getpid(),
        "cuda_visible_devices": ctx.cuda_visible_devices,
        "cuda_device_order": ctx.cuda_device_order,
        "device": ctx.device,
        "gpu_name": name,
        "gpu_uuid": uuid,
    }


def param_checksum(model: nn.Module) -> str:
    """sha256 over the names and float64 values of ``model``'s parameters.

    The bytes are read straight from the CPU tensor's memory, not through
    ``.numpy()``: a node with torch alone (no numpy) runs every built-in
    workload, as the README promises."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(tensor_bytes(p.detach().to("cpu", torch.float64).contiguous()))
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a contiguous CPU tensor (what ``.numpy().tobytes()``
    gives), without numpy."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("tensor_bytes needs a contiguous CPU tensor")
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""


def broadcast_buffers(model: nn.Module) -> None:
    """Make every rank hold rank 0's buffers (e.g. BatchNorm running stats).

    DDP broadcasts buffers from rank 0 at the start of each forward, so after
    the last step each rank's running stats reflect its own last batch. Rank 0's
    are the ones a checkpoint keeps; copying them everywhere keeps evaluation
    identical on all ranks. Parameters are never touched here.
    """
    for buf in model.buffers():
        dist.broadcast(buf, src=0)


def gather(ctx: DistContext, final_checksum: str, init_checksum: str | None = None,
           step_stats: dict | None = None) -> dict:
    """All-gather the rank table and checksums; identical on every rank.

    ``final_checksum`` is normally ``param_checksum`` of the trained model
    (noop hashes its all_reduce result instead). Every rank must call this:
    it is a collective.
    """
    mine = {"row": rank_row(ctx), "init": init_checksum, "final": final_checksum,
            "steps": step_stats}
    everyone = all_gather_json(ctx, mine)
    finals = [e["final"] for e in everyone]
    inits = [e["init"] for e in everyone]
    stragglers = straggler_report(everyone) if step_stats is not None else {}
    return {
        **stragglers,
        "rank_table": sorted((e["row"] for e in everyone), key=lambda r: r["rank"]),
        "checksum": finals[0],
        "checksums": finals,
        "replicas_identical": len(set(finals)) == 1,
        "init_checksums": inits,
        "init_replicas_identical": len(set(inits)) == 1,
    }


def all_gather_json(ctx: DistContext, value) -> list:
    """Every rank's ``value`` (JSON-able), in rank order; a collective.

    ``dist.all_gather_object`` would do, but it goes through numpy, which a
    node with torch alone lacks: the JSON bytes travel as a uint8 tensor
    (``torch.frombuffer``), padded to the longest, and come back through
    ``tensor_bytes``."""
    data = json.dumps(value, separators=(",", ":")).encode()
    device = ctx.torch_device()
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    if data:
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    mine = mine.to(device)
    gathered = [torch.zeros(longest, dtype=torch.uint8, device=device)
                for _ in range(ctx.world_size)]
    dist.all_gather(gathered, mine)
    return [json.loads(tensor_bytes(t.cpu().contiguous())[:int(n.item())])
            for t, n in zip(gathered, sizes)]


def broadcast_bytes(ctx: DistContext, data: bytes) -> bytes:
    """Rank 0's ``data`` on every rank (the others pass anything); a collective.

    ``dist.broadcast_object_list`` would do, but it goes through numpy (see
    ``all_gather_json``): the length goes first, then the bytes as a uint8
    tensor, on the backend's device (CUDA for NCCL, CPU for gloo)."""
    device = ctx.torch_device()
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    length = int(size.item())
    if length == 0:
        return b""
    buf = torch.empty(length, dtype=torch.uint8, device=device)
    if ctx.is_rank0:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=0)
    return data if ctx.is_rank0 else tensor_bytes(buf.cpu().contiguous())


def broadcast_json(ctx: DistContext, value):
    """Rank 0's JSON-able ``value`` on every rank; a collective."""
    return json.loads(broadcast_bytes(ctx, json.dumps(value).encode()))


def straggler_report(everyone: list[dict]) -> dict:
    """Each rank's step time (mean, p50, p95; and its means outside
    collectives, forward pass and wait for data, where its steps gave them)
    and the rank with the longest mean step, by node and host, against the
    median rank's mean. Raw facts: the summary names the rank that held the
    gang back from ``rank_step_times`` by the rule ``top`` uses
    (``orchestrator/report/pace.py``)."""
    rows = sorted(({"rank": e["row"]["rank"], "node_rank": e["row"]["node_rank"],
                    "host": e["row"]["hostname"], **e["steps"]} for e in everyone),
                  key=lambda r: r["rank"])
    means = sorted(r["mean_s"] for r in rows)
    median = means[len(means) // 2]
    slowest = max(rows, key=lambda r: r["mean_s"])
    return {"rank_step_times": rows,
            "slowest_rank": {"rank": slowest["rank"], "node_rank": slowest["node_rank"],
                             "host": slowest["host"], "mean_s": slowest["mean_s"],
                             "vs_median": slowest["mean_s"] / median if median > 0 else 1.0}}
