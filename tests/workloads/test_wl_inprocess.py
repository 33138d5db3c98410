"""Harness behaviour inside a one-process gloo group (no torchrun, no subprocess)."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workloads.harness import data as hdata
from workloads.harness.context import WorkloadError, process_group, read_context
from workloads.harness.report import RankZeroLog
from workloads.harness.speed import resolve_amp
from workloads.harness.train import Trainer, evaluate, make_step, wrap_ddp


@pytest.fixture
def one_thread():
    """torch on one thread for the test, as every rank runs (OMP_NUM_THREADS=1):
    on a loaded 2-core machine its default of one thread per core made a
    tiny ResNet-18 run ten times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def ctx():
    """A world of one on the CPU, with its process group open for the test."""
    c = read_context({}, "cpu")
    with process_group(c):
        yield c


def linear_data(n: int = 100):
    from workloads.linear import make_dataset

    return make_dataset(n, seed=0)


def make_trainer(ctx, **kw) -> tuple[Trainer, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    ddp = wrap_ddp(model, ctx)
    loader = hdata.train_loader(linear_data(), ctx, 10, seed=1)
    step = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), nn.MSELoss())
    return Trainer(ctx, loader, step, RankZeroLog(ctx, "t"), seed=1, **kw), model


def test_trainer_runs_whole_epochs(ctx, capsys):
    trainer, model = make_trainer(ctx, epochs=3)
    trainer.run()
    assert (trainer.step, trainer.epoch, trainer.epoch_complete) == (30, 3, True)
    assert trainer.timer.steps == 30 and trainer.global_samples() == 300
    assert len(trainer.loss_curve.rows) == 30  # curve every len(loader)//10 = 1 step
    assert trainer.loss_curve.rows[-1][1] < trainer.loss_curve.rows[0][1]
    lines = [l for l in capsys.readouterr().out.splitlines() if "epoch" in l]
    assert len(lines) == 3 and lines[0].startswith("[t] epoch 1/3 step 10 loss")


def test_trainer_stops_at_max_steps_mid_epoch(ctx):
    trainer, _ = make_trainer(ctx, epochs=5, max_steps=15)
    trainer.run()
    assert trainer.stopped and trainer.step == 15
    assert trainer.epoch == 1 and not trainer.epoch_complete  # only one full epoch done


def test_trainer_log_every_prints_per_n_steps_then_the_epoch_mean(ctx, capsys):
    trainer, _ = make_trainer(ctx, epochs=1, log_every=4)
    trainer.run()
    lines = capsys.readouterr().out.splitlines()
    steps = [l.split(" step ")[1].split()[0] for l in lines]
    assert steps == ["4", "8", "10", "10"]
    assert lines[-1].endswith("(over the epoch's 10 steps)")
    assert f"loss {trainer.epoch_loss:.5f}" in lines[-1]


def test_epoch_loss_is_the_sample_weighted_mean_of_the_epochs_step_losses(ctx, capsys):
    """100 samples in global batches of 30: steps of 30, 30, 30 and 10, logged
    every 3 steps, so the epoch's last window is the 1-step stub of 10. The
    epoch's loss is its mean over all 100 samples, not that stub's."""
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    ddp = wrap_ddp(model, ctx)
    loader = hdata.train_loader(linear_data(100), ctx, 30, seed=1)
    step = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), nn.MSELoss())
    seen: list[tuple[float, int]] = []

    def recording(inputs, targets, weight=1.0):
        loss, out = step(inputs, targets, weight)
        seen.append((loss.item(), len(targets)))
        return loss, out

    trainer = Trainer(ctx, loader, recording, RankZeroLog(ctx, "t"), seed=1, epochs=2,
                      log_every=3)
    trainer.run()
    assert [n for _, n in seen] == [30, 30, 30, 10] * 2
    means = [sum(l * n for l, n in epoch) / 100 for epoch in (seen[:4], seen[4:])]
    assert trainer.epoch_loss == pytest.approx(means[1], rel=1e-12)
    assert [row[2] for row in trainer.epoch_curve] == pytest.approx(means, rel=1e-12)
    assert [row[:2] for row in trainer.epoch_curve] == [[1, 4], [2, 8]]
    assert trainer.last_loss == pytest.approx(seen[-1][0])  # the stub window
    assert trainer.epoch_loss != pytest.approx(trainer.last_loss, rel=1e-3)
    epoch_lines = [l for l in capsys.readouterr().out.splitlines() if "over the epoch" in l]
    assert [f"loss {m:.5f}" in l for m, l in zip(means, epoch_lines)] == [True, True]


def test_linear_final_loss_is_the_last_epochs_mean_at_the_noise_floor(ctx, monkeypatch):
    """linear's final_loss is its last epoch's mean loss: the sample-weighted
    mean of that epoch's step losses, and (trained) at the data's own noise
    floor, mean((y - 2x - 3)^2) ~ 0.01, not below it as a stub window can be."""
    import workloads.linear as linear
    from workloads.harness.job import start

    seen: list[tuple[float, int]] = []

    def recording_make_step(*args, **kwargs):
        step = make_step(*args, **kwargs)

        def wrapped(inputs, targets, weight=1.0):
            loss, out = step(inputs, targets, weight)
            seen.append((loss.item(), len(targets)))
            return loss, out
        return wrapped

    monkeypatch.setattr(linear, "make_step", recording_make_step)
    monkeypatch.delenv("DDP_ORCH_RESULT_FILE", raising=False)
    result = linear.train(start("linear", ["--samples", "2000", "--epochs", "6",
                                           "--device", "cpu"]))
    per_epoch = 63  # ceil(2000 / 32), the last step 16 samples
    assert len(seen) == 6 * per_epoch and seen[-1][1] == 16
    last = seen[-per_epoch:]
    expected = sum(l * n for l, n in last) / sum(n for _, n in last)
    assert result["metrics"]["final_loss"] == pytest.approx(expected, rel=1e-9)
    assert result["epoch_curve"][-1][:3] == [6, 6 * per_epoch, result["metrics"]["final_loss"]]
    x, y = linear.make_dataset(2000, 42).tensors
    floor = float(((y - 2 * x - 3) ** 2).mean())
    assert 0.95 * floor <= result["metrics"]["final_loss"] <= 1.2 * floor
    assert result["data_source"] == "2000 points of y = 2x + 3 + 0.1*noise"  # the summary's


def test_trainer_resumes_step_and_epoch_counters(ctx):
    trainer, _ = make_trainer(ctx, epochs=3, start_epoch=2, start_step=20)
    trainer.run()
    assert (trainer.step, trainer.epoch, trainer.timer.steps) == (30, 3, 10)


@pytest.mark.parametrize("start_epoch", [0, 2])
def test_each_step_heartbeat_carries_the_ranks_samples_so_far(ctx, monkeypatch, start_epoch):
    """The step report's samples: this rank's training samples since the
    run began, a resumed run's whole epochs before it included (100 points
    in global batches of 10 over one rank: 10 steps of 10 an epoch)."""
    from workloads.harness import train

    beats, times = [], []
    monkeypatch.setattr(train, "heartbeat", lambda step, samples=None, compute_s=None,
                        data_s=None: (beats.append((step, samples)),
                                      times.append((compute_s, data_s))))
    trainer, _ = make_trainer(ctx, epochs=3, start_epoch=start_epoch, start_step=10 * start_epoch)
    trainer.run()
    assert beats == [(step, 10 * step) for step in range(10 * start_epoch + 1, 31)]
    # and every step's time outside collectives: its forward pass, its wait for data
    assert all(isinstance(c, float) and c > 0 and isinstance(d, float) and d >= 0
               for c, d in times), times


@pytest.mark.parametrize("rank", range(7))
def test_a_resumed_ranks_samples_before_are_its_share_of_each_whole_epoch(rank):
    """32 over 7 ranks (5,5,5,5,4,4,4), 100 samples an epoch: the last
    global batch (4) gives ranks 0-3 one more and the rest none."""
    from types import SimpleNamespace

    sampler = hdata.GlobalBatchSampler(100, hdata.BatchSplit(32, 7), rank, shuffle=False, seed=0)
    me = SimpleNamespace(loader=SimpleNamespace(batch_sampler=sampler))
    assert Trainer._epoch_share(me) == sum(len(batch) for batch in sampler)


def test_evaluate_counts_every_example_once(ctx):
    from torch.utils.data import TensorDataset

    x = torch.randn(11, 2)
    y = (x[:, 0] > 0).long()
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
        model.bias.zero_()
    ev = evaluate(ctx, model, hdata.eval_loader(TensorDataset(x, y), ctx, 4))
    assert (ev["correct"], ev["total"], ev["accuracy"]) == (11, 11, 1.0)
    assert model.training  # mode restored


def test_amp_policy_on_cpu():
    cpu = read_context({}, "cpu")
    assert resolve_amp("auto", cpu).dtype is None
    assert resolve_amp("off", cpu).scaler is None
    assert resolve_amp("bf16", cpu).dtype is torch.bfloat16
    with pytest.raises(WorkloadError, match="fp16 needs CUDA"):
        resolve_amp("fp16", cpu)


def test_bf16_autocast_step_on_the_mnist_convnet(ctx):
    from workloads.mnist import ConvNet

    torch.manual_seed(0)
    model = ConvNet()
    ddp = wrap_ddp(model, ctx)
    step = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), F.cross_entropy,
                     resolve_amp("bf16", ctx))
    loss, out = step(torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]))
    assert math.isfinite(loss.item()) and out.dtype == torch.bfloat16


def test_an_empty_share_steps_with_zero_gradients_on_the_mnist_convnet(ctx):
    """A rank with no samples in a step (4 over 7 ranks) still joins DDP's
    all-reduce with a zero gradient for every parameter, and reports no loss."""
    from workloads.mnist import ConvNet

    torch.manual_seed(0)
    model = ConvNet()
    before = [p.detach().clone() for p in model.parameters()]
    ddp = wrap_ddp(model, ctx)
    step = make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), F.cross_entropy)
    loss, out = step(torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long), 0.0)
    assert loss.item() == 0.0 and tuple(out.shape) == (0, 10)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_sync_bn_is_cuda_only_with_a_reason():
    from workloads.mnist import sync_bn_choice

    use, reason = sync_bn_choice(read_context({}, "cpu"), True)
    assert use is False and "CUDA" in reason
    assert sync_bn_choice(read_context({}, "cpu"), False) == (False, "disabled by --no-sync-bn")


def test_checkpoint_save_is_atomic_and_loads_back(ctx, tmp_path):
    from workloads.harness.checkpoint import load as load_checkpoint
    from workloads.harness.checkpoint import save as save_checkpoint

    path = str(tmp_path / "sub" / "ck.pt")
    save_checkpoint(path, {"epoch": 1, "step": 5, "model": {"w": torch.ones(2)}})
    assert os.listdir(tmp_path / "sub") == ["ck.pt"]  # no temp file left behind
    state = load_checkpoint(ctx, path)
    assert state["epoch"] == 1 and torch.equal(state["model"]["w"], torch.ones(2))
    with pytest.raises(WorkloadError, match="cannot resume"):
        load_checkpoint(ctx, str(tmp_path / "missing.pt"))


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "world size 2"),
    ({}, "at least 2 visible CUDA devices"),
])
def test_mlp_dp_mode_refuses_what_it_cannot_do(env, message):
    from workloads.mlp import check_dp

    with pytest.raises(WorkloadError, match=message):
        check_dp(read_context(env, "cpu"))


def test_ranks_on_the_same_data_pass_the_data_check(ctx, tmp_path):
    from workloads.harness import datasets

    data = datasets.load(datasets.MNIST, str(tmp_path), "auto", train_samples=8, test_samples=4)
    datasets.check_same_everywhere(ctx, data)  # a real all-gather over the world of one


def test_a_node_without_the_dataset_is_refused_not_reported_as_real(ctx, tiny_data, tmp_path,
                                                                     monkeypatch):
    """Node 0 finds MNIST, node 1 does not and would train on synthetic data
    while the result (node 0's) says real: every rank refuses instead."""
    from workloads.harness import datasets, evidence

    real = datasets.load(datasets.MNIST, tiny_data, "auto")
    fake = datasets.load(datasets.MNIST, str(tmp_path), "auto", train_samples=8, test_samples=4)
    everyone = [["real", 0, "gpu-a", real.source], ["real", 0, "gpu-a", real.source],
                ["synthetic", 1, "gpu-b", fake.source]]
    monkeypatch.setattr(evidence, "all_gather_json", lambda _ctx, _value: everyone)
    with pytest.raises(WorkloadError) as caught:
        datasets.check_same_everywhere(ctx, real)
    message = str(caught.value)
    assert message.startswith(f"the ranks would train on different data: node 0 (gpu-a): "
                              f"{real.source}; node 1 (gpu-b): {fake.source}. ")
    assert "--data synthetic" in message and "on every node" in message


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # @record, under capsys
def test_resnet_resumes_from_its_own_checkpoint_as_if_never_stopped(tmp_path, monkeypatch,
                                                                    capsys, one_thread):
    """resnet's checkpoint wiring (``resume_state``, ``restore``,
    ``epoch_saver`` in workloads/resnet.py), in a world of one on tiny
    images: 2 epochs straight end on the same weights as 1 epoch followed
    by the rest resumed from the checkpoint that epoch saved -- after a gang
    restart (``DDP_ORCH_RESTART_COUNT``, the default ``checkpoint.pt`` of a
    run that may restart) and with ``--resume``. A resnet that saved nothing
    cannot resume; one that loaded but did not restore starts at epoch 0
    again (start_epoch, steps) or from fresh weights and momentum (checksum).
    This is what test_long_runs.py's resnet resume case (a two-host gang
    restart) proved for resnet; the checkpoint's travel from rank 0 to the
    other ranks is the harness's, proven there by its mnist case and by
    test_wl_live.py's test_mnist_resume_continues_exactly."""
    import shutil

    import workloads.resnet as resnet

    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DDP_ORCH_RESULT_FILE",
                 "DDP_ORCH_RESTART_COUNT", "DDP_ORCH_MAX_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
    common = ["--data", "synthetic", "--train-samples", "8", "--test-samples", "4",
              "--image-size", "8", "--global-batch-size", "4", "--no-eval",
              "--num-workers", "0", "--device", "cpu", "--log-every", "100"]
    straight = resnet.main([*common, "--epochs", "2"])
    assert not os.path.exists("checkpoint.pt")  # no restarts, no --checkpoint: none kept
    monkeypatch.setenv("DDP_ORCH_MAX_RESTARTS", "1")
    first = resnet.main([*common, "--epochs", "1"])
    assert os.path.exists("checkpoint.pt")  # the default of a run that may restart
    shutil.copy("checkpoint.pt", "split.pt")
    capsys.readouterr()
    monkeypatch.setenv("DDP_ORCH_RESTART_COUNT", "1")
    restarted = resnet.main([*common, "--epochs", "2"])
    assert "restart 1: resuming from checkpoint.pt (epoch 1, step 2)" in capsys.readouterr().out
    monkeypatch.delenv("DDP_ORCH_RESTART_COUNT")
    monkeypatch.delenv("DDP_ORCH_MAX_RESTARTS")
    resumed = resnet.main([*common, "--epochs", "2", "--resume", "--checkpoint", "split.pt"])

    assert straight["resumed"] is False and straight["metrics"]["start_epoch"] == 0
    assert straight["timing"]["steps"] == 4 and first["timing"]["steps"] == 2
    assert first["checksum"] != straight["checksum"]  # the second epoch changes the weights
    for result in (restarted, resumed):
        assert result["resumed"] is True
        assert result["metrics"]["start_epoch"] == 1 and result["metrics"]["end_epoch"] == 2
        assert result["timing"]["steps"] == 2  # only the second epoch's
        assert result["checksum"] == straight["checksum"]
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # the restarted run's
    assert (saved["workload"], saved["epoch"], saved["step"]) == ("resnet", 2, 4)
