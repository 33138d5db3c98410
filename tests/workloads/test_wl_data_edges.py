"""``workloads/harness/data.py`` value by value: seeds, batch counts, the
loaders' settings (expected values by hand; ``scripts/mutation``)."""

from __future__ import annotations

import multiprocessing.forkserver

import pytest
import torch
from torch.utils.data import TensorDataset

from workloads.harness import data as hdata
from workloads.harness.context import DistContext, WorkloadError


def ctx(rank: int, world: int) -> DistContext:
    return DistContext(rank=rank, local_rank=rank, world_size=world, node_rank=0,
                       local_world_size=world, device="cpu", backend="gloo", launched=False,
                       hostname="h", cuda_visible_devices=None, run_id=None,
                       requested_device="cpu", result_file=None, cuda_device_order=None,
                       planned_gpu_uuids=(), fallback=None)


def dataset(n: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), torch.arange(n))


@pytest.mark.parametrize("seed,rank,epoch,expected", [
    # (seed * 0x9E3779B97F4A7C15 + epoch * 0xC2B2AE3D27D4EB4F + rank * 0x165667B19E3779F9)
    # mod (2**63 - 1), worked out by hand
    (1, 0, 0, 2177342782468422678),
    (0, 1, 0, 1609587929392839161),
    (0, 0, 1, 4806095330042243920),
    (0, 2, 3, 8414089812057634275),
    (0, 0, 0, 0),
])
def test_epoch_seed(seed, rank, epoch, expected):
    assert hdata.epoch_seed(seed, rank, epoch) == expected


def test_a_global_batch_of_one_is_allowed_and_of_none_refused():
    assert hdata.split_batch(1, 3).shares == [1, 0, 0]
    with pytest.raises(WorkloadError):
        hdata.split_batch(0, 1)


@pytest.mark.parametrize("length,size,drop_last,batches", [
    (10, 4, False, 3), (10, 4, True, 2), (8, 4, False, 2), (8, 4, True, 2), (3, 4, False, 1),
    (3, 4, True, 0), (0, 4, False, 0),
])
def test_the_number_of_global_batches(length, size, drop_last, batches):
    sampler = hdata.GlobalBatchSampler(length, hdata.split_batch(size, 3), 0, shuffle=False,
                                       seed=0, drop_last=drop_last)
    assert len(sampler) == batches


def test_a_rank_has_an_empty_share_when_the_last_batch_is_too_small_for_it():
    split = hdata.split_batch(4, 3)  # 10 samples: batches of 4, 4, 2
    assert [hdata.GlobalBatchSampler(10, split, r, shuffle=False, seed=0).has_empty_share()
            for r in range(3)] == [False, False, True]
    assert not hdata.GlobalBatchSampler(0, split, 2, shuffle=False, seed=0).has_empty_share()
    assert not hdata.GlobalBatchSampler(12, split, 2, shuffle=False, seed=0).has_empty_share()


def test_the_train_loader_s_defaults_and_settings():
    loader = hdata.train_loader(dataset(), ctx(0, 2), 4, seed=7)
    sampler = loader.batch_sampler
    assert (sampler.shuffle, sampler.seed, sampler.drop_last, sampler.rank) == (True, 7, False, 0)
    assert (sampler.split.size, sampler.split.world_size, sampler.length) == (4, 2, 10)
    assert loader.num_workers == 0 and loader.multiprocessing_context is None
    assert loader.pin_memory is False and loader.collate_fn.empty is None
    plain = hdata.train_loader(dataset(), ctx(1, 2), 4, seed=7, shuffle=False, drop_last=True)
    assert [b[1].tolist() for b in plain] == [[1, 3], [5, 7]]


def test_a_rank_that_can_get_an_empty_share_gets_zero_row_batches():
    loader = hdata.train_loader(dataset(), ctx(2, 3), 4, seed=0, shuffle=False)
    batches = list(loader)
    assert [b[1].tolist() for b in batches] == [[2], [6], []]
    assert batches[-1][0].shape == (0, 2)


def test_the_eval_loader_takes_every_world_th_sample_from_the_rank():
    loader = hdata.eval_loader(dataset(), ctx(1, 3), 2)
    assert [b[1].tolist() for b in loader] == [[1, 4], [7]]
    assert loader.batch_size == 2 and loader.num_workers == 0 and loader.pin_memory is False
    assert loader.multiprocessing_context is None


def test_workers_come_from_a_forkserver_that_preloads_torch_and_the_dataset():
    ds = dataset()
    context = hdata._worker_context(ds, 2)
    assert context.get_start_method() == "forkserver"
    assert multiprocessing.forkserver._forkserver._preload_modules == [
        "torch", "torch.utils.data.dataset"]
    assert hdata._worker_context(ds, 0) is None
    loader = hdata.eval_loader(ds, ctx(0, 1), 4, num_workers=2)
    assert loader.num_workers == 2 and loader.multiprocessing_context.get_start_method() == "forkserver"


def test_zero_rows_of_every_container_and_the_collate_without_a_template():
    batch = {"x": torch.ones(3, 2), "y": [torch.ones(3), (torch.ones(3, 1), "tag")]}
    empty = hdata._zero_rows(batch)
    assert empty["x"].shape == (0, 2) and empty["y"][0].shape == (0,)
    assert isinstance(empty["y"][1], tuple) and empty["y"][1][0].shape == (0, 1)
    assert empty["y"][1][1] == "tag"
    collate = hdata.Collate()
    assert collate.empty is None
    with pytest.raises(RuntimeError):
        collate([])
    assert collate([torch.tensor(1), torch.tensor(2)]).tolist() == [1, 2]


def cuda_ctx(local_world: int) -> DistContext:
    import dataclasses

    return dataclasses.replace(ctx(0, local_world), device="cuda:0", backend="nccl",
                               local_world_size=local_world)


@pytest.mark.parametrize("cpus,local_world,workers", [
    (16, 4, 3),  # 4 CPUs a rank: one for the rank, 3 load
    (2, 2, 0),  # 1 CPU a rank: the rank's own
    (64, 1, 4),  # at most 4
    (96, 8, 4),
    (10, 4, 1),  # 2 CPUs a rank (10 // 4)
    (3, 4, 0),  # fewer CPUs than ranks
])
def test_the_loaders_workers_by_default_from_the_cpus_and_ranks_of_a_gpu_node(cpus, local_world,
                                                                            workers):
    assert hdata.loader_workers(hdata.AUTO_WORKERS, cuda_ctx(local_world), cpus) == workers


def test_the_loaders_workers_as_given_and_none_by_default_on_the_cpu():
    assert hdata.loader_workers(2, cuda_ctx(4), 16) == 2
    assert hdata.loader_workers(0, cuda_ctx(1), 64) == 0
    assert hdata.loader_workers(hdata.AUTO_WORKERS, ctx(0, 1), 64) == 0
    assert hdata.loader_workers(3, ctx(0, 1), 64) == 3
    assert hdata.AUTO_WORKERS == -1  # the catalog's default says so


def test_a_batch_made_in_one_piece_passes_the_collate_and_both_loaders_as_it_is():
    class Whole(TensorDataset):
        def __getitems__(self, indices):
            return hdata.Batch(self.tensors[0][indices], self.tensors[1][indices])

    ds = Whole(*dataset().tensors)
    batch = hdata.Batch(torch.ones(2, 2), torch.zeros(2))
    assert hdata.Collate()(batch) is batch
    train = list(hdata.train_loader(ds, ctx(1, 2), 4, seed=0, shuffle=False))
    assert [type(b) for b in train] == [hdata.Batch] * 3
    assert [b.targets.tolist() for b in train] == [[1, 3], [5, 7], [9]]
    evaluated = list(hdata.eval_loader(ds, ctx(0, 3), 2))
    assert [b.targets.tolist() for b in evaluated] == [[0, 3], [6, 9]]


def test_seed_epoch_seeds_the_device_pipeline_from_the_ranks_stream():
    seen = []

    class Pipeline:
        def seed(self, s, device):
            seen.append((s, device))

    loader = hdata.train_loader(dataset(), ctx(1, 2), 4, seed=7)
    hdata.seed_epoch(loader, ctx(1, 2), 7, 3, Pipeline())
    assert seen == [(hdata.epoch_seed(7, 1, 3), torch.device("cpu"))]
    hdata.seed_epoch(loader, ctx(1, 2), 7, 3, object())  # no seed method: nothing to seed
    assert len(seen) == 1
