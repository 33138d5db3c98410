"""A run's GPUs as its recorded plan (``plan.json``) has them."""

from __future__ import annotations

from collections import Counter
from typing import Any


def node_gpus(planned: dict | None) -> dict[str, Any]:
    """A node's recorded GPUs: indices, the request that chose them, models and
    UUIDs (what a GPU monitor such as DCGM keys on); nulls where none."""
    planned = planned or {}
    gpus = planned.get("gpus")
    ok = isinstance(gpus, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                        for i in gpus)
    request = planned.get("gpu_request")
    return {"gpus": gpus if ok else None,
            "gpu_request": request if isinstance(request, str) else None,
            "gpu_models": _strings(planned.get("gpu_models")),
            "gpu_uuids": _strings(planned.get("gpu_uuids"))}


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def gpu_lines(plan: object) -> list[str]:
    """Each GPU node's GPUs as the launch recorded them. A CPU rehearsal's nodes
    are named only where GPUs were chosen or looked at: its indices are processes."""
    lines = []
    rehearsal = isinstance(plan, dict) and plan.get("device") == "cpu"
    for node in _nodes(plan):
        gpus = node_gpus(node)
        if gpus["gpus"] is None or (rehearsal and not gpus["gpu_request"]
                                    and not gpus["gpu_models"]):
            continue
        lines.append(f"  node {node.get('node_rank')} ({node.get('host')}): {_gpus_words(gpus)}")
    return lines


def rank_lines(plan: object) -> list[str]:
    """Which ranks went where, a line per node (rank i of a node on its i-th GPU), as
    ``up`` says once the nodes have chosen."""
    device = plan.get("device") if isinstance(plan, dict) else None
    lines = []
    for node in _nodes(plan):
        span = node.get("ranks")
        if not (isinstance(span, list) and len(span) == 2):
            continue
        ranks = f"rank {span[0]}" if span[0] == span[1] else f"ranks {span[0]}-{span[1]}"
        gpus = node_gpus(node)
        count = span[1] - span[0] + 1
        processes = f"{count} {'CPU ' if device == 'cpu' else ''}process{'es' * (count != 1)}"
        where = (processes + ("" if device == "cpu" else ", one per GPU the scheduler allocates")
                 if gpus["gpus"] is None
                 else _gpus_words(gpus) + (", as CPU processes" if device == "cpu" else ""))
        lines.append(f"{ranks}: node {node.get('node_rank')} ({node.get('host')}), {where}")
    return lines


def _nodes(plan: object) -> list[dict]:
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    return [n for n in nodes or () if isinstance(n, dict)] if isinstance(nodes, list) else []


def _gpus_words(gpus: dict[str, Any]) -> str:
    """``GPUs 3,4,5 (free:3), 3x NVIDIA H100 80GB HBM3``: a ``node_gpus``."""
    asked = f" ({gpus['gpu_request']})" if gpus["gpu_request"] else ""
    models = Counter(gpus["gpu_models"])
    kinds = ", ".join(f"{n}x {model}" for model, n in models.most_common())
    return f"GPUs {','.join(map(str, gpus['gpus']))}{asked}" + (f", {kinds}" if kinds else "")


# What ``progress.json`` says of a rank's GPU (``engine/gpuuse.rank_gpu``).
GPU_KEYS = ("gpu", "gpu_util", "gpu_mem_mib", "gpu_util_mean", "gpu_mem_peak_mib")


def gpu_words(rank: dict[str, Any]) -> str:
    """``, GPU 3 97% busy, 40.2 GiB``: a live rank's GPU now, where sampled."""
    if rank.get("gpu") is None:
        return ""
    util = "?" if rank.get("gpu_util") is None else f"{rank['gpu_util']}%"
    used = "" if rank.get("gpu_mem_mib") is None else f", {rank['gpu_mem_mib'] / 1024:.1f} GiB"
    return f", GPU {rank['gpu']} {util} busy{used}"
