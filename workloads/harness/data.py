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
GlobalBatchSampler's job (its permutation depends on seed + epoch only, hence
``set_epoch`` every epoch). How a global batch is dealt to the ranks, and
why any world size trains like one process, is ``BatchSplit``'s docstring.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Sized

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.dataloader import default_collate

from workloads.harness.context import WorkloadError, DistContext


def split_batch(global_batch: int, world_size: int) -> BatchSplit:
    """``--global-batch-size`` dealt over ``world_size`` ranks; any world size.

    Only a batch below one sample is refused (the controller's dry-run refuses
    it too, from the catalog's minimum).
    """
    if global_batch < 1:
        raise WorkloadError(f"--global-batch-size must be positive, got {global_batch}")
    if world_size < 1:
        raise WorkloadError(f"world size must be positive, got {world_size}")
    return BatchSplit(global_batch, world_size)


@dataclass(frozen=True)
class BatchSplit:
    """The batch rule: a global batch of ``size`` samples, dealt to the ranks.

    The rule, the same for every built-in workload and every layout:

    * a step trains on ``size`` consecutive samples of the epoch's order,
      whatever the world size: the global batch is the workload's argument
      and the world size only decides who computes what;
    * rank r takes positions r, r+W, r+2W, ... of that global batch, so rank
      r gets ``size // W`` samples, plus one when ``r < size % W``
      (32 over 7 ranks: 5,5,5,5,4,4,4; 4 over 7: 1,1,1,1,0,0,0);
    * the last global batch of an epoch is the remainder, dealt the same way.
      Nothing is padded (nor dropped, unless ``drop_last``): each sample is
      used once per epoch;
    * a rank holding n of a global batch of N samples scales its mean loss by
      ``n * W / N`` (``loss_weight``). DDP averages gradients over the W
      ranks, so the update is sum_r (n_r / N) * grad(mean_r) = grad of the
      mean loss over all N samples: the single-process gradient over the
      global batch, whether the split is even (every weight is 1) or not.

    Hence a W-rank run takes the same steps as one process with the same
    ``--global-batch-size``: equal to float rounding, and bit for bit in
    practice when every split is even. A rank whose share is empty runs
    the step on an empty batch (its gradient is zero; DDP needs every rank in
    every step's all-reduce). What is not equivalent is per-rank state a
    model keeps: plain BatchNorm normalises over each rank's own samples.
    """

    size: int
    world_size: int

    def share(self, rank: int, batch: int | None = None) -> int:
        """Rank ``rank``'s samples of a global batch of ``batch`` (default: full)."""
        batch = self.size if batch is None else batch
        return len(range(rank, batch, self.world_size))

    @property
    def shares(self) -> list[int]:
        """Every rank's share of a full global batch, by rank."""
        return [self.share(r) for r in range(self.world_size)]

    @property
    def largest(self) -> int:
        """Rank 0's share, the largest (at least 1): sizes eval batches."""
        return self.share(0)

    def loss_weight(self, local: int, batch: int) -> float:
        """Factor on a rank's mean loss when it holds ``local`` of ``batch``
        samples, so that DDP's average is the global batch's mean gradient."""
        return local * self.world_size / batch

    def __str__(self) -> str:
        """``32 = 2 x 16``, or ``32 = 4 x 5 + 3 x 4`` for an uneven split."""
        counts: dict[int, int] = {}
        for n in self.shares:
            counts[n] = counts.get(n, 0) + 1
        return f"{self.size} = " + " + ".join(f"{k} x {n}" for n, k in counts.items())


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


def seed_epoch(loader: DataLoader, ctx: DistContext, seed: int, epoch: int,
               pipeline: Any = None) -> None:
    """Re-seed this rank's data-side randomness for ``epoch``.

    The loader's generator decides the base seed of its workers (re-forked
    each epoch: persistent_workers stays off for that reason); the global
    generator covers transforms run in the main process (num_workers=0); a
    ``pipeline`` with a ``seed`` method (``datasets.ImagePipeline``: the
    augmentation, on the device) gets the same stream's seed.
    """
    s = epoch_seed(seed, ctx.rank, epoch)
    if loader.generator is not None:
        loader.generator.manual_seed(s)
    torch.manual_seed(s)
    if pipeline is not None and hasattr(pipeline, "seed"):
        pipeline.seed(s, ctx.torch_device())


AUTO_WORKERS = -1  # ``--num-workers`` default of the image workloads: ``loader_workers``
MAX_AUTO_WORKERS = 4


def loader_workers(requested: int, ctx: DistContext, cpus: int | None = None) -> int:
    """``--num-workers``: the number given, or for ``AUTO_WORKERS`` one
    chosen from this node's CPUs and the ranks sharing them.

    A batch leaves the loader as stored uint8 images (``datasets``), so a
    worker has little to do; on a GPU, one CPU of each rank's share stays
    with the rank's own loop and up to ``MAX_AUTO_WORKERS`` of the rest load
    (16 CPUs for 4 ranks: 3 each; 2 CPUs for 2 ranks: none). A CPU rank
    computes on its CPUs, so there it loads in its own process (0).
    """
    if requested != AUTO_WORKERS:
        return requested
    if not ctx.is_cuda:
        return 0
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    return max(0, min(MAX_AUTO_WORKERS, cpus // max(1, ctx.local_world_size) - 1))


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


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's share of each global batch (see ``BatchSplit``).

    The epoch's order is the same on every rank: ``range(len)``, or with
    shuffle on a permutation drawn from ``seed + epoch`` alone, the one
    DistributedSampler draws (hence ``set_epoch`` every epoch). Global batch
    k is positions kG .. kG+G-1 of that order and rank r takes every W-th of
    them from r, so the union of the ranks' step-k batches is the step-k
    batch of a one-process run. When G and the length divide by W this is
    exactly DistributedSampler's shard, batched; unlike it, nothing is padded,
    so no sample counts twice. Every rank yields the same number of batches
    (some possibly empty), as it must: each step is a collective.
    """

    def __init__(self, length: int, split: BatchSplit, rank: int, *, shuffle: bool,
                 seed: int, drop_last: bool = False):
        self.length, self.split, self.rank = length, split, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_size(self, step: int) -> int:
        """How many samples global batch ``step`` of an epoch holds."""
        return min(self.split.size, self.length - step * self.split.size)

    def has_empty_share(self) -> bool:
        """Whether this rank ever gets an empty share: when a global batch (a
        full one, or the epoch's last, the smallest) holds at most ``rank``."""
        return len(self) > 0 and self.global_size(len(self) - 1) <= self.rank

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order, size, world = self._order(), self.split.size, self.split.world_size
        for step in range(len(self)):
            start = step * size
            yield order[start + self.rank:start + self.global_size(step):world]

    def __len__(self) -> int:
        full, rest = divmod(self.length, self.split.size)
        return full + (1 if rest and not self.drop_last else 0)


class Batch(NamedTuple):
    """A batch a dataset made in one piece (its ``__getitems__``), which
    ``Collate`` passes on as it is."""

    inputs: torch.Tensor
    targets: torch.Tensor


class Collate:
    """``default_collate``, plus empty batches of the dataset's shape.

    A rank with an empty share still runs the step, through the model, so it
    needs tensors with zero rows; ``template`` is one collated sample (made
    only when this rank can get an empty share), cut to zero rows. A
    ``Batch`` is already collated (zero rows included).
    """

    def __init__(self, template: Any = None):
        self.empty = _zero_rows(template) if template is not None else None

    def __call__(self, batch: list | Batch) -> Any:
        if isinstance(batch, Batch):
            return batch
        if batch:
            return default_collate(batch)
        if self.empty is None:
            raise RuntimeError("an empty batch where the sampler promised none")
        return self.empty


def _zero_rows(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_zero_rows(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _zero_rows(v) for k, v in batch.items()}
    return batch


def train_loader(dataset: Dataset, ctx: DistContext, global_batch: int, *, seed: int,
                 shuffle: bool = True, num_workers: int = 0,
                 drop_last: bool = False) -> DataLoader:
    """A loader over this rank's share of every global batch of ``dataset``.

    ``global_batch`` is the workload's ``--global-batch-size``; the rule is
    ``BatchSplit``'s, the sampler ``GlobalBatchSampler`` (the Trainer reads
    both back from ``loader.batch_sampler`` to weight each step's loss).
    ``drop_last`` drops an epoch's last global batch when it is short.
    """
    split = split_batch(global_batch, ctx.world_size)
    sampler = GlobalBatchSampler(len(dataset), split, ctx.rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    template = default_collate([dataset[0]]) if sampler.has_empty_share() else None
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=Collate(template),
                      num_workers=num_workers, pin_memory=ctx.is_cuda,
                      generator=torch.Generator(), persistent_workers=False,
                      multiprocessing_context=_worker_context(dataset, num_workers))


def eval_loader(dataset: Dataset, ctx: DistContext, batch_size: int, *,
                num_workers: int = 0) -> DataLoader:
    """A loader over this rank's exact, unpadded share of ``dataset``."""
    return DataLoader(dataset, batch_size=batch_size,
                      sampler=ShardSampler(dataset, ctx.rank, ctx.world_size),
                      collate_fn=Collate(), num_workers=num_workers, pin_memory=ctx.is_cuda,
                      multiprocessing_context=_worker_context(dataset, num_workers))
