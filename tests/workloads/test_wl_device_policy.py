"""The GPU paths' decisions, checked where there is no GPU.

A fake CUDA (torch.cuda's query functions replaced by recorders) shows what
a workload asks CUDA, in which order, and what it writes into the rank
table; live runs show what device ``cuda`` and ``auto`` do on a machine
without a usable GPU. Real GPU runs are in test_wl_gpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wl_support import run_alone
from workloads import mnist
from workloads.harness.context import WorkloadError, bind_device, read_context
from workloads.harness.evidence import rank_row

BARE_UUID = "1a2b3c4d-0000-1111-2222-333344445555"
OTHER_UUID = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
LOCAL_RANK_1_OF_2 = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                     "DDP_ORCH_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "4,5"}


@pytest.fixture
def fake_cuda(monkeypatch) -> list[str]:
    """Two visible "GPUs"; returns the log of the CUDA calls made, in order."""
    calls: list[str] = []

    def record(name: str, result=None):
        def call(*args, **_kwargs):
            calls.append(" ".join([name, *(str(a) for a in args)]))
            return result
        return call

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid=BARE_UUID, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", record("set_device"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", record("is_bf16_supported", True))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        record("get_device_properties", props))
    return calls


def test_a_cuda_rank_is_on_its_own_gpu_before_bf16_support_is_asked(fake_cuda, monkeypatch):
    """``is_bf16_supported`` asks the current device: asked before
    ``set_device``, every local rank would open a context on cuda:0."""
    for name, value in LOCAL_RANK_1_OF_2.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(mnist, "run_job", lambda job, train: fake_cuda.append("run_job") or {})
    mnist.main(["--amp", "bf16", "--data", "synthetic"])
    asked = [c for c in fake_cuda if not c.startswith("get_device_properties")]
    assert asked == ["set_device cuda:1", "is_bf16_supported", "run_job"]


def test_the_rank_table_names_each_ranks_gpu_as_nvidia_smi_does(fake_cuda):
    ctx = read_context({**LOCAL_RANK_1_OF_2, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    row = rank_row(ctx)
    assert row["gpu_uuid"] == f"GPU-{BARE_UUID}" and row["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert row["cuda_device_order"] == "PCI_BUS_ID" and row["cuda_visible_devices"] == "4,5"
    assert fake_cuda == ["get_device_properties cuda:1"]


def test_a_cpu_rank_table_row_has_no_gpu():
    row = rank_row(read_context({}, "cpu"))
    assert (row["gpu_uuid"], row["gpu_name"], row["device"]) == (None, None, "cpu")


def test_a_rank_on_another_gpu_than_planned_fails_at_once(fake_cuda):
    ctx = read_context({**LOCAL_RANK_1_OF_2,
                        "DDP_ORCH_GPU_UUIDS": f"GPU-{BARE_UUID},{OTHER_UUID}"})
    with pytest.raises(WorkloadError, match=f"is on GPU GPU-{BARE_UUID} but ddp-orch "
                                            f"planned {OTHER_UUID}"):
        bind_device(ctx)
    assert fake_cuda[0] == "set_device cuda:1"


def test_a_rank_on_its_planned_gpu_goes_on(fake_cuda):
    bind_device(read_context({**LOCAL_RANK_1_OF_2,
                              "DDP_ORCH_GPU_UUIDS": f"{OTHER_UUID},GPU-{BARE_UUID}"}))
    assert fake_cuda == ["set_device cuda:1", "get_device_properties cuda:1"]


@pytest.mark.live
def test_device_cuda_without_a_gpu_fails_instead_of_training_on_cpu(tmp_path):
    run = run_alone(tmp_path, "linear", "--samples", "64", "--epochs", "1",
                    env_extra={"DDP_ORCH_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode != 0 and run.result is None
    line = next(x for x in run.stderr.splitlines() if x.startswith("workloads.harness.context."
                                                                      "WorkloadError"))
    assert f"built for CUDA {torch.version.cuda}" in line
    assert "torch.cuda.is_available() is False" in line
    assert "torch.cuda.device_count() is 0" in line and "CUDA_VISIBLE_DEVICES=''" in line


@pytest.mark.live
def test_auto_alone_without_a_gpu_warns_once_then_trains_on_cpu(tmp_path):
    run = run_alone(tmp_path, "linear", "--samples", "64", "--epochs", "1",
                    env_extra={"DDP_ORCH_DEVICE": "auto", "CUDA_VISIBLE_DEVICES": ""})
    result = run.check()
    warnings = [x for x in run.stdout.splitlines() if "WARNING" in x]
    assert len(warnings) == 1 and "device auto found no usable GPU" in warnings[0]
    assert (result["device"], result["backend"]) == ("cpu", "gloo")
