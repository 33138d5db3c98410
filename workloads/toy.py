"""toy (seed 003): a 2-30-20-2 MLP separating two clusters of 2-D points.

Two fixes over the tutorial it comes from:

* its loop read ``for features, labels in enumerate(loader)``, which binds
  ``features`` to the batch *index* and ``labels`` to the (x, y) pair; here
  the loader's (x, y) batches are unpacked directly;
* its accuracies were computed by each rank on its own shard, so each GPU
  printed a different, partial number. Here train and test accuracy are
  counted per rank over an exact, unpadded shard (harness.data.ShardSampler:
  rank r takes indices r, r+W, ..., so no example is counted twice, unlike
  DistributedSampler which pads by repeating samples) and summed over all
  ranks with one all_reduce of (correct, total). ``train_total`` and
  ``test_total`` in the result therefore equal the dataset sizes exactly.

``--dataset seed`` uses the tutorial's 5 training and 2 test points;
``--dataset blobs`` generates two Gaussian clusters around the same centres.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from workloads.harness import data as hdata
from workloads.harness.evidence import param_checksum
from workloads.harness.job import Job, run_job, start
from workloads.harness.report import describe_start, finish
from workloads.harness.train import Trainer, evaluate, make_step, wrap_ddp

SEED_TRAIN = ([[-1.2, 3.1], [-0.9, 2.9], [-0.5, 2.6], [2.3, -1.1], [2.7, -1.5]], [0, 0, 0, 1, 1])
SEED_TEST = ([[-0.8, 2.8], [2.6, -1.6]], [0, 1])
CENTRES = torch.tensor([[-0.9, 2.9], [2.5, -1.3]])


def make_datasets(kind: str, samples: int) -> tuple[TensorDataset, TensorDataset, str]:
    """(train, test, description); both fixed, identical on every rank."""
    if kind == "seed":
        train = TensorDataset(torch.tensor(SEED_TRAIN[0]), torch.tensor(SEED_TRAIN[1]))
        test = TensorDataset(torch.tensor(SEED_TEST[0]), torch.tensor(SEED_TEST[1]))
        return train, test, "the tutorial's 5 train / 2 test points"
    g = torch.Generator().manual_seed(3)

    def blobs(n: int) -> TensorDataset:
        labels = torch.randint(2, (n,), generator=g)
        return TensorDataset(CENTRES[labels] + 0.6 * torch.randn(n, 2, generator=g), labels)

    train, test = blobs(samples), blobs(max(2, samples // 4))
    return train, test, f"{len(train)} train / {len(test)} test points in two Gaussian blobs"


class ToyNet(nn.Module):
    def __init__(self, num_inputs: int = 2, num_outputs: int = 2):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(num_inputs, 30), nn.ReLU(),
                                    nn.Linear(30, 20), nn.ReLU(),
                                    nn.Linear(20, num_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def train(job: Job) -> dict:
    args, ctx, log = job.args, job.ctx, job.log
    train_ds, test_ds, desc = make_datasets(args.dataset, args.samples)
    log(describe_start(ctx, "generated", desc))
    log(f"global batch {job.split}, lr {job.lr}")
    loader = hdata.train_loader(train_ds, ctx, args.global_batch_size, seed=args.seed,
                                shuffle=args.shuffle, num_workers=args.num_workers)
    torch.manual_seed(args.seed)
    model = ToyNet().to(ctx.device)
    init_checksum = param_checksum(model)
    ddp = wrap_ddp(model, ctx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=job.lr)
    trainer = Trainer(ctx, loader, make_step(ddp, optimizer, F.cross_entropy), log,
                      epochs=args.epochs, seed=args.seed, max_steps=args.max_steps,
                      log_every=args.log_every, classify=True)
    trainer.run()
    train_eval = evaluate(ctx, model, hdata.eval_loader(train_ds, ctx, 64))
    test_eval = evaluate(ctx, model, hdata.eval_loader(test_ds, ctx, 64))
    log(f"train accuracy {train_eval['accuracy']:.4f} ({train_eval['correct']}/"
        f"{train_eval['total']}), test accuracy {test_eval['accuracy']:.4f} "
        f"({test_eval['correct']}/{test_eval['total']}) -- over all ranks")
    metrics = {"final_loss": trainer.epoch_loss, "lr": job.lr, "per_rank_batch": job.batch}
    for split, ev in (("train", train_eval), ("test", test_eval)):
        metrics.update({f"{split}_accuracy": ev["accuracy"], f"{split}_correct": ev["correct"],
                        f"{split}_total": ev["total"], f"{split}_loss": ev["loss"]})
    return finish(job, trainer, model, data="generated", metrics=metrics,
                  init_checksum=init_checksum, data_source=desc,
                  eval_sharding="exact: rank r evaluates indices r, r+W, ... (no padding)")


@record
def main(argv=None) -> dict:
    return run_job(start("toy", argv), train)


if __name__ == "__main__":
    main()
