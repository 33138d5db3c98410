"""Data-parallel training with Hugging Face Accelerate, launched by ddp-orch.

The model is tutorial 002's (shared/seeds/): a two-layer MLP from a 3x32x32
image (3072 inputs) through a hidden layer of 512 to 10 classes, trained with
SGD and cross-entropy. The data is generated, CIFAR-10's shape and classes:
each class is a fixed random image, each sample a faint copy of it under
noise, so the loss falls steadily over a few epochs on a CPU. Replace
``make_dataset`` with your own Dataset; the rest stays.

The training loop is Accelerate's: ``accelerator.prepare`` wraps the model
in DDP, shards the DataLoader over the processes and places tensors;
``accelerator.backward`` replaces ``loss.backward()``. Accelerate learns its
place in the job from the environment torchrun gives every rank (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the same file runs
under ``accelerate launch``, plain ``torchrun``, ``ddp-orch up`` and alone
(one process) without a change.

Run it::

    ddp-orch up examples/accelerate/cluster.yaml   # 2 CPU processes, from the repository root
    accelerate launch train.py --epochs 5          # by hand, from this folder
    python train.py                                # one process

Only the main process writes the result, atomically (a temporary file,
fsync, rename), to ``$DDP_ORCH_RESULT_FILE`` where ddp-orch sets it (ddp-orch
brings it home as the run's ``result.json``), else to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accelerate import Accelerator
from accelerate.utils import set_seed

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2048, help="size of the generated set")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="per process, as in Accelerate: a step sees this times the "
                             "number of processes")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result", default="result.json",
                        help="where the main process writes its result when "
                             "DDP_ORCH_RESULT_FILE is not set")
    return parser.parse_args()


def make_dataset(samples: int, seed: int) -> TensorDataset:
    """The same tensors in every process (one seeded generator): Accelerate
    shards a dataset by index, so each process must hold an identical one."""
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(CLASSES, *IMAGE_SHAPE, generator=gen)
    labels = torch.randint(0, CLASSES, (samples,), generator=gen)
    images = 0.05 * prototypes[labels] + torch.randn(samples, *IMAGE_SHAPE, generator=gen)
    return TensorDataset(images, labels)


def make_model(hidden: int) -> nn.Module:
    inputs = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                         nn.Linear(hidden, CLASSES))


def write_json_atomic(path: str, obj: dict) -> None:
    """Whoever reads ``path`` (ddp-orch copies it home when the run ends) sees
    the old file or the whole new one, never half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main() -> None:
    args = parse_args()
    # ddp-orch's `device: cpu` hides the GPUs already; saying so keeps a CPU
    # run on the CPU where some stay visible.
    accelerator = Accelerator(cpu=os.environ.get("DDP_ORCH_DEVICE") == "cpu")
    set_seed(args.seed)  # the same initial weights in every process

    model = make_model(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(make_dataset(args.samples, args.seed), batch_size=args.batch_size,
                        shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss_fn = nn.CrossEntropyLoss()
    accelerator.print(f"accelerate: {accelerator.num_processes} process(es), "
                      f"{accelerator.distributed_type.value} on {accelerator.device}, "
                      f"{len(loader)} steps per epoch")

    epoch_loss, epoch_accuracy = [], []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        # summed over this process's samples, then over every process
        totals = torch.zeros(3, device=accelerator.device)  # loss * n, correct, n
        for images, labels in loader:  # already on accelerator.device
            optimizer.zero_grad()
            logits = model(images)
            loss = loss_fn(logits, labels)
            accelerator.backward(loss)
            optimizer.step()
            totals += torch.stack([loss.detach() * len(labels),
                                   (logits.argmax(1) == labels).sum().float(),
                                   torch.tensor(float(len(labels)), device=totals.device)])
        loss_sum, correct, seen = accelerator.reduce(totals, reduction="sum").tolist()
        epoch_loss.append(loss_sum / seen)
        epoch_accuracy.append(correct / seen)
        accelerator.print(f"epoch {epoch + 1}/{args.epochs} loss {epoch_loss[-1]:.4f} "
                          f"accuracy {epoch_accuracy[-1]:.3f}")
    elapsed = time.perf_counter() - start

    # What each process saw of the job, and a checksum of its weights: DDP
    # keeps the replicas identical, so every checksum should be the same.
    checksum = sum(p.detach().double().sum().item()
                   for p in accelerator.unwrap_model(model).parameters())
    mine = torch.tensor([accelerator.process_index, accelerator.local_process_index,
                         accelerator.num_processes, checksum],
                        dtype=torch.float64, device=accelerator.device)
    everyone = accelerator.gather(mine.unsqueeze(0)).tolist()

    if accelerator.is_main_process:
        global_batch = args.batch_size * accelerator.num_processes
        result = {
            "world_size": accelerator.num_processes,
            "launcher": "accelerate",
            "distributed_type": accelerator.distributed_type.value,
            "device": str(accelerator.device),
            "metrics": {"first_epoch_loss": epoch_loss[0], "final_loss": epoch_loss[-1],
                        "train_accuracy": epoch_accuracy[-1], "epochs": args.epochs,
                        "global_batch": global_batch},
            "epoch_loss": epoch_loss,
            "steps_per_epoch": len(loader),  # this process's share of the set
            "processes": [{"process_index": int(p), "local_process_index": int(lp),
                           "num_processes": int(n)} for p, lp, n, _ in everyone],
            "replicas_identical": len({round(c, 6) for *_, c in everyone}) == 1,
            "timing": {"train_s": elapsed,
                       "samples_per_s": args.epochs * args.samples / elapsed},
            "data": "generated",
            "data_source": f"{args.samples} generated 3x32x32 images in {CLASSES} classes "
                           f"(seed {args.seed})",
        }
        write_json_atomic(os.environ.get("DDP_ORCH_RESULT_FILE") or args.result, result)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
