"""mlp (seed 002): a 3072-512-10 MLP on CIFAR-10-shaped images; DDP vs DataParallel.

``--mode ddp`` (default) is ordinary DDP, one process per device.
``--mode dp`` reproduces the tutorial's ``nn.DataParallel``: ONE process that
scatters each batch over every visible GPU and gathers the outputs on GPU 0
(single process, threads, GIL-bound -- the baseline DDP is compared with).
It therefore refuses to run with a world size above 1 or with fewer than two
visible CUDA devices; launch it as one process per node that sees all GPUs.

Data: real CIFAR-10 from ``--data-dir`` when present, else synthetic (see
harness.datasets); either way the result says which.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from workloads.catalog import CATALOG
from workloads.harness import data as hdata
from workloads.harness import datasets
from workloads.harness.context import WorkloadError, DistContext, visible_gpus
from workloads.harness.evidence import param_checksum
from workloads.harness.job import Job, layout_of, run_job, start
from workloads.harness.report import describe_start, finish
from workloads.harness.train import EpochEval, Trainer, make_step, wrap_ddp


class MLP(nn.Module):
    def __init__(self, in_features: int = 3 * 32 * 32, hidden: int = 512, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def check_dp(ctx: DistContext) -> int:
    """Refuse --mode dp where it cannot mean anything (the catalog's rules,
    which ``start`` checks too, as the controller does before launch);
    returns the GPU count."""
    refused = CATALOG["mlp"].refusal({"mode": "dp"}, layout_of(ctx))
    if refused:
        raise WorkloadError(refused[1])
    return visible_gpus(ctx)


def train(job: Job, dp_gpus: int) -> dict:
    args, ctx, log = job.args, job.ctx, job.log
    data = datasets.load(datasets.CIFAR10, args.data_dir, args.data,
                         train_samples=args.train_samples, test_samples=args.test_samples)
    amp = job.speed.amp
    datasets.check_same_everywhere(ctx, data)
    log(describe_start(ctx, data.data, data.source))
    log(job.speed_line())
    log(f"mode {args.mode}" + (f" over {dp_gpus} GPUs" if dp_gpus else "")
        + f", global batch {job.split}, lr {job.lr}")
    loader = hdata.train_loader(data.train, ctx, args.global_batch_size, seed=args.seed,
                                shuffle=args.shuffle, num_workers=job.workers)
    torch.manual_seed(args.seed)
    model = MLP().to(ctx.device)
    init_checksum = param_checksum(model)
    wrapped = nn.DataParallel(model) if args.mode == "dp" else wrap_ddp(model, ctx)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=job.lr)
    trainer = Trainer(ctx, loader, make_step(wrapped, optimizer, F.cross_entropy, amp), log,
                      epochs=args.epochs, seed=args.seed, max_steps=args.max_steps,
                      log_every=args.log_every, classify=True, prepare=data.train_pipeline)
    # DataParallel's forward is no collective, so dp evaluates on all its GPUs
    evaluator = EpochEval(ctx, wrapped if args.mode == "dp" else model,
                          hdata.eval_loader(data.test, ctx, 2 * job.batch,
                                            num_workers=job.workers), log,
                          amp, prepare=data.test_pipeline)
    trainer.run(evaluator if args.eval else None)
    metrics = {"final_loss": trainer.epoch_loss, "train_accuracy": trainer.epoch_acc,
               "lr": job.lr, "per_rank_batch": job.batch, "dp_gpus": dp_gpus,
               **evaluator.metrics()}
    return finish(job, trainer, model, data=data.data, metrics=metrics,
                  init_checksum=init_checksum, mode=args.mode, data_source=data.source,
                  amp=amp.mode, speed=job.speed_record(),
                  data_verified=data.verified, test_curve=evaluator.curve)


@record
def main(argv=None) -> dict:
    job = start("mlp", argv)
    dp_gpus = check_dp(job.ctx) if job.args.mode == "dp" else 0
    return run_job(job, lambda j: train(j, dp_gpus))


if __name__ == "__main__":
    main()
