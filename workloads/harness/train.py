"""The training loop shared by every workload, plus its small helpers.

``Trainer`` owns the bookkeeping that each seed tutorial repeats by hand:
``sampler.set_epoch`` and per-rank re-seeding every epoch, the step clocks,
a loss (and accuracy) accumulated *on the device* and read only at log
points -- a ``loss.item()`` per step would force a host sync per step and
distort the very timings being measured -- and rank-0 progress lines. What a
step does is the workload's ``step_fn`` (usually ``make_step``).

Two losses come out of it, and they answer different questions:

* the *window* loss (``last_loss``, the points of ``loss_curve``): the mean
  over the last ``log_every`` steps (or a tenth of an epoch), for curves. The
  last window of an epoch can be a stub of a few steps, so it is no measure
  of the epoch;
* the *epoch* loss (``epoch_loss``, ``epoch_curve``, a workload's
  ``final_loss``): the mean over every sample of the epoch, all ranks. Each
  step's global-batch mean is sum_r n_r * m_r / N (rank r's mean m_r over its
  n_r of the N samples; the same as sum_r w_r * m_r / W with BatchSplit's
  weights w_r = n_r * W / N), and the epoch's is the sample-weighted mean of
  those: sum over steps and ranks of n_r * m_r, over the epoch's samples.
  That is exactly what the windows accumulate, so the epoch totals are the
  sums of its windows' all-reduced totals (windows never span two epochs)
  and cost no collective of their own.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workloads.contract import heartbeat
from torch.utils.data import DataLoader

from workloads.harness.context import DistContext
from workloads.harness.data import seed_epoch
from workloads.harness.evidence import broadcast_buffers
from workloads.harness.report import RankZeroLog
from workloads.harness.speed import Amp
from workloads.harness.timing import NO_CLOCK, CappedSeries, StepTimer, StepTimes, clock_for, now

# step_fn(inputs, targets, loss_weight) -> (mean loss over the batch, outputs)
StepFn = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def wrap_ddp(model: nn.Module, ctx: DistContext) -> DDP:
    """DDP on this rank's device.

    find_unused_parameters stays False: every parameter of these models gets
    a gradient each step, and the option would make DDP traverse the autograd
    graph after every forward to look for unused ones (pure overhead).
    """
    ids = [ctx.torch_device().index] if ctx.is_cuda else None
    return DDP(model, device_ids=ids)


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer,
              loss_fn: Callable, amp: Amp | None = None) -> StepFn:
    """One optimizer step on a batch; returns (loss, outputs), both on device.

    ``loss_fn`` returns the mean over the batch's samples. The gradient is
    taken of that mean times ``weight``, this rank's share of the global
    batch relative to an even one (``BatchSplit.loss_weight``; 1 when the
    split is even), so DDP's average is the global batch's mean gradient. An
    empty batch backpropagates a zero through the model instead of a mean
    over nothing (NaN): every parameter still gets its (zero) gradient, as
    DDP's all-reduce needs, and the returned loss is 0 over 0 samples.

    The step marks its phases on ``step.clock``, which the ``Trainer`` sets
    to its own (``timing.StepClock``): the forward pass and loss (the part
    before the gradients' all-reduce, which runs inside ``backward()`` and
    waits for the slowest rank: the rank's compute outside collectives, which
    ``ddp-orch top`` compares), and the end of backward. On a DDP model a
    communication hook marks each gradient bucket's readiness before its
    all-reduce (``timed_allreduce``), so the clock can tell the all-reduce's
    exposed wait from the compute. Nothing here waits for the device, except
    fp16's GradScaler, which reads its overflow check on the host every step.
    """
    amp = amp or Amp("off", "cpu", None, None)

    def step(inputs: torch.Tensor, targets: torch.Tensor, weight: float = 1.0):
        clock = step.clock
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            outputs = model(inputs)
            loss = loss_fn(outputs, targets) if len(targets) else outputs.sum()
            objective = loss if weight == 1.0 else loss * weight
        clock.forward_done()
        if amp.scaler is not None:
            amp.scaler.scale(objective).backward()
            clock.backward_done()
            amp.scaler.step(optimizer)
            amp.scaler.update()
        else:
            objective.backward()  # DDP all-reduces (averages) gradients here
            clock.backward_done()
            optimizer.step()
        return loss, outputs

    step.clock = NO_CLOCK
    if isinstance(model, DDP):
        group = model.process_group
        model.register_comm_hook(None, lambda _state, bucket: timed_allreduce(step, group,
                                                                              bucket))
    return step


def timed_allreduce(step: Any, group: Any, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP's own all-reduce of a gradient bucket, after marking that the
    bucket's gradients are ready (on ``step.clock``).

    What DDP does without a hook, value for value: each gradient times 1/W
    (DDP scales as it copies into the bucket; here the bucket, after), then
    a sum over the ranks, so the averaged gradients are the same bits.
    """
    step.clock.grads_ready()
    buffer = bucket.buffer()
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


class Trainer:
    """Epochs of ``step_fn`` over ``loader`` with clocks, curves and logging.

    ``loader`` comes from ``harness.data.train_loader``: its batch sampler
    deals every global batch to all ranks, so all run the same number of
    steps (the periodic all_reduce of the loss window is a well-formed
    collective), and it says each step's global batch, which weights this
    rank's loss (``BatchSplit.loss_weight``).
    ``epoch``/``step`` may start past zero when resuming from a checkpoint.
    ``prepare`` turns a batch's inputs, once on the device, into the model's
    (``datasets.ImagePipeline``; as they are by default). The step times
    come from a ``StepClock`` on the rank's device, which the step function
    marks too when it has a ``clock`` (``make_step``'s).
    """

    def __init__(self, ctx: DistContext, loader: DataLoader, step_fn: StepFn,
                 log: RankZeroLog, *, epochs: int, seed: int, max_steps: int = 0,
                 log_every: int = 0, classify: bool = False,
                 start_epoch: int = 0, start_step: int = 0,
                 prepare: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.ctx, self.loader, self.step_fn, self.log = ctx, loader, step_fn, log
        self.prepare = prepare
        self.clock = clock_for(ctx.is_cuda)
        if hasattr(step_fn, "clock"):
            step_fn.clock = self.clock
        self.epochs, self.seed, self.max_steps = epochs, seed, max_steps
        self.log_every, self.classify = log_every, classify
        self.epoch, self.step = start_epoch, start_step
        self.curve_every = log_every or max(1, len(loader) // 10)
        self.timer = StepTimer()
        self.loss_curve = CappedSeries()
        self.acc_curve = CappedSeries()
        self.local_samples = 0  # this rank's training samples in this attempt
        # and over the epochs a resumed run starts after (for its step heartbeat)
        self.samples_before = start_epoch * self._epoch_share() if start_epoch else 0
        self.stopped = False
        self.epoch_complete = False  # did the last epoch run to its end?
        self.last_loss = math.nan  # the last window's mean (see module doc)
        self.last_acc: float | None = None
        self.epoch_loss = math.nan  # the last epoch's mean over all its samples
        self.epoch_acc: float | None = None
        self.epoch_curve: list[list] = []  # [epoch, step, mean loss, mean accuracy or None]
        self._epoch_totals = [0.0, 0.0, 0.0]  # loss sum, correct, samples; all ranks
        self._reset_window()

    def _reset_window(self) -> None:
        self._win = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        self._win_n = 0
        self._win_steps = 0
        self._win_t0 = self.timer.batch_s

    def run(self, on_epoch_end: Callable[["Trainer"], None] | None = None) -> None:
        """Train until ``epochs`` (or ``max_steps``); call the hook per epoch."""
        for epoch in range(self.epoch, self.epochs):
            if self.max_steps and self.step >= self.max_steps:
                self.stopped = True
                break
            self.loader.batch_sampler.set_epoch(epoch)  # same shuffle on all ranks
            seed_epoch(self.loader, self.ctx, self.seed, epoch, self.prepare)
            self.epoch_complete = self._run_epoch(epoch)
            if self.epoch_complete:
                self.epoch = epoch + 1  # epochs fully done (what a checkpoint records)
            if on_epoch_end is not None:
                on_epoch_end(self)
            if self.stopped:
                break

    def _run_epoch(self, epoch: int) -> bool:
        """One pass over this rank's shard; False if max_steps cut it short.

        Nothing in a step waits for the device (see ``timing``): the step's
        times are read when the device has passed them, and the loss window
        is read where its all_reduce waits anyway, every ``curve_every`` steps.
        """
        dev = self.ctx.torch_device()
        sampler = self.loader.batch_sampler
        clock = self.clock
        complete = True
        t0, samples, steps = self.timer.batch_s, 0, 0
        self._epoch_totals = [0.0, 0.0, 0.0]
        clock.new_epoch()
        t_end = now()
        for batch_index, (inputs, targets) in enumerate(self.loader):
            clock.begin(self.step, now() - t_end)
            inputs = inputs.to(dev, non_blocking=True)
            if self.prepare is not None:
                inputs = self.prepare(inputs)
            targets = targets.to(dev, non_blocking=True)
            global_n = sampler.global_size(batch_index)
            weight = sampler.split.loss_weight(targets.shape[0], global_n)
            loss, outputs = self.step_fn(inputs, targets, weight)
            samples += global_n
            self._accumulate(loss, outputs, targets)
            clock.end()
            self.step += 1
            steps += 1
            # the hang watchdog's sign of progress, and status's and top's (a
            # no-op alone): with the times outside collectives of the steps
            # the device finished since the last
            compute_s, data_s = self._record(clock.ready())
            heartbeat(self.step, samples=self.samples_before + self.local_samples,
                      compute_s=compute_s, data_s=data_s)
            if self._win_steps == self.curve_every:
                self._flush(epoch, show=bool(self.log_every))
            if self.max_steps and self.step >= self.max_steps:
                self.stopped = True
                complete = batch_index + 1 == len(self.loader)
                break
            clock.idle()
            t_end = now()
        if self._win_steps:
            self._flush(epoch, show=bool(self.log_every))
        self._record(clock.drain())
        self._end_epoch(epoch, steps, samples, self.timer.batch_s - t0)
        return complete

    def _record(self, finished: list[StepTimes]) -> tuple[float | None, float | None]:
        """Add finished steps to the timer; the mean of their forward and data
        times (the heartbeat's), or (None, None) if not every one has them."""
        for t in finished:
            self.timer.record(t.step, t.data_s, t.compute_s, t.forward_s, t.allreduce_s)
        if not finished or any(t.forward_s is None for t in finished):
            return None, None
        return (sum(t.forward_s for t in finished) / len(finished),
                sum(t.data_s for t in finished) / len(finished))

    def _end_epoch(self, epoch: int, steps: int, samples: int, seconds: float) -> None:
        """Record the epoch's means (see module doc) and print its line."""
        loss_sum, correct, n = self._epoch_totals
        if not n:
            return  # no step ran: nothing to average
        self.epoch_loss = loss_sum / n
        self.epoch_acc = correct / n if self.classify else None
        self.epoch_curve.append([epoch + 1, self.step, self.epoch_loss, self.epoch_acc])
        rate = samples / seconds if seconds > 0 else 0.0  # global samples
        acc = f" train_acc {self.epoch_acc:.4f}" if self.epoch_acc is not None else ""
        self.log(f"epoch {epoch + 1}/{self.epochs} step {self.step} "
                 f"loss {self.epoch_loss:.5f}{acc} samples/s {rate:.1f} "
                 f"(over the epoch's {steps} step{'s' if steps != 1 else ''})")

    def _accumulate(self, loss: torch.Tensor, outputs: torch.Tensor,
                    targets: torch.Tensor) -> None:
        n = targets.shape[0]
        correct = ((outputs.argmax(1) == targets).sum() if self.classify
                   else torch.zeros((), device=loss.device))
        self._win += torch.stack([loss.detach().double() * n, correct.double()])
        self._win_n += n
        self._win_steps += 1
        self.local_samples += n

    def _flush(self, epoch: int, show: bool) -> None:
        """Reduce the loss window over all ranks, record it, maybe print it."""
        n_local = torch.tensor([float(self._win_n)], dtype=torch.float64,
                               device=self.ctx.device)
        totals = torch.cat([self._win, n_local])
        dist.all_reduce(totals)
        loss_sum, correct, n = totals.tolist()  # the window's one wait for the device
        self._record(self.clock.drain())  # every step before it has passed: no wait
        self._epoch_totals = [a + b for a, b in zip(self._epoch_totals, (loss_sum, correct, n))]
        seconds = self.timer.batch_s - self._win_t0
        self.last_loss = loss_sum / n
        self.loss_curve.add(self.step, self.last_loss)
        acc_text = ""
        if self.classify:
            self.last_acc = correct / n
            self.acc_curve.add(self.step, self.last_acc)
            acc_text = f" train_acc {self.last_acc:.4f}"
        self._reset_window()
        if show:
            rate = n / seconds if seconds > 0 else 0.0
            self.log(f"epoch {epoch + 1}/{self.epochs} step {self.step} "
                     f"loss {self.last_loss:.5f}{acc_text} samples/s {rate:.1f}")

    def _epoch_share(self) -> int:
        """This rank's training samples in one whole epoch: its share of every
        global batch (the same each epoch; a checkpoint is of whole epochs)."""
        sampler = self.loader.batch_sampler
        return sum(sampler.split.share(sampler.rank, sampler.global_size(b))
                   for b in range(len(sampler)))

    def global_samples(self) -> int:
        """Samples trained on by all ranks together (a collective)."""
        t = torch.tensor([self.local_samples], dtype=torch.int64, device=self.ctx.device)
        dist.all_reduce(t)
        return int(t.item())


@torch.no_grad()
def evaluate(ctx: DistContext, module: nn.Module, loader: DataLoader,
             amp: Amp | None = None,
             prepare: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict:
    """Loss and accuracy over a dataset sharded with ``ShardSampler``.

    Each rank counts its exact share; one all_reduce sums (loss, correct,
    total), so the accuracy is over the whole set, each example once. Pass the
    unwrapped module (``ddp.module``): shards may differ in length, and a DDP
    forward could be a collective. ``prepare`` as the Trainer's.
    """
    amp = amp or Amp("off", "cpu", None, None)
    broadcast_buffers(module)  # everyone evaluates with rank 0's BatchNorm stats
    was_training = module.training
    module.eval()
    dev = ctx.torch_device()
    t = torch.zeros(3, dtype=torch.float64, device=dev)
    for inputs, targets in loader:
        inputs, targets = inputs.to(dev, non_blocking=True), targets.to(dev, non_blocking=True)
        if prepare is not None:
            inputs = prepare(inputs)
        with amp.autocast():
            out = module(inputs)
        t[0] += F.cross_entropy(out.float(), targets, reduction="sum").double()
        t[1] += (out.argmax(1) == targets).sum().double()
        t[2] += targets.shape[0]
    dist.all_reduce(t)
    module.train(was_training)
    loss_sum, correct, total = t.tolist()
    return {"loss": loss_sum / total if total else math.nan,
            "accuracy": correct / total if total else math.nan,
            "correct": int(correct), "total": int(total)}


class EpochEval:
    """An ``on_epoch_end`` hook: test loss/accuracy over all ranks, as a curve."""

    def __init__(self, ctx: DistContext, module: nn.Module, loader: DataLoader,
                 log: RankZeroLog, amp: Amp | None = None,
                 prepare: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.ctx, self.module, self.loader, self.log, self.amp = ctx, module, loader, log, amp
        self.prepare = prepare
        self.curve: list[list[float]] = []  # [step, epoch, test_loss, test_accuracy]
        self.last: dict | None = None

    def __call__(self, trainer: Trainer) -> None:
        ev = evaluate(self.ctx, self.module, self.loader, self.amp, self.prepare)
        self.last = ev
        self.curve.append([trainer.step, trainer.epoch, ev["loss"], ev["accuracy"]])
        self.log(f"test after step {trainer.step}: loss {ev['loss']:.4f} accuracy "
                 f"{ev['accuracy']:.4f} ({ev['correct']}/{ev['total']}, all ranks)")

    def metrics(self) -> dict:
        if self.last is None:
            return {}
        return {"test_loss": self.last["loss"], "test_accuracy": self.last["accuracy"],
                "test_correct": self.last["correct"], "test_total": self.last["total"]}
