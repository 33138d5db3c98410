"""mnist (seed 004): a two-conv ConvNet with BatchNorm; SyncBN, AMP, checkpoint/resume.

* SyncBatchNorm: on CUDA the BatchNorm layers are converted with
  ``nn.SyncBatchNorm.convert_sync_batchnorm`` so batch statistics span all
  ranks. On CPU that is impossible in torch 2.x -- DDP refuses a CPU module
  holding SyncBatchNorm ("SyncBatchNorm layers only work with GPU modules")
  and SyncBatchNorm's training forward demands a GPU tensor -- so plain
  BatchNorm stays (DDP then broadcasts rank 0's running stats at each
  forward) and the result carries ``sync_bn: false`` with the reason.
* AMP: ``--amp`` auto/off/fp16/bf16 (``harness/speed.py``, with the other
  speed options; ``--seed-settings`` is the tutorial's fp16); fp16 uses a
  GradScaler, whose state goes into the checkpoint.
* Checkpoint (``harness/checkpoint.py``): rank 0 writes model, optimizer,
  scaler, completed epochs and step after every completed epoch, atomically,
  to ``--checkpoint PATH`` (when the run may restart, ``checkpoint.pt`` in
  the run directory by default). ``--resume``, or a whole-gang restart
  (``DDP_ORCH_RESTART_COUNT`` > 0), loads it on rank 0 and broadcasts it, so
  other nodes need no copy of the file. Because checkpoints fall on epoch boundaries and
  everything random is derived from (seed, rank, epoch) -- the sampler's
  shuffle via set_epoch, the loader's worker seeds and the main-process RNG
  via harness.data.seed_epoch -- no RNG state needs saving: 1 epoch + resume
  for 1 more ends with the same parameters as 2 epochs straight.
* Test accuracy is counted over the whole test set (exact shards, one
  all_reduce), not per rank.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from workloads.harness import checkpoint, datasets
from workloads.harness import data as hdata
from workloads.harness.context import DistContext
from workloads.harness.evidence import param_checksum
from workloads.harness.job import Job, run_job, start
from workloads.harness.report import describe_start, finish
from workloads.harness.speed import Amp
from workloads.harness.train import EpochEval, Trainer, make_step, wrap_ddp

CPU_SYNC_BN_REASON = (
    "SyncBatchNorm needs CUDA: DDP rejects it on CPU modules ('SyncBatchNorm layers only "
    "work with GPU modules') and its training forward requires a GPU tensor; plain "
    "BatchNorm kept, DDP broadcasts rank 0's running stats at each forward")


class ConvNet(nn.Module):
    """conv5x5(16)-BN-ReLU-pool, conv5x5(32)-BN-ReLU-pool, linear: 28x28 -> 10."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(7 * 7 * 32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def sync_bn_choice(ctx: DistContext, wanted: bool) -> tuple[bool, str | None]:
    """(use SyncBatchNorm?, reason when not)."""
    if not wanted:
        return False, "disabled by --no-sync-bn"
    if not ctx.is_cuda:
        return False, CPU_SYNC_BN_REASON
    return True, None


def train(job: Job, amp: Amp, use_sync_bn: bool, sync_bn_reason: str | None) -> dict:
    args, ctx, log = job.args, job.ctx, job.log
    data = datasets.load(datasets.MNIST, args.data_dir, args.data,
                         train_samples=args.train_samples, test_samples=args.test_samples,
                         channels_last=job.speed.channels_last)
    datasets.check_same_everywhere(ctx, data)
    log(describe_start(ctx, data.data, data.source))
    log(job.speed_line())
    log(f"global batch {job.split}, "
        f"lr {job.lr}, amp {amp.mode}, sync_bn {use_sync_bn}"
        + (f" ({sync_bn_reason})" if sync_bn_reason else ""))
    loader = hdata.train_loader(data.train, ctx, args.global_batch_size, seed=args.seed,
                                shuffle=args.shuffle, num_workers=job.workers)
    torch.manual_seed(args.seed)
    model = ConvNet().to(ctx.device, memory_format=job.speed.memory_format)
    if use_sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    init_checksum = param_checksum(model)
    ddp = wrap_ddp(model, ctx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=job.lr, momentum=args.momentum)
    state = checkpoint.resume_state(ctx, args, log)
    start_epoch, start_step = checkpoint.restore(state, model, optimizer, amp.scaler, ctx, args,
                                                 log, "mnist") if state else (0, 0)
    trainer = Trainer(ctx, loader, make_step(ddp, optimizer, F.cross_entropy, amp), log,
                      epochs=args.epochs, seed=args.seed, max_steps=args.max_steps,
                      log_every=args.log_every, classify=True,
                      start_epoch=start_epoch, start_step=start_step,
                      prepare=data.train_pipeline)
    evaluator = EpochEval(ctx, model, hdata.eval_loader(data.test, ctx, 2 * job.batch,
                                                        num_workers=job.workers),
                          log, amp, prepare=data.test_pipeline)
    save = checkpoint.epoch_saver(args, ctx, "mnist", model, optimizer, amp.scaler, log,
                                  amp=amp.mode)

    def on_epoch_end(t: Trainer) -> None:
        evaluator(t)
        save(t)

    trainer.run(on_epoch_end)
    metrics = {"final_loss": trainer.epoch_loss, "train_accuracy": trainer.epoch_acc,
               "lr": job.lr, "per_rank_batch": job.batch, "start_epoch": start_epoch,
               "start_step": start_step, "end_epoch": trainer.epoch,
               "end_step": trainer.step, **evaluator.metrics()}
    return finish(job, trainer, model, data=data.data, metrics=metrics,
                  init_checksum=init_checksum, sync_bn=use_sync_bn,
                  sync_bn_reason=sync_bn_reason, amp=amp.mode, speed=job.speed_record(),
                  checkpoint=os.path.abspath(checkpoint.checkpoint_path(args))
                  if checkpoint.checkpoint_path(args) else None,
                  resumed=state is not None, data_source=data.source,
                  data_verified=data.verified, test_curve=evaluator.curve)


@record
def main(argv=None) -> dict:
    job = start("mnist", argv)  # refuses --resume without a checkpoint, fp16 on CPU, bf16
    # on a GPU without it natively
    amp = job.speed.amp
    use_sync_bn, reason = sync_bn_choice(job.ctx, job.args.sync_bn)
    return run_job(job, lambda j: train(j, amp, use_sync_bn, reason))


if __name__ == "__main__":
    main()
