"""Splitting the work across ranks: batches, learning rate, samplers, seeds.

Seeding follows two rules (seed 004 explains the second):

* the model is initialised from ``--seed`` alone, so every rank starts from
  the same weights (DDP would broadcast rank 0's anyway; the evidence records
  that they were already equal);
* anything random on the data side -- shuffling aside -- gets a stream per
  rank and per epoch (``epoch_seed``): a DataLoader worker on rank 0 and the
  same worker on rank 1 must not draw the same augmentations. The streams
  are derived from (seed, rank, epoch) and re-seeded at each epoch start, so
  a run resumed at an epoch boundary continues exactly as if uninterrupted.

The shuffle order itself must be the same on all ranks: that is
DistributedSampler's job (its permutation depends on seed + epoch only, hence
``set_epoch`` every epoch).
"""

from __future__ import annotations

import multiprocessing
from typing import Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from workloads.harness.context import WorkloadError, DistContext


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """The per-rank batch for ``--global-batch-size``; refuses uneven splits.

    An uneven split would make ranks weigh their samples differently in the
    averaged gradient, so it is an error, not a rounding.
    """
    if global_batch < 1:
        raise WorkloadError(f"--global-batch-size must be positive, got {global_batch}")
    if global_batch % world_size:
        raise WorkloadError(
            f"--global-batch-size {global_batch} is not divisible by the world size "
            f"{world_size}; pick a multiple of {world_size}")
    return global_batch // world_size


def scaled_lr(lr: float, scaling: str, world_size: int) -> float:
    """``--lr-scaling``: ``none`` keeps ``lr``; ``linear`` multiplies it by the
    world size (the "scale lr with the global batch" rule of seed 001)."""
    if scaling == "none":
        return lr
    if scaling == "linear":
        return lr * world_size
    raise WorkloadError(f"--lr-scaling must be none or linear, got {scaling!r}")


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """A 63-bit seed that differs for every (seed, rank, epoch) triple."""
    mixed = (seed * 0x9E3779B97F4A7C15 + epoch * 0xC2B2AE3D27D4EB4F + rank * 0x165667B19E3779F9)
    return mixed % (2**63 - 1)


def seed_epoch(loader: DataLoader, ctx: DistContext, seed: int, epoch: int) -> None:
    """Re-seed this rank's data-side randomness for ``epoch``.

    The loader's generator decides the base seed of its workers (re-forked
    each epoch: persistent_workers stays off for that reason); the global
    generator covers transforms run in the main process (num_workers=0).
    """
    s = epoch_seed(seed, ctx.rank, epoch)
    if loader.generator is not None:
        loader.generator.manual_seed(s)
    torch.manual_seed(s)


class ShardSampler(Sampler[int]):
    """Rank r gets indices r, r+W, r+2W, ... and nothing else: no padding.

    For evaluation. DistributedSampler pads every shard to the same length by
    repeating samples, which would count some examples twice in a reduced
    accuracy. Here shards may differ in length by one; that is fine because
    evaluation runs no collective per batch (only the final all_reduce of
    correct/total counts), and it must run on the unwrapped module so that
    DDP's forward (which may broadcast buffers) is not involved.
    """

    def __init__(self, data: Sized, rank: int, world_size: int):
        self.indices = range(rank, len(data), world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _worker_context(dataset: Dataset, num_workers: int):
    """Where DataLoader workers come from: a forkserver, never a plain fork.

    Forking the rank itself is unsafe: it runs gloo/NCCL threads and, between
    epochs, the previous loader's threads are still winding down. A fork taken
    while one of them holds an interpreter lock leaves the child stuck for
    good (seen here: a worker hung in CPython's ``PyOS_AfterFork_Child``, the
    eval all_reduce waiting on it). The forkserver is a single-threaded
    process, started once per rank, so the forks it makes are safe. It
    preloads torch and the dataset's module, so a worker starts as fast as a
    fork (without the preload, each worker would import torch again, about
    1.5 s on every epoch since persistent_workers stays off).
    """
    if num_workers == 0:
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", type(dataset).__module__])  # before it starts
    return context


def train_loader(dataset: Dataset, ctx: DistContext, batch_size: int, *, seed: int,
                 shuffle: bool = True, num_workers: int = 0,
                 drop_last: bool = False) -> DataLoader:
    """A loader over this rank's DistributedSampler shard.

    The sampler pads shards to equal length, so every rank runs the same
    number of steps (a must: each step is a collective). With shuffle off,
    rank r sees indices r, r+W, ...; with it on, the same positions of one
    permutation shared by all ranks -- either way the union of the ranks'
    step-k batches is the step-k batch of a one-process run over the same
    data, which is what makes DDP equivalent to single-process training.
    """
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      num_workers=num_workers, pin_memory=ctx.is_cuda,
                      drop_last=drop_last, generator=torch.Generator(),
                      persistent_workers=False,
                      multiprocessing_context=_worker_context(dataset, num_workers))


def eval_loader(dataset: Dataset, ctx: DistContext, batch_size: int, *,
                num_workers: int = 0) -> DataLoader:
    """A loader over this rank's exact, unpadded share of ``dataset``."""
    return DataLoader(dataset, batch_size=batch_size,
                      sampler=ShardSampler(dataset, ctx.rank, ctx.world_size),
                      num_workers=num_workers, pin_memory=ctx.is_cuda,
                      multiprocessing_context=_worker_context(dataset, num_workers))
