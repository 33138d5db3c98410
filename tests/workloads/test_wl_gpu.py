"""Real runs on CUDA: NCCL, AMP, SyncBatchNorm, DataParallel, resume, GPU identity.

Marked ``gpu``: conftest skips them, with the reason, where torch sees no
GPU. Each is a few steps on synthetic data (no network, no dataset on disk),
well under 30 s on one H100; the two-GPU ones skip on a one-GPU host.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest
import torch

from wl_support import check_complete, run_alone, run_torchrun

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.live, pytest.mark.gpu]

CUDA = {"DDP_ORCH_DEVICE": "cuda"}
MNIST = ("--data", "synthetic", "--train-samples", "64", "--test-samples", "16",
         "--global-batch-size", "16", "--num-workers", "0")


def gang() -> int:
    """Processes for a multi-rank run: two where there are two GPUs."""
    return min(GPUS, 2)


@pytest.mark.parametrize("launch", ["torchrun", "alone"])
def test_nccl_at_world_size_one(tmp_path, launch):
    args = ("--samples", "256", "--epochs", "1")
    run = (run_torchrun(tmp_path, "linear", *args, nproc=1, env_extra=CUDA)
           if launch == "torchrun" else run_alone(tmp_path, "linear", *args, env_extra=CUDA))
    result = run.check()
    check_complete(result, "linear", 1)
    assert (result["device"], result["backend"]) == ("cuda:0", "nccl")
    assert result["versions"]["cuda"] and result["versions"]["nccl"]


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_mnist_trains_under_amp(tmp_path, amp):
    if amp == "bf16" and torch.cuda.get_device_capability(0) < (8, 0):
        run = run_alone(tmp_path, "mnist", *MNIST, "--epochs", "1", "--amp", amp,
                        env_extra=CUDA)
        assert run.returncode != 0 and "has no native bfloat16" in run.stderr
        return
    result = run_alone(tmp_path, "mnist", *MNIST, "--epochs", "1", "--amp", amp,
                       env_extra=CUDA).check()
    check_complete(result, "mnist", 1)
    assert result["amp"] == amp and math.isfinite(result["metrics"]["final_loss"])


def test_resnet_takes_the_gpus_speed_ups_and_the_tutorials_settings_on_request(tmp_path):
    """(issue 46) On a real GPU: the defaults (bf16 where native, TF32,
    channels_last, cuDNN's benchmark) as the result records them, the
    all-reduce measured by DDP's hook, and seed_settings the tutorial's."""
    args = ("--data", "synthetic", "--train-samples", "256", "--test-samples", "16",
            "--global-batch-size", "64", "--image-size", "64", "--epochs", "1", "--no-eval")
    fast = run_alone(tmp_path, "resnet", *args, name="fast", env_extra=CUDA).check()
    native = torch.cuda.get_device_capability(0) >= (8, 0)
    assert fast["speed"] == {**fast["speed"], "device": "cuda",
                             "amp": "bf16" if native else "off",
                             "tf32": "on" if native else "unsupported", "channels_last": True,
                             "cudnn_benchmark": True, "seed_settings": False}
    assert fast["timing"]["avg_allreduce_s"] >= 0 and fast["timing"]["steps"] == 4
    seed = run_alone(tmp_path, "resnet", *args, "--seed-settings", name="seed",
                     env_extra=CUDA).check()
    assert (seed["speed"]["amp"], seed["speed"]["tf32"], seed["speed"]["channels_last"],
            seed["speed"]["cudnn_benchmark"]) == ("off", "default", False, False)


def test_mnist_uses_sync_batchnorm_over_nccl(tmp_path):
    nproc = gang()
    result = run_torchrun(tmp_path, "mnist", *MNIST, "--epochs", "1", nproc=nproc,
                          env_extra=CUDA).check()
    check_complete(result, "mnist", nproc)
    assert result["backend"] == "nccl" and result["sync_bn"] is True
    native = torch.cuda.get_device_capability(0) >= (8, 0)
    assert result["amp"] == ("bf16" if native else "off")  # auto: bf16 where native
    assert [r["device"] for r in result["rank_table"]] == [f"cuda:{i}" for i in range(nproc)]


@pytest.mark.skipif(GPUS < 2, reason="DataParallel needs two GPUs")
def test_mlp_dataparallel_over_all_gpus(tmp_path):
    result = run_alone(tmp_path, "mlp", "--mode", "dp", "--data", "synthetic",
                       "--train-samples", "256", "--test-samples", "64",
                       "--num-workers", "0", env_extra=CUDA).check()
    check_complete(result, "mlp", 1)
    assert result["mode"] == "dp" and result["metrics"]["dp_gpus"] == GPUS


def test_mnist_resumes_on_a_gpu(tmp_path):
    """The checkpoint (with fp16's GradScaler state) goes from rank 0 to the
    others over NCCL; the resumed run starts where the first one ended."""
    nproc = gang()
    common = (*MNIST, "--checkpoint", "ck.pt")
    first = run_torchrun(tmp_path, "mnist", *common, "--epochs", "1", nproc=nproc,
                         name="first", env_extra=CUDA).check()
    assert torch.load(tmp_path / "ck.pt", weights_only=True)["scaler"]
    resumed = run_torchrun(tmp_path, "mnist", *common, "--epochs", "2", "--resume",
                           nproc=nproc, name="resumed", env_extra=CUDA).check()
    check_complete(resumed, "mnist", nproc)
    per_epoch = first["metrics"]["end_step"]
    assert resumed["resumed"] and resumed["metrics"]["start_epoch"] == 1
    assert resumed["metrics"]["start_step"] == per_epoch
    assert resumed["metrics"]["end_step"] == 2 * per_epoch


def smi_uuids() -> dict[int, str]:
    """nvidia-smi's GPU index -> UUID (its indices follow the PCI bus)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    rows = (line.split(",") for line in out.splitlines() if line.strip())
    return {int(index): uuid.strip() for index, uuid in rows}


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_the_rank_table_names_the_gpus_nvidia_smi_names(tmp_path):
    """With CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA_VISIBLE_DEVICES indices are
    nvidia-smi's; listed in reverse, so that cuda:i is not index i."""
    smi = smi_uuids()
    chosen = sorted(smi, reverse=True)[:gang()]
    planned = [smi[i] for i in chosen]
    env = {**CUDA, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in chosen),
           "DDP_ORCH_GPU_UUIDS": ",".join(planned)}
    result = run_torchrun(tmp_path, "noop", nproc=len(chosen), env_extra=env).check()
    table = result["rank_table"]
    assert [r["gpu_uuid"].lower() for r in table] == [u.lower() for u in planned]
    assert all(r["gpu_name"] and r["cuda_device_order"] == "PCI_BUS_ID" for r in table)


def test_a_gpu_other_than_the_planned_one_stops_the_rank(tmp_path):
    wrong = "GPU-00000000-0000-0000-0000-000000000000"
    run = run_alone(tmp_path, "noop", env_extra={**CUDA, "DDP_ORCH_GPU_UUIDS": wrong})
    assert run.returncode != 0 and run.result is None
    assert f"ddp-orch planned {wrong}" in run.stderr
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in run.stderr


def test_the_launchs_device_probe_agrees_with_torch():
    """``device: auto`` is decided from a probe that reads torch's build and
    asks the CUDA driver without importing torch (``gpuclaim.TorchProbe``):
    on a real GPU it must see what torch sees, and the node's nvidia-smi
    the same GPUs."""
    import os

    from orchestrator.agent.node import gpuclaim, gpus

    seen = gpuclaim.TorchProbe().result()
    assert seen["ok"] and seen["available"], seen
    assert seen["cuda"] == torch.version.cuda
    env_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env_visible is None:  # the probe drops CUDA_VISIBLE_DEVICES; compare where none is set
        assert seen["count"] == torch.cuda.device_count()
    facts = gpus.facts(30)
    if facts["ok"]:
        assert len(facts["gpus"]) == seen["count"]


def test_a_free_gpu_is_chosen_from_the_real_nvidia_smi_and_a_second_run_is_refused_it(tmp_path):
    from orchestrator.agent.node import gpuclaim, gpus

    facts = gpus.facts(30)
    if facts.get("absent"):
        pytest.skip("no nvidia-smi on this GPU machine's PATH")
    assert facts["ok"], facts
    listed = {g["index"]: g for g in facts["gpus"]}
    from orchestrator.agent.node.holdings import Holdings

    locks, holdings = str(tmp_path / "locks"), Holdings()
    first = gpuclaim.claim("all", run_id="gpu-a", node_rank=0, busy_mib=1 << 20,
                           allow_busy=True, lock_dir=locks, holdings=holdings)
    try:
        assert first["ok"], first
        assert first["chosen"] == sorted(listed)
        assert first["uuids"] == [listed[k]["uuid"] for k in first["chosen"]]
        second = gpuclaim.claim([first["chosen"][0]], run_id="gpu-b", node_rank=0,
                                busy_mib=1 << 20, allow_busy=True, lock_dir=locks,
                                holdings=Holdings())
        assert (second["ok"], second["reason"]) == (False, "held"), second
        assert "run gpu-a of" in second["error"]
    finally:
        holdings.release_gpus()


def test_the_probes_compute_capabilities_and_arch_list_are_torchs():
    """The launch reads each GPU's compute capability from the driver and
    torch's arch list from libtorch_python.so, without importing torch: on a
    real GPU they must be what torch itself says."""
    from orchestrator.agent.node import gpuclaim

    seen = gpuclaim.TorchProbe().result()
    assert seen["caps"] == ["%d.%d" % torch.cuda.get_device_capability(i)
                            for i in range(torch.cuda.device_count())], seen
    assert seen["arch"] == torch.cuda.get_arch_list(), seen
    assert "cuda_error" not in seen


def test_the_real_nvidia_smi_answers_the_health_fields_or_says_which_it_does_not():
    from orchestrator.agent.node import gpus

    facts = gpus.facts(30)
    if facts.get("absent"):
        pytest.skip("no nvidia-smi on this GPU machine's PATH")
    assert facts["ok"], facts
    for gpu in facts["gpus"]:
        assert "unreadable" not in gpu, gpu
        assert gpu["compute_mode"] in ("Default", "Exclusive_Process", "Prohibited",
                                       "Exclusive_Thread") or \
            "compute_mode" in facts.get("unreported", ()), gpu
        assert gpus.health(gpu) == [], (gpu, "a lent machine's GPUs should be healthy")
