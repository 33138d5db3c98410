"""One measurement of bench/data_path.py, in a process of its own.

Run with PYTHONPATH at a tree (this one, or the starting commit's): builds
a built-in workload's training data and loader as that tree's workload does,
on one CPU thread and without loader workers (so that every CPU second of
the data path is this process's), iterates one epoch, and prints one JSON
line: CPU seconds for the setup (reading or drawing the dataset) and per
sample for the epoch, what the batches are, and where the first batch was
saved (for the bench's check that both trees give the same images).

``--mode loader``: what the loader hands the training loop. In the starting
commit that is the model's input, resized and normalised on the CPU; now it
is the stored uint8 images, which a GPU rank copies and turns into the
model's input on the GPU (``datasets.ImagePipeline``). ``--mode cpu`` adds
that pipeline on the CPU, as a ``device: cpu`` rank runs it (the starting
commit has none: its loader did it all).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {"resnet": ("CIFAR10", 224), "mlp": ("CIFAR10", None), "mnist": ("MNIST", None)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", choices=sorted(SHAPES), required=True)
    p.add_argument("--data", choices=("real", "synthetic"), required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--mode", choices=("loader", "cpu"), required=True)
    p.add_argument("--dump", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)  # as each rank of several on a node (OMP_NUM_THREADS=1)

    from workloads.harness import data as hdata
    from workloads.harness import datasets
    from workloads.harness.context import read_context

    ctx = read_context({}, "cpu")
    name, size = SHAPES[args.workload]
    spec = getattr(datasets, name)
    t0 = time.process_time()
    loaded = datasets.load(spec, args.data_dir, args.data, train_samples=args.samples,
                           test_samples=1, image_size=size)
    pipeline = getattr(loaded, "train_pipeline", None)  # None: the starting commit
    loader = hdata.train_loader(loaded.train, ctx, args.batch, seed=0, shuffle=False,
                                num_workers=0)
    t1 = time.process_time()
    samples, first = 0, None
    for inputs, targets in loader:
        if args.mode == "cpu" and pipeline is not None:
            inputs = pipeline(inputs)
        samples += len(targets)
        if first is None:
            first = inputs
    t2 = time.process_time()
    torch.save(first, args.dump)
    print(json.dumps({"setup_cpu_s": t1 - t0, "cpu_per_sample_s": (t2 - t1) / samples,
                      "samples": samples, "shape": list(first.shape),
                      "dtype": str(first.dtype), "moved": pipeline is not None,
                      "data": loaded.data}))


if __name__ == "__main__":
    main()
