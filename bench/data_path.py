"""The built-ins' data path: CPU seconds per sample, before and after issue 46.

Before (the starting commit, ``STARTING_COMMIT``, or any tree given as
``BENCH_WORKLOADS``): each rank's loader decoded every image, resized it
(seed 001's CIFAR-10 to 224x224) and normalised it on the CPU, per sample.
After (this tree): the loader ships each batch as stored (uint8, CIFAR-10
at 32x32) and the GPU does the rest, one batched ``interpolate``
(``workloads/harness/datasets.py``). Three variants per workload and data
set, side by side, each in a fresh process that reads the data as that
tree's workload does (one CPU thread, no loader workers, so every CPU
second of the path is the measured process's):

* ``before``: the starting commit's loader (its output is the model's input);
* ``after-gpu``: this tree's loader, what a GPU rank's CPU does per sample
  (the GPU's part cannot be measured here);
* ``after-cpu``: this tree's loader and its pipeline on the CPU, what a
  ``device: cpu`` rank does.

Each rep checks what each variant gave: ``after-gpu`` uint8 at the stored
size; ``after-cpu`` the model's input, and on real data the same values as
``before`` for the same images (to float rounding). Real data is a
CIFAR-10 and an MNIST written in their genuine formats
(``workloads.make_tiny_datasets``), read by torchvision's readers.

    .venv/bin/python bench/data_path.py [--reps 3] [--samples 2048]
        [--workloads resnet,mnist,mlp] [--data real,synthetic] [--before REV]

Target: the CPU per sample of resnet's data path at 224x224 on real data,
after (GPU path) / before, at most 0.1; the line also says how many images
a second one CPU core then feeds a GPU, against seed 001's 1869 (and twice
it, issue 46's target for one H100/H200).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import torch

from _common import (BASE_ENV, PYTHON, REPO, BenchError, footer, header, parser, print_table,
                     result_line, tempdir)

STARTING_COMMIT = "c7dea5e"  # main when issue 46 began: the data path before it
WORKER = os.path.join(REPO, "bench", "_data_path_worker.py")
BATCH = {"resnet": 128, "mlp": 64, "mnist": 64}  # a rank's share of the default global batch
VARIANTS = ("before", "after-gpu", "after-cpu")
SEED_PER_S = 1869.15  # seed 001's one GPU, images/s


def before_tree(rev: str, root: str) -> str:
    """A directory holding the ``workloads`` package of ``rev`` (or BENCH_WORKLOADS)."""
    given = os.environ.get("BENCH_WORKLOADS")
    if given:
        return given
    tree = os.path.join(root, "before")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "workloads"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def measure(tree: str, workload: str, data: str, data_dir: str, samples: int, mode: str,
            dump: str) -> dict:
    argv = [PYTHON, WORKER, "--workload", workload, "--data", data, "--data-dir", data_dir,
            "--samples", str(samples), "--batch", str(BATCH[workload]), "--mode", mode,
            "--dump", dump]
    env = {**BASE_ENV, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[1:])} under {tree} exited {proc.returncode}\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(variant: str, got: dict, workload: str, data: str, samples: int, dumps: dict) -> None:
    """A variant that did not do its job stops the bench (no figure)."""
    if got["samples"] != samples or got["data"] != data:
        raise BenchError(f"{variant}: {got['samples']} {got['data']} samples, not {samples} "
                         f"{data}")
    stored = (1, 28, 28) if workload == "mnist" else (3, 32, 32)
    model = (3, 224, 224) if workload == "resnet" else stored
    want = {"before": (model, "torch.float32"), "after-gpu": (stored, "torch.uint8"),
            "after-cpu": (model, "torch.float32")}[variant]
    if (tuple(got["shape"][1:]), got["dtype"]) != want or (variant != "before") != got["moved"]:
        raise BenchError(f"{variant} of {workload}: batches {got['shape']} {got['dtype']} "
                         f"(moved: {got['moved']}), not {want}")
    if data == "real" and variant == "after-cpu" and "before" in dumps:
        ours, theirs = torch.load(dumps["after-cpu"]), torch.load(dumps["before"])
        worst = (ours - theirs).abs().max().item()
        if worst > 1e-4:
            raise BenchError(f"{workload}: the images differ from the starting commit's "
                             f"by up to {worst:g}")


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--samples", type=int, default=2048, help="training samples (default 2048)")
    p.add_argument("--workloads", default="resnet,mnist,mlp")
    p.add_argument("--data", default="real,synthetic")
    p.add_argument("--before", default=STARTING_COMMIT,
                   help=f"the revision measured as before (default {STARTING_COMMIT}; "
                        "BENCH_WORKLOADS=DIR: a tree of your own)")
    args = p.parse_args()
    header("the built-ins' data path, CPU seconds per sample (bench/data_path.py)", args)
    workloads, kinds = args.workloads.split(","), args.data.split(",")
    with tempdir("ddp-orch-bench-data-", args.keep) as root:
        before = before_tree(args.before, str(root))
        print(f"   before: {os.environ.get('BENCH_WORKLOADS') or args.before} ({before}); "
              f"after: this tree ({REPO})")
        sys.path.insert(0, REPO)
        from workloads.make_tiny_datasets import write_cifar10, write_mnist

        data_dir = str(root / "data")
        write_cifar10(data_dir, train=args.samples, test=16)
        write_mnist(data_dir, train=args.samples, test=16)
        figures: dict[tuple[str, str, str], list[dict]] = {}
        for w in range(args.warmup + args.reps):
            for workload in workloads:
                for data in kinds:
                    order = VARIANTS[w % 3:] + VARIANTS[:w % 3]
                    dumps = {v: str(root / f"{workload}-{data}-{v}.pt") for v in VARIANTS}
                    for variant in sorted(order, key=lambda v: v != "before"):  # before first
                        tree = before if variant == "before" else REPO
                        mode = "cpu" if variant == "after-cpu" else "loader"
                        got = measure(tree, workload, data, data_dir, args.samples, mode,
                                      dumps[variant])
                        check(variant, got, workload, data, args.samples, dumps)
                        if w >= args.warmup:
                            figures.setdefault((workload, data, variant), []).append(got)
            print(f"  {'warm-up' if w < args.warmup else 'rep'} "
                  f"{w + 1 - (0 if w < args.warmup else args.warmup)} done")
        report(figures, workloads, kinds)
    footer()


def report(figures: dict, workloads: list[str], kinds: list[str]) -> None:
    def med(key, field):
        return statistics.median(g[field] for g in figures[key])

    rows = [("WORKLOAD", "DATA", "VARIANT", "CPU/SAMPLE", "MIN", "MAX", "RATIO", "SETUP CPU")]
    for workload in workloads:
        for data in kinds:
            base = med((workload, data, "before"), "cpu_per_sample_s")
            for variant in VARIANTS:
                got = figures[(workload, data, variant)]
                per = [g["cpu_per_sample_s"] for g in got]
                rows.append((workload, data, variant, f"{statistics.median(per) * 1e6:.1f}us",
                             f"{min(per) * 1e6:.1f}us", f"{max(per) * 1e6:.1f}us",
                             f"{statistics.median(per) / base:.3f}",
                             f"{med((workload, data, variant), 'setup_cpu_s'):.2f}s"))
    print_table(rows)
    if ("resnet", "real", "before") in figures:
        before = med(("resnet", "real", "before"), "cpu_per_sample_s")
        after = med(("resnet", "real", "after-gpu"), "cpu_per_sample_s")
        result_line("data_path", after / before, 0.1,
                    f"resnet 224x224 on real CIFAR-10: {before * 1e6:.0f}us -> {after * 1e6:.1f}us "
                    f"of CPU per image: one core feeds {1 / before:.0f} -> {1 / after:.0f} "
                    f"images/s (seed 001's GPU: {SEED_PER_S:.0f}/s; issue 46's target "
                    f"{2 * SEED_PER_S:.0f}/s)")


if __name__ == "__main__":
    main()
