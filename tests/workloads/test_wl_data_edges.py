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
