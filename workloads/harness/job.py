"""The frame every workload runs in: parse, read the context, validate, run.

``start`` does everything that can fail without talking to other ranks
(argument parsing, device choice and binding a CUDA rank to its GPU, the
catalog's rules, batch split, lr scaling, the loader's workers, the speed
options: ``speed.resolve_speed``), so a bad configuration fails fast
on every rank before any rendezvous. The rules are the catalog's
(``catalog.Rule``), the same the controller checks before launch, so both
refuse in the same words. ``run_job`` then opens the process group around the
workload's ``train(job)``.

Training lives in its own function, not in ``main``, for a reason: DDP's
reducer, the loaders and pending gloo work hold references into the process
group. Returning from ``train`` (plus a gc pass) releases them while the
interpreter is fully alive, before the group is destroyed; objects left for
interpreter finalization have been seen to abort the process at exit.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass
from typing import Callable

from workloads import contract
from workloads.catalog import CATALOG, Layout, build_parser, describe_speed
from workloads.harness import data as hdata
from workloads.harness.context import (DistContext, WorkloadError, context_from_environ,
                                       process_group, visible_gpus)
from workloads.harness.report import RankZeroLog
from workloads.harness.speed import Speed, resolve_speed
from workloads.harness.timing import now


@dataclass(frozen=True)
class Job:
    """One workload run: its arguments, context, log and derived settings."""

    name: str
    args: argparse.Namespace
    ctx: DistContext
    log: RankZeroLog
    started: float
    split: hdata.BatchSplit | None  # --global-batch-size over the ranks (None: no batch)
    lr: float  # after --lr-scaling (0.0 for workloads without one)
    workers: int = 0  # DataLoader workers per rank: --num-workers, or chosen (loader_workers)
    speed: Speed | None = None  # the speed options as applied (the image workloads')

    def speed_record(self) -> dict:
        """The result's ``speed`` (empty where the workload has no speed options)."""
        return self.speed.record(self.workers, self.args.num_workers) if self.speed else {}

    def speed_line(self) -> str:
        """The log's ``speed:`` line, the words of the summary's."""
        return f"speed: {describe_speed(self.speed_record())}"

    @property
    def batch(self) -> int:
        """The largest per-rank batch, rank 0's (0 for workloads without one)."""
        return self.split.largest if self.split else 0


def start(name: str, argv: list[str] | None = None) -> Job:
    """Parse ``argv`` for workload ``name`` and read this process's context."""
    started = now()
    args = build_parser(name).parse_args(argv)
    ctx = context_from_environ(getattr(args, "device", None))
    refused = CATALOG[name].refusal(vars(args), layout_of(ctx))
    if refused:
        raise WorkloadError(refused[1])
    split, lr = None, 0.0
    if hasattr(args, "global_batch_size"):
        split = hdata.split_batch(args.global_batch_size, ctx.world_size)
        lr = hdata.scaled_lr(args.lr, args.lr_scaling, ctx.world_size)
    workers = hdata.loader_workers(args.num_workers, ctx) if hasattr(args, "num_workers") else 0
    speed = resolve_speed(args, ctx, name) if hasattr(args, "seed_settings") else None
    job = Job(name, args, ctx, RankZeroLog(ctx, name), started, split, lr, workers, speed)
    if ctx.fallback:
        job.log(f"WARNING: {ctx.fallback}")

    if contract.restart_count() and not hasattr(args, "checkpoint"):
        job.log(f"restart {contract.restart_count()}: {name} keeps no checkpoint, so "
                "training starts again from scratch")
    return job


def layout_of(ctx: DistContext) -> Layout:
    """What this rank sees, for the catalog's rules."""
    return Layout(world_size=ctx.world_size, device="cuda" if ctx.is_cuda else "cpu",
                  gpus=visible_gpus(ctx), restarts=contract.max_restarts() > 0)


def run_job(job: Job, train: Callable[[Job], dict]) -> dict:
    """``train(job)`` inside the process group; everything it built is freed
    before the group is destroyed (see module docstring)."""
    with process_group(job.ctx, getattr(job.args, "pg_timeout", 0)):
        try:
            return train(job)
        finally:
            gc.collect()
