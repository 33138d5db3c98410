"""Rank-0 progress lines and the result JSON every workload writes.

The result is the contract with the controller (``workloads.contract``):
rank 0 writes it atomically to ``--result-file`` or $DDP_ORCH_RESULT_FILE;
with neither, it only prints a summary. Its keys are the same for every
workload (``REQUIRED_KEYS``), so the controller and the tests can check any
result the same way; workloads add their own keys next to them.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any

import torch

from workloads import contract
from workloads.contract import write_json_atomic
from workloads.harness.context import DistContext
from workloads.harness.timing import now

REQUIRED_KEYS = ("workload", "config", "world_size", "data", "metrics", "timing",
                 "rank_table", "checksum", "checksums", "replicas_identical",
                 "versions", "loss_curve")


class RankZeroLog:
    """``log(msg)`` prints on rank 0 only, flushed, prefixed with the workload.

    Other ranks stay quiet so that torchrun's interleaved output is readable
    and the controller can follow one stream.
    """

    def __init__(self, ctx: DistContext, workload: str):
        run = f" {ctx.run_id}" if ctx.run_id else ""
        self.prefix = f"[{workload}{run}]"
        self.enabled = ctx.is_rank0

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"{self.prefix} {msg}", flush=True)


def describe_start(ctx: DistContext, data: str, source: str) -> str:
    """The first log line: where the data comes from, and the job's shape."""
    return (f"data={data} ({source}) | world_size={ctx.world_size} "
            f"device={ctx.device} backend={ctx.backend}")


def versions(ctx: DistContext) -> dict:
    """Library versions; cuda/nccl are null when the run did not use them."""
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    tv = sys.modules.get("torchvision")
    if tv is not None:
        out["torchvision"] = tv.__version__
    out["cuda"] = torch.version.cuda if ctx.is_cuda else None
    out["nccl"] = None
    if ctx.backend == "nccl":
        out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        out["gpu"] = torch.cuda.get_device_name(ctx.torch_device())
    return out


def emit(ctx: DistContext, result: dict, result_file: str | None, log: RankZeroLog) -> None:
    """On rank 0: write ``result`` atomically if there is a path; print a summary."""
    if not ctx.is_rank0:
        return
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise RuntimeError(f"result lacks the contract keys {missing}")
    path = result_file or ctx.result_file
    timing = {k: v for k, v in result["timing"].items() if k != "series"}
    log("summary " + json.dumps({"metrics": result["metrics"], "timing": timing,
                                 "replicas_identical": result["replicas_identical"]},
                                sort_keys=True))
    if path:
        write_json_atomic(path, result)
        log(f"result written to {path}")
    else:
        log("no result file (neither --result-file nor DDP_ORCH_RESULT_FILE set)")


def build_result(ctx: DistContext, args: Any, *, workload: str, data: str,
                 metrics: dict, timing: dict, evidence: dict,
                 loss_curve: list, started: float, **extra: Any) -> dict:
    """Assemble the result dict (identical on every rank; only rank 0 writes it)."""
    timing = {"total_s": now() - started, **timing}
    result = {
        "workload": workload,
        "config": dict(vars(args)),
        "world_size": ctx.world_size,
        "nodes": len({r["node_rank"] for r in evidence["rank_table"]}),
        "run_id": ctx.run_id,
        "restart_count": contract.restart_count(),
        "device": ctx.device,
        "backend": ctx.backend,
        "data": data,
        "metrics": metrics,
        "timing": timing,
        "versions": versions(ctx),
        "loss_curve": loss_curve,
        **evidence,
    }
    result.update(extra)
    return result


def finish(job: Any, trainer: Any, model: Any, *, data: str, metrics: dict,
           init_checksum: str | None, **extra: Any) -> dict:
    """End of a training workload, on every rank: gather, assemble, emit.

    Collectives (checksums, rank table, sample count) run on all ranks in the
    same order; then rank 0 writes. ``model`` is the unwrapped module. The
    result's ``batch_split`` is each rank's share of a full global batch;
    its ``epoch_curve`` the mean training loss (and accuracy) of each epoch,
    over all its samples, as ``[epoch, step, loss, accuracy or null]``.
    """
    from workloads.harness.evidence import gather, param_checksum

    ctx = job.ctx
    if getattr(job, "split", None) is not None:
        extra = {"batch_split": job.split.shares, **extra}
    evidence = gather(ctx, param_checksum(model), init_checksum,
                      step_stats=trainer.timer.rank_stats())
    timing = trainer.timer.summary(trainer.global_samples())
    result = build_result(ctx, job.args, workload=job.name, data=data, metrics=metrics,
                          timing=timing, evidence=evidence,
                          loss_curve=trainer.loss_curve.rows, started=job.started,
                          accuracy_curve=trainer.acc_curve.rows,
                          epoch_curve=trainer.epoch_curve, **extra)
    emit(ctx, result, getattr(job.args, "result_file", None), job.log)
    return result
