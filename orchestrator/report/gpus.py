"""A run's GPUs as its recorded plan (``plan.json``) has them, for
``status``, ``status --json``/``ps --json`` and the summary alike."""

from __future__ import annotations

from collections import Counter
from typing import Any


def node_gpus(planned: dict | None) -> dict[str, Any]:
    """A node's GPUs as its recorded plan (``plan.json``) has them: indices,
    the request they were chosen by, their models and UUIDs (what a GPU
    monitor such as DCGM keys on); nulls where none."""
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
    """Each GPU node's GPUs as the launch recorded them: ``node 0 (gpu01):
    GPUs 3,4,5 (free:3), 3x NVIDIA H100 80GB HBM3``. A CPU rehearsal's
    plain list says nothing new (the indices are CPU processes), so its
    nodes are named only where the GPUs were chosen or looked at."""
    lines = []
    rehearsal = isinstance(plan, dict) and plan.get("device") == "cpu"
    for node in (plan.get("nodes") or ()) if isinstance(plan, dict) else ():
        gpus = node_gpus(node if isinstance(node, dict) else None)
        if gpus["gpus"] is None or (rehearsal and not gpus["gpu_request"]
                                    and not gpus["gpu_models"]):
            continue
        asked = f" ({gpus['gpu_request']})" if gpus["gpu_request"] else ""
        models = Counter(gpus["gpu_models"])
        kinds = ", ".join(f"{n}x {model}" for model, n in models.most_common())
        lines.append(f"  node {node.get('node_rank')} ({node.get('host')}): GPUs "
                     f"{','.join(map(str, gpus['gpus']))}{asked}" + (f", {kinds}" if kinds else ""))
    return lines


# What ``progress.json`` says of a rank's GPU (``engine/gpuuse.rank_gpu``).
GPU_KEYS = ("gpu", "gpu_util", "gpu_mem_mib", "gpu_util_mean", "gpu_mem_peak_mib")


def gpu_words(rank: dict[str, Any]) -> str:
    """``, GPU 3 97% busy, 40.2 GiB``: a live rank's GPU now, where sampled."""
    if rank.get("gpu") is None:
        return ""
    util = "?" if rank.get("gpu_util") is None else f"{rank['gpu_util']}%"
    used = "" if rank.get("gpu_mem_mib") is None else f", {rank['gpu_mem_mib'] / 1024:.1f} GiB"
    return f", GPU {rank['gpu']} {util} busy{used}"
