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
from workloads.catalog import build_parser, describe_speed
from workloads.harness.context import WorkloadError, bind_device, read_context
from workloads.harness.evidence import rank_row
from workloads.harness.speed import resolve_amp, resolve_speed

BARE_UUID = "1a2b3c4d-0000-1111-2222-333344445555"
OTHER_UUID = "GPU-9f8e7d6c-0000-1111-2222-333344445555"
LOCAL_RANK_1_OF_2 = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                     "DDP_ORCH_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "4,5"}


@pytest.fixture
def backends():
    """torch's process-wide TF32 and cuDNN flags, put back after the test."""
    names = ((torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"),
             (torch.backends.cudnn, "benchmark"))
    before = [getattr(obj, name) for obj, name in names]
    yield
    for (obj, name), value in zip(names, before):
        setattr(obj, name, value)


class CallLog(list):
    """The CUDA calls made, in order; ``capability[0]`` is the GPUs'."""

    capability = [(9, 0)]


@pytest.fixture
def fake_cuda(monkeypatch, backends) -> CallLog:
    """Two visible "GPUs" of compute capability 9.0 (``capability[0]`` sets
    another); returns the log of the CUDA calls made, in order."""
    calls = CallLog()
    calls.capability = [(9, 0)]

    def record(name: str, result=None):
        def call(*args, **_kwargs):
            calls.append(" ".join([name, *(str(a) for a in args)]))
            return result
        return call

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid=BARE_UUID, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", record("set_device"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda *a, **k: pytest.fail("is_bf16_supported counts emulation"))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        record("get_device_properties", props))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")

    def cc(device=None):
        calls.append(f"get_device_capability {device}")
        return calls.capability[0]

    monkeypatch.setattr(torch.cuda, "get_device_capability", cc)
    return calls


def test_a_cuda_rank_is_on_its_own_gpu_before_its_capability_is_asked(fake_cuda, monkeypatch):
    """Asked before ``set_device``, a question about "the current device"
    would open a context on cuda:0 in every local rank; the capability
    decides ``--amp``'s and TF32's defaults."""
    for name, value in LOCAL_RANK_1_OF_2.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(mnist, "run_job", lambda job, train: fake_cuda.append("run_job") or {})
    mnist.main(["--amp", "bf16", "--data", "synthetic"])
    asked = [c for c in fake_cuda if not c.startswith("get_device_properties")]
    assert asked == ["set_device cuda:1", "get_device_capability cuda:1", "run_job"]


def cuda_rank():
    return read_context({**LOCAL_RANK_1_OF_2})


@pytest.mark.parametrize("cc,auto", [((9, 0), "bf16"), ((8, 0), "bf16"), ((8, 6), "bf16"),
                                     ((7, 5), "off"), ((7, 0), "off")])
def test_amp_auto_is_bf16_where_the_gpu_has_it_natively_and_off_elsewhere(fake_cuda, cc, auto):
    fake_cuda.capability[0] = cc
    amp = resolve_amp("auto", cuda_rank())
    assert amp.mode == auto and amp.scaler is None
    assert amp.dtype is (torch.bfloat16 if auto == "bf16" else None)
    assert resolve_amp("auto", read_context({}, "cpu")).mode == "off"


@pytest.mark.parametrize("cc", [(7, 0), (7, 5), (6, 1)])
def test_bf16_on_a_gpu_without_it_natively_is_refused_naming_the_gpu(fake_cuda, cc):
    """``torch.cuda.is_bf16_supported()`` says yes on a V100 or a T4, where
    bf16 is emulated; the capability says what runs natively (8.0 and up)."""
    fake_cuda.capability[0] = cc
    with pytest.raises(WorkloadError) as err:
        resolve_amp("bf16", cuda_rank())
    assert str(err.value) == (
        f"--amp bf16: Tesla V100-SXM2-16GB (compute capability {cc[0]}.{cc[1]}) has no native "
        "bfloat16, which needs 8.0 or newer; torch would emulate it, slower than fp32: use "
        "--amp fp16 (with GradScaler) or --amp off")
    assert resolve_amp("fp16", cuda_rank()).scaler is not None


def speed_of(workload: str, *argv: str, ctx=None):
    args = build_parser(workload).parse_args(list(argv))
    return resolve_speed(args, ctx or cuda_rank(), workload)


def test_the_speed_defaults_on_a_recent_gpu_and_each_option_off(fake_cuda):
    on = speed_of("resnet")
    assert (on.amp.mode, on.tf32, on.channels_last, on.cudnn_benchmark) == \
        ("bf16", "on", True, True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cudnn.benchmark and on.memory_format is torch.channels_last
    off = speed_of("resnet", "--amp", "off", "--no-tf32", "--no-channels-last",
                   "--no-cudnn-benchmark")
    assert (off.amp.mode, off.tf32, off.channels_last, off.cudnn_benchmark) == \
        ("off", "off", False, False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.benchmark and off.memory_format is torch.contiguous_format
    assert speed_of("mlp").channels_last is None  # no ConvNet
    fake_cuda.capability[0] = (7, 0)
    assert speed_of("resnet").tf32 == "unsupported"


@pytest.mark.parametrize("workload,amp", [("resnet", "off"), ("mlp", "off"), ("mnist", "fp16")])
def test_seed_settings_are_the_tutorials_whatever_the_options_say(fake_cuda, workload, amp):
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    convnet = ("--channels-last",) if workload != "mlp" else ()
    seed = speed_of(workload, "--seed-settings", "--amp", "bf16", *convnet)
    assert (seed.amp.mode, seed.tf32, seed.cudnn_benchmark, seed.seed_settings) == \
        (amp, "default", False, True)
    assert seed.channels_last in (False, None)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == \
        (False, True)  # torch's defaults, untouched
    cpu = speed_of(workload, "--seed-settings", ctx=read_context({}, "cpu"))
    assert cpu.amp.mode == "off"  # the tutorial's fp16 needs CUDA


def test_the_speed_line_names_every_option_and_its_value():
    gpu = {"device": "cuda", "amp": "bf16", "amp_requested": "auto", "tf32": "on",
           "channels_last": True, "cudnn_benchmark": True, "seed_settings": False,
           "loader_workers": 3, "loader_workers_auto": True}
    assert describe_speed(gpu) == ("amp bf16 (auto), tf32 on, channels_last on, "
                                   "cudnn.benchmark on; 3 loader workers per rank (auto)")
    seed = {**gpu, "amp": "off", "amp_requested": "off", "tf32": "default",
            "channels_last": None, "cudnn_benchmark": False, "seed_settings": True,
            "loader_workers": 1, "loader_workers_auto": False}
    assert describe_speed(seed) == (
        "the tutorial's settings (seed_settings): amp off, tf32 torch's default (convolutions "
        "only), cudnn.benchmark off; 1 loader worker per rank")
    cpu = {"device": "cpu", "amp": "off", "amp_requested": "auto", "loader_workers": 0,
           "loader_workers_auto": True}
    assert describe_speed(cpu) == ("on the CPU: amp off (auto) (TF32, channels_last and "
                                   "cuDNN's benchmark are GPU options); 0 loader workers per "
                                   "rank (auto)")


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
