"""CUDA/NCCL paths: run only where GPUs are visible (skipped on CPU-only CI).

Not exercised on the machine these tests were written on (no GPU there);
they exist so that a GPU host can check the NCCL, SyncBatchNorm, fp16 AMP
and DataParallel paths with one pytest command.
"""

from __future__ import annotations

import pytest
import torch

from wl_support import check_complete, run_alone, run_torchrun

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.live,
              pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device")]


def test_mnist_on_cuda_uses_nccl_sync_bn_and_fp16(tmp_path, tiny_data):
    nproc = min(GPUS, 2)
    run = run_torchrun(tmp_path, "mnist", "--data-dir", tiny_data, "--epochs", "1",
                       "--global-batch-size", "8", "--num-workers", "0", nproc=nproc,
                       env_extra={"DDP_ORCH_DEVICE": "cuda"})
    result = run.check()
    check_complete(result, "mnist", nproc)
    assert result["backend"] == "nccl" and result["device"] == "cuda:0"
    assert result["sync_bn"] is True and result["amp"] == "fp16"
    assert result["versions"]["cuda"] and result["versions"]["nccl"]
    assert [r["device"] for r in result["rank_table"]] == [f"cuda:{i}" for i in range(nproc)]


def test_linear_alone_on_cuda(tmp_path):
    result = run_alone(tmp_path, "linear", "--samples", "640", "--epochs", "2",
                       env_extra={"DDP_ORCH_DEVICE": "cuda"}).check()
    check_complete(result, "linear", 1)
    assert result["backend"] == "nccl"


@pytest.mark.skipif(GPUS < 2, reason="DataParallel needs two GPUs")
def test_mlp_dataparallel_over_all_gpus(tmp_path):
    result = run_alone(tmp_path, "mlp", "--mode", "dp", "--data", "synthetic",
                       "--train-samples", "256", "--test-samples", "64",
                       "--num-workers", "0", env_extra={"DDP_ORCH_DEVICE": "cuda"}).check()
    check_complete(result, "mlp", 1)
    assert result["mode"] == "dp" and result["metrics"]["dp_gpus"] == GPUS
