"""linear (seed 000): fit y = 2x + 3 + 0.1*noise with nn.Linear(1, 1).

The smallest real DDP job: every rank generates the same dataset from
--seed (so nothing has to be shipped), trains on its share of each global
batch with MSE + SGD, and must end near w=2, b=3. w and b are reported as
full-precision floats (Python's repr round-trips float32 values exactly),
which lets the tests compare DDP with a one-process run: a W-rank run with
global batch B takes the same steps as one process with batch B over the
same data order, for any W (harness.data.BatchSplit), so w and b agree to
float rounding (in practice exactly when W divides B and the last batch).
"""

import torch
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from workloads.harness import data as hdata
from workloads.harness.evidence import param_checksum
from workloads.harness.job import Job, run_job, start
from workloads.harness.report import describe_start, finish
from workloads.harness.train import Trainer, make_step, wrap_ddp


def make_dataset(samples: int, seed: int) -> TensorDataset:
    """y = 2x + 3 + 0.1*noise, identical on every rank for the same seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 1, generator=g)
    y = 2 * x + 3 + 0.1 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def train(job: Job) -> dict:
    args, ctx, log = job.args, job.ctx, job.log
    source = f"{args.samples} points of y = 2x + 3 + 0.1*noise"
    log(describe_start(ctx, "generated", source))
    log(f"global batch {job.split}, lr {job.lr}")
    loader = hdata.train_loader(make_dataset(args.samples, args.seed), ctx,
                                args.global_batch_size, seed=args.seed,
                                shuffle=args.shuffle, num_workers=args.num_workers)
    torch.manual_seed(args.seed)  # same init on every rank
    model = nn.Linear(1, 1).to(ctx.device)
    init_checksum = param_checksum(model)
    ddp = wrap_ddp(model, ctx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=job.lr)
    trainer = Trainer(ctx, loader, make_step(ddp, optimizer, nn.MSELoss()), log,
                      epochs=args.epochs, seed=args.seed, max_steps=args.max_steps,
                      log_every=args.log_every)
    trainer.run()
    w, b = model.weight.item(), model.bias.item()
    log(f"learned w={w:.4f} b={b:.4f} (target 2, 3)")
    return finish(job, trainer, model, data="generated", data_source=source,
                  init_checksum=init_checksum,
                  metrics={"w": w, "b": b, "final_loss": trainer.epoch_loss,
                           "lr": job.lr, "per_rank_batch": job.batch})


@record
def main(argv=None) -> dict:
    return run_job(start("linear", argv), train)


if __name__ == "__main__":
    main()
