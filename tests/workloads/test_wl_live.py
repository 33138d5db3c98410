"""Live runs: each workload under torchrun with 2 CPU processes, as ddp-orch launches it.

Small on purpose (a few steps, tiny images): CI has two cores. linear, toy
and mnist run on a node with torch alone (``wl_support.no_numpy``), as the
README promises: that is what test_wl_no_numpy.py proved with runs of its
own, now proven by these (its gang-restart resume without numpy is
test_mnist_resume_continues_exactly's). mlp's and resnet's runs are in
test_wl_orchestrated.py, through ``ddp-orch up``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ports import free_port
from wl_support import (TIMEOUT_S, _finish, check_complete, no_numpy, run_alone,
                        run_torchrun, without_numpy, workload_env)

pytestmark = pytest.mark.live


def test_noop_across_two_simulated_nodes_with_static_rendezvous(tmp_path):
    """The exact launch ddp-orch uses, one torchrun per "node", device cpu."""
    port = str(free_port())
    result_file = str(tmp_path / "result.json")
    procs = []
    for node, gpus in ((0, "3"), (1, "0")):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(node), "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", port,
               "--rdzv-backend", "static", "--max-restarts", "0",
               "--log-dir", str(tmp_path / f"logs{node}"), "-m", "workloads.noop"]
        env = workload_env(result_file if node == 0 else str(tmp_path / "node1.json"),
                           CUDA_VISIBLE_DEVICES=gpus, DDP_ORCH_RUN_ID="run-42")
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{out}\n{err[-3000:]}"
    result = _finish(subprocess.CompletedProcess([], 0, outs[0][0], outs[0][1]),
                     result_file).check()
    check_complete(result, "noop", 2)
    assert not os.path.exists(tmp_path / "node1.json")  # only global rank 0 writes
    table = result["rank_table"]
    assert [(r["node_rank"], r["local_rank"]) for r in table] == [(0, 0), (1, 0)]
    assert [r["cuda_visible_devices"] for r in table] == ["3", "0"]
    assert all(r["device"] == "cpu" for r in table)
    assert result["metrics"]["all_reduce_value"] == 2.0
    assert result["run_id"] == "run-42" and result["nodes"] == 2
    assert result["data"] == "none" and result["backend"] == "gloo"
    assert "[noop run-42] data=none" in outs[0][0]


def test_noop_alone_only_prints_a_summary(tmp_path):
    run = run_alone(tmp_path, "noop", name=None)
    assert run.returncode == 0, run.stderr
    assert "summary" in run.stdout and "no result file" in run.stdout
    assert os.listdir(tmp_path) == []


def test_bad_config_fails_fast_with_torchrun_error_files(tmp_path):
    """@record puts the WorkloadError's message in each rank's error file."""
    import glob
    import json

    logs = tmp_path / "logs"
    run = run_torchrun(tmp_path, "linear", "--global-batch-size", "0",
                       launcher_args=("--log-dir", str(logs)))
    assert run.returncode != 0 and run.result is None
    files = sorted(glob.glob(str(logs / "**" / "error.json"), recursive=True))
    # the first rank to fail gets the other one killed, possibly before it writes
    assert 1 <= len(files) <= 2
    for path in files:
        with open(path, encoding="utf-8") as fh:
            message = json.load(fh)["message"]["message"]
        assert "WorkloadError: --global-batch-size must be positive, got 0" in message


def test_linear_on_an_uneven_world_converges_and_equals_a_single_process_run(tmp_path):
    """Seed 001's averaging math on an uneven world: 3 ranks, global batch
    32 dealt 11,11,10 (last batch of each epoch: 8 as 3,3,2), losses
    weighted by share: the one-process steps, to float rounding, and every
    sample once per epoch (no padding). (It was also run on 2 ranks x 16:
    an even split is the case of equal shares, and the 3 + 4 layout's 32 =
    4 x 5 + 3 x 4 is test_wl_seed_layout.py's.)"""
    args = ("--samples", "1000", "--epochs", "2", "--global-batch-size", "32", "--lr", "0.1")
    ddp = without_numpy(run_torchrun(tmp_path, "linear", *args, nproc=3, name="ddp",
                                     env_extra=no_numpy(tmp_path)))
    single = run_alone(tmp_path, "linear", *args, name="single").check()
    check_complete(ddp, "linear", 3)
    check_complete(single, "linear", 1)
    w, b = ddp["metrics"]["w"], ddp["metrics"]["b"]
    assert abs(w - 2) < 0.05 and abs(b - 3) < 0.05
    assert ddp["batch_split"] == [11, 11, 10] and ddp["metrics"]["per_rank_batch"] == 11
    assert single["metrics"]["per_rank_batch"] == 32
    assert ddp["timing"]["steps"] == single["timing"]["steps"] == 2 * 32
    assert ddp["timing"]["samples"] == single["timing"]["samples"] == 2000
    assert abs(w - single["metrics"]["w"]) < 1e-5 and abs(b - single["metrics"]["b"]) < 1e-5
    for key in ("w", "b", "final_loss"):
        assert ddp["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert ddp["data"] == "generated" and ddp["init_replicas_identical"]
    timing = ddp["timing"]
    assert timing["samples_per_s"] > 0
    assert 0 < len(timing["series"]["rows"]) <= 1000
    assert ddp["loss_curve"] and ddp["loss_curve"][-1][0] == 2 * 32


def test_toy_accuracy_is_reduced_over_all_ranks(tmp_path):
    result = without_numpy(run_torchrun(tmp_path, "toy", env_extra=no_numpy(tmp_path)))
    check_complete(result, "toy", 2)
    m = result["metrics"]
    # every example counted once over both ranks (exact shards, no padding)
    assert (m["train_total"], m["test_total"]) == (5, 2)
    assert m["train_accuracy"] >= 0.8 and m["test_accuracy"] >= 0.5
    assert m["train_correct"] == round(m["train_accuracy"] * 5)


# test_mlp_on_tiny_real_cifar10: its run and every check are
# test_wl_orchestrated.py's test_workload_under_ddp_orch_up_local[mlp] now.


def test_mlp_dp_mode_refuses_without_gpus(tmp_path):
    run = run_alone(tmp_path, "mlp", "--mode", "dp")
    assert run.returncode != 0 and run.result is None
    assert "--mode dp needs at least 2 visible CUDA devices" in run.stderr


def test_mnist_resume_continues_exactly(tmp_path):
    """2 epochs straight == 1 epoch, then a gang restart (as ``up
    --max-restarts`` makes it: the default checkpoint.pt of a run that may
    restart, resumed by DDP_ORCH_RESTART_COUNT) that continues from it, bit
    for bit, on a node without numpy: the checkpoint travels from rank 0 to
    the others (and rank 0 says whether there is one) with no
    ``broadcast_object_list``, which needs numpy. Synthetic data, because
    torchvision's MNIST reader imports numpy (real tiny MNIST: the 3 + 4
    layout's run in test_wl_seed_layout.py); ``--resume``'s own path:
    test_wl_inprocess.py's resnet resume test."""
    env = no_numpy(tmp_path)
    restarts = {**env, "DDP_ORCH_MAX_RESTARTS": "1"}
    common = ("--data", "synthetic", "--train-samples", "48", "--test-samples", "20",
              "--global-batch-size", "8", "--lr", "0.01", "--momentum", "0.9")
    # Only the straight run loads through DataLoader workers (each rank's
    # forkserver imports torch again, seconds of CPU): the interrupted and
    # resumed runs load in-process, and must still match it bit for bit.
    straight = without_numpy(run_torchrun(tmp_path, "mnist", *common, "--num-workers", "1",
                                          "--epochs", "2", "--checkpoint", "two.pt",
                                          name="two", env_extra=env))
    first = without_numpy(run_torchrun(tmp_path, "mnist", *common, "--num-workers", "0",
                                       "--epochs", "1", name="first", env_extra=restarts))
    assert (tmp_path / "checkpoint.pt").exists()  # the default of a run that may restart
    again = run_torchrun(tmp_path, "mnist", *common, "--num-workers", "0", "--epochs", "2",
                         name="again", env_extra={**restarts, "DDP_ORCH_RESTART_COUNT": "1"})
    resumed = without_numpy(again)
    for result in (straight, first, resumed):
        check_complete(result, "mnist", 2)
        assert result["data"] == "synthetic"
        assert result["sync_bn"] is False and "CUDA" in result["sync_bn_reason"]
    per_epoch = first["metrics"]["end_step"]
    assert per_epoch == 48 // 8
    assert f"resuming from checkpoint.pt (epoch 1, step {per_epoch})" in again.stdout
    assert resumed["resumed"] and resumed["metrics"]["start_step"] == per_epoch
    assert resumed["metrics"]["start_epoch"] == 1 and resumed["timing"]["steps"] == per_epoch
    assert resumed["metrics"]["end_step"] == straight["metrics"]["end_step"] == 2 * per_epoch
    assert resumed["checksum"] == straight["checksum"]
    a = torch.load(tmp_path / "two.pt", weights_only=True)
    b = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) == (2, 2 * per_epoch)
    for key, tensor in a["model"].items():
        assert torch.allclose(tensor.double(), b["model"][key].double(), atol=1e-6), key
    for slot, state in a["optimizer"]["state"].items():
        assert torch.allclose(state["momentum_buffer"],
                              b["optimizer"]["state"][slot]["momentum_buffer"], atol=1e-6)
    assert resumed["metrics"]["test_accuracy"] == straight["metrics"]["test_accuracy"]


# test_resnet_on_synthetic_data_reports_the_time_breakdown: its run and every
# check are test_wl_orchestrated.py's test_workload_under_ddp_orch_up_local[resnet].


def test_collective_across_two_simulated_nodes_reports_the_pair_and_the_gang(tmp_path):
    """The collective smoke test's program, one torchrun per "node" of two
    ranks each (gloo): the pair of nodes (their first ranks) and the whole
    gang of 4 complete, timed, with a bus bandwidth; ranks end at once."""
    import json

    port = str(free_port())
    result_file = str(tmp_path / "result.json")
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(node), "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", port,
               "--rdzv-backend", "static", "--max-restarts", "0",
               "--log-dir", str(tmp_path / f"logs{node}"), "-m", "workloads.collective",
               "--bound", "20", "--device", "cpu"]
        env = workload_env(result_file if node == 0 else str(tmp_path / "node1.json"))
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{out}\n{err[-3000:]}"
    with open(result_file, encoding="utf-8") as fh:
        got = json.load(fh)
    assert (got["backend"], got["world_size"]) == ("gloo", 4)
    assert [n["ranks"] for n in got["nodes"]] == [[0, 1], [2, 3]]
    [pair] = got["pairs"]
    assert (pair["nodes"], pair["ranks"], pair["ok"]) == ([0, 1], [0, 2], True)
    assert pair["seconds"] > 0 and pair["busbw_gbps"] > 0
    assert got["gang"]["ok"] is True and got["gang"]["busbw_gbps"] > 0
    assert not os.path.exists(tmp_path / "node1.json")
