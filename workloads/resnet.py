"""resnet (seed 001): torchvision ResNet-18 on CIFAR-10, with a time breakdown.

The tutorial's experiment: CIFAR-10 images upscaled to ``--image-size`` (224
by default, which makes the job compute-bound so that DDP's speed-up shows),
ResNet-18 from scratch (``weights=None, num_classes=10``), SGD with
momentum 0.9. The tutorial also multiplies the learning rate by the world
size; here that is ``--lr-scaling linear`` and off by default, because the
global batch is ``--global-batch-size`` on any layout: the same batch with
a larger step would be another learning problem, and ``compare``'s 1-process
and DDP sides would not train the same thing. The result carries what
the tutorial plots: average data-loading vs compute(+gradient sync) time
per step, their totals, throughput in images/s, and loss / train-accuracy /
test-accuracy curves. Rank 0 checkpoints every epoch and a gang restart
resumes from it (``harness/checkpoint.py``), as in mnist.

DDP is built WITHOUT find_unused_parameters=True (the tutorial sets it):
ResNet-18 uses every parameter in every forward, so the flag finds nothing
and costs a traversal of the autograd graph after each forward.
"""

import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torchvision.models import resnet18

from workloads.harness import checkpoint, datasets
from workloads.harness import data as hdata
from workloads.harness.evidence import param_checksum
from workloads.harness.job import Job, run_job, start
from workloads.harness.report import describe_start, finish
from workloads.harness.train import EpochEval, Trainer, make_step, wrap_ddp


def train(job: Job) -> dict:
    args, ctx, log = job.args, job.ctx, job.log
    data = datasets.load(datasets.CIFAR10, args.data_dir, args.data,
                         train_samples=args.train_samples, test_samples=args.test_samples,
                         image_size=args.image_size, augment=args.augment,
                         channels_last=job.speed.channels_last)
    datasets.check_same_everywhere(ctx, data)
    log(describe_start(ctx, data.data, data.source))
    log(job.speed_line())
    log(f"ResNet-18 at {args.image_size}x{args.image_size}, global batch "
        f"{job.split}, lr {job.lr} "
        f"({args.lr_scaling} scaling), momentum {args.momentum}")
    loader = hdata.train_loader(data.train, ctx, args.global_batch_size, seed=args.seed,
                                shuffle=args.shuffle, num_workers=job.workers)
    torch.manual_seed(args.seed)
    model = resnet18(weights=None, num_classes=10).to(ctx.device,
                                                      memory_format=job.speed.memory_format)
    init_checksum = param_checksum(model)
    ddp = wrap_ddp(model, ctx)  # no find_unused_parameters: see module docstring
    optimizer = torch.optim.SGD(ddp.parameters(), lr=job.lr, momentum=args.momentum)
    state = checkpoint.resume_state(ctx, args, log)
    amp = job.speed.amp
    start_epoch, start_step = checkpoint.restore(state, model, optimizer, amp.scaler, ctx, args,
                                                 log, "resnet") if state else (0, 0)
    trainer = Trainer(ctx, loader, make_step(ddp, optimizer, F.cross_entropy, amp), log,
                      epochs=args.epochs, seed=args.seed, max_steps=args.max_steps,
                      log_every=args.log_every, classify=True,
                      start_epoch=start_epoch, start_step=start_step,
                      prepare=data.train_pipeline)
    evaluator = EpochEval(ctx, model, hdata.eval_loader(data.test, ctx, job.batch,
                                                        num_workers=job.workers), log,
                          amp, prepare=data.test_pipeline)
    save = checkpoint.epoch_saver(args, ctx, "resnet", model, optimizer, amp.scaler, log,
                                  amp=amp.mode)

    def on_epoch_end(t: Trainer) -> None:
        if args.eval:
            evaluator(t)
        save(t)

    trainer.run(on_epoch_end)
    t = trainer.timer
    compute_fraction = t.compute_s / t.batch_s if t.batch_s else 0.0
    allreduce = (f" (all-reduce {t.allreduce_s / t.steps:.4f}s of it)"
                 if t.steps and t.allreduce_steps == t.steps else "")
    log(f"per step: data {t.data_s / max(t.steps, 1):.4f}s + compute/sync "
        f"{t.compute_s / max(t.steps, 1):.4f}s{allreduce}; compute share "
        f"{compute_fraction:.1%}")
    metrics = {"final_loss": trainer.epoch_loss, "train_accuracy": trainer.epoch_acc,
               "lr": job.lr, "per_rank_batch": job.batch, "image_size": args.image_size,
               "compute_fraction": compute_fraction, "start_epoch": start_epoch,
               "end_epoch": trainer.epoch, **evaluator.metrics()}
    return finish(job, trainer, model, data=data.data, metrics=metrics,
                  init_checksum=init_checksum, resumed=state is not None,
                  data_source=data.source, amp=amp.mode, speed=job.speed_record(),
                  data_verified=data.verified, test_curve=evaluator.curve)


@record
def main(argv=None) -> dict:
    job = start("resnet", argv)  # refuses --resume without a checkpoint, tiny images
    return run_job(job, train)


if __name__ == "__main__":
    main()
