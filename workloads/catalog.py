"""The built-in workloads and their arguments, as data.

Stdlib-only: the controller reads this to validate ``workload.args`` in a
cluster file and to list workloads, without importing torch. Each workload
builds its own argparse parser from the same entry (``build_parser``), so
the names, types and defaults shown by ``ddp-orch workloads`` are exactly
the ones the program accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # a rank builds its parser; the controller reads the table only
    import argparse


@dataclass(frozen=True)
class ArgSpec:
    """One command-line argument of a workload (``name`` is snake_case).

    ``minimum``: the smallest value the workload accepts, checked by the
    controller too, so a dry-run refuses what every rank would refuse.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple = ()
    minimum: int | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Layout:
    """What a workload's rules read besides its arguments: where its ranks run.

    Each rank builds it from what it sees (``harness/job.py``); the
    controller from the plan, before anything starts
    (``orchestrator/controller/refusals.py``), for the rank that fares
    worst, with None for what only the ranks can see (whether a node has
    GPUs, when ``device`` is ``auto`` on another machine). A rule with an
    unknown fact does not refuse there: the ranks check it again.
    """

    world_size: int
    device: str | None = None  # "cpu" or "cuda": what the rank uses
    gpus: int | None = None  # CUDA devices each rank sees (0 on CPU)
    restarts: bool = False  # ddp-orch may restart the run (DDP_ORCH_MAX_RESTARTS > 0)


@dataclass(frozen=True)
class Rule:
    """A refusal that depends on the arguments (defaults filled in) and the
    layout, so the controller refuses, before launch and in the workload's
    own words, what every rank would refuse after it. ``arg``: the argument
    it is about; ``refuses(args, layout)`` and ``message(args, layout)``;
    ``hint``: what to change, in ddp-orch's terms."""

    arg: str
    refuses: Callable[[Mapping[str, Any], Layout], bool]
    message: Callable[[Mapping[str, Any], Layout], str]
    hint: str = ""


@dataclass(frozen=True)
class WorkloadInfo:
    """A built-in workload: its CLI name, module, seed, arguments and rules."""

    name: str
    module: str
    summary: str
    seed: str
    args: tuple[ArgSpec, ...]
    rules: tuple[Rule, ...] = ()

    def arg(self, name: str) -> ArgSpec | None:
        key = name.replace("-", "_")
        return next((a for a in self.args if a.name == key), None)

    def refusal(self, args: Mapping[str, Any], layout: Layout) -> tuple[Rule, str] | None:
        """The first rule ``args`` break on ``layout``, with its message; None
        if none does. ``args`` may leave out defaults and spell keys with '-'."""
        given = {key.replace("-", "_"): value for key, value in args.items()}
        full = {a.name: given.get(a.name, a.default) for a in self.args}
        for rule in self.rules:
            if rule.refuses(full, layout):
                return rule, rule.message(full, layout)
        return None


# The words of the rules, also used where the ranks check the same thing
# without a rule (``harness/context.py``, ``harness/train.py``).
NO_CUDA_DEVICE = ("device 'cuda' was requested but no CUDA device is visible to this "
                  "process (check CUDA_VISIBLE_DEVICES and the driver)")
AMP_FP16_ON_CPU = "--amp fp16 needs CUDA; on CPU use --amp bf16 or --amp off"


def _device_rules() -> tuple[Rule, ...]:
    """Every workload's ``--device``: cuda where the ranks see no GPU."""
    return (Rule("device", lambda a, lay: a["device"] == "cuda" and lay.gpus == 0,
                 lambda a, lay: NO_CUDA_DEVICE,
                 "a procs: node (--procs) runs CPU processes: drop device=cuda, or give "
                 "the node gpus: (--gpus)"),)


def _resume_rules() -> tuple[Rule, ...]:
    """``--resume`` needs a checkpoint to read: ``--checkpoint``, or the
    default one of a run that may restart (``harness/checkpoint.py``)."""
    return (Rule("resume", lambda a, lay: a["resume"] and not a["checkpoint"]
                 and not lay.restarts,
                 lambda a, lay: "--resume needs --checkpoint PATH",
                 "set checkpoint to the file to resume from (relative to the code root), "
                 "or let ddp-orch restart the run (--max-restarts N: checkpoint.pt)"),)


def _amp_rules() -> tuple[Rule, ...]:
    return (Rule("amp", lambda a, lay: a["amp"] == "fp16" and lay.device == "cpu",
                 lambda a, lay: AMP_FP16_ON_CPU,
                 "the ranks run on CPU here (device cpu, or procs: nodes): use amp bf16 or "
                 "off, or GPUs"),)


def _dp_rules() -> tuple[Rule, ...]:
    """``mlp --mode dp``: one process driving at least two GPUs."""
    return (
        Rule("mode", lambda a, lay: a["mode"] == "dp" and lay.world_size > 1,
             lambda a, lay: (f"--mode dp is single-process nn.DataParallel but this job has "
                             f"world size {lay.world_size}; launch one process that sees "
                             "all GPUs, or use --mode ddp"),
             "use mode ddp: dp is one process driving every GPU it sees"),
        Rule("mode", lambda a, lay: a["mode"] == "dp" and lay.gpus is not None
             and lay.gpus < 2,
             lambda a, lay: (f"--mode dp needs at least 2 visible CUDA devices, found "
                             f"{lay.gpus}; DataParallel over fewer devices compares nothing"),
             "use mode ddp, or dp on one process that sees 2 or more GPUs"),
    )


def _image_size_rules() -> tuple[Rule, ...]:
    return (Rule("image_size", lambda a, lay: a["image_size"] < 8,
                 lambda a, lay: (f"--image-size {a['image_size']} is too small for ResNet-18 "
                                 "(>= 8)"),
                 "use 8 or more (32 is CIFAR-10's own size)"),)


# The mixed precision of each image workload's tutorial, which --seed-settings
# restores (with torch's defaults for TF32, channels_last and cuDNN's benchmark).
SEED_AMP = {"mlp": "off", "mnist": "fp16", "resnet": "off"}


def _speed(workload: str, *, convnet: bool) -> tuple[ArgSpec, ...]:
    """The GPU's own speed-ups, each an option with a default
    (``harness/speed.py``), and the tutorial's settings one flag away."""
    seed_amp = SEED_AMP[workload]
    return (
        ArgSpec("amp", str, "auto",
                "mixed precision: auto (bf16 on a GPU that has it natively, compute "
                "capability 8.0 and up; else off), off, fp16 (CUDA only, with GradScaler, "
                "which waits for the GPU every step) or bf16 (refused on a GPU without "
                "native bf16)", ("auto", "off", "fp16", "bf16")),
        ArgSpec("tf32", bool, True,
                "TF32 for fp32 matmuls and convolutions on GPUs of compute capability 8.0 "
                "and up (--no-tf32: IEEE fp32 throughout)"),
        ArgSpec("cudnn_benchmark", bool, True,
                "cuDNN times its algorithms once per input shape and keeps the fastest "
                "(the shapes are fixed here)"),
    ) + ((ArgSpec("channels_last", bool, True,
                  "on a GPU, the model and its inputs in NHWC (channels-last) memory, "
                  "which tensor cores convolve fastest"),) if convnet else ()) + (
        ArgSpec("seed_settings", bool, False,
                f"the tutorial's own settings over the options above: amp "
                f"{'fp16 with GradScaler (on CUDA)' if seed_amp == 'fp16' else 'off'}, and "
                "torch's defaults for TF32 (convolutions only) and cuDNN's benchmark "
                f"(off){', no channels_last' if convnet else ''}"),
    )


def describe_speed(speed: Mapping[str, Any]) -> str:
    """The ``speed:`` line of a result's ``speed`` (``harness/speed.py``'s
    record): what each option came to, with the loader's workers."""
    auto = " (auto)" if speed.get("amp_requested") == "auto" else ""
    workers = speed.get("loader_workers")
    loader = "" if workers is None else (
        f"; {workers} loader worker{'s' if workers != 1 else ''} per rank"
        + (" (auto)" if speed.get("loader_workers_auto") else ""))
    if speed.get("device") != "cuda":
        return (f"on the CPU: amp {speed.get('amp')}{auto} (TF32, channels_last and cuDNN's "
                f"benchmark are GPU options){loader}")
    tf32 = {"default": "torch's default (convolutions only)",
            "unsupported": "none (needs compute capability 8.0)"}.get(speed.get("tf32"),
                                                                     speed.get("tf32"))
    parts = [f"amp {speed.get('amp')}{auto}", f"tf32 {tf32}"]
    if speed.get("channels_last") is not None:
        parts.append(f"channels_last {'on' if speed['channels_last'] else 'off'}")
    parts.append(f"cudnn.benchmark {'on' if speed.get('cudnn_benchmark') else 'off'}")
    head = "the tutorial's settings (seed_settings): " if speed.get("seed_settings") else ""
    return head + ", ".join(parts) + loader


def _device() -> ArgSpec:
    return ArgSpec("device", str, None,
                   "auto, cuda or cpu (default: $DDP_ORCH_DEVICE, else auto); "
                   "cpu uses gloo even where GPUs are visible",
                   ("auto", "cuda", "cpu"))


def _pg_timeout() -> ArgSpec:
    return ArgSpec("pg_timeout", int, 0,
                   "seconds a collective may wait before torch's watchdog ends the process "
                   "group, dumping its flight recorder (0: torch's default, 10 minutes); set "
                   "it under the run's hang_timeout to have NCCL's own dump",
                   minimum=0)


def _common(*, epochs: int, batch: int, lr: float,
            num_workers: int = 0) -> tuple[ArgSpec, ...]:
    """Arguments every training workload shares (see workloads/harness).

    ``--global-batch-size`` works on every layout (the rule is
    ``harness.data.BatchSplit``'s): the tutorials' layouts such as 3 + 4
    GPUs have world sizes that divide no default batch here. Hence
    ``--lr-scaling`` is ``none`` for every workload: the global batch, and
    so the learning problem of each step, does not change with the world
    size, and a learning rate that did would make a 1-process run and a DDP
    run (``ddp-orch compare``) two different problems.
    """
    return (
        ArgSpec("epochs", int, epochs, "passes over the training set"),
        ArgSpec("global_batch_size", int, batch,
                "samples per optimizer step over all ranks, on any world size (32 on 7 "
                "ranks: 5,5,5,5,4,4,4, each rank's loss weighted by its share)",
                minimum=1),
        ArgSpec("lr", float, lr, "base learning rate"),
        ArgSpec("lr_scaling", str, "none",
                "none: use --lr as is; linear: multiply it by the world size (seed 001's "
                "rule, for a global batch that grows with the world size: with the same "
                "--global-batch-size it changes every step's update)",
                ("none", "linear")),
        ArgSpec("seed", int, 42, "seed for model init (same on every rank) and data order"),
        ArgSpec("max_steps", int, 0, "stop after this many steps (0: no limit)"),
        ArgSpec("log_every", int, 0, "print progress every N steps (0: per epoch)"),
        ArgSpec("shuffle", bool, True,
                "shuffle the training set each epoch (one order shared by all ranks)"),
        ArgSpec("num_workers", int, num_workers,
                "DataLoader worker processes per rank (-1: chosen from the node's CPUs and "
                "the ranks on it: on a GPU up to 4, leaving each rank one CPU; 0 on the "
                "CPU, where the ranks compute)", minimum=-1),
        _device(),
        _pg_timeout(),
    )


def _checkpointing() -> tuple[ArgSpec, ...]:
    """The checkpoint arguments of the workloads that resume after a restart."""
    return (
        ArgSpec("checkpoint", str, "",
                "rank 0 saves model/optimizer/scaler here after every epoch, atomically "
                "(empty: checkpoint.pt when ddp-orch may restart the run, else none); "
                "relative to the working directory"),
        ArgSpec("resume", bool, False,
                "continue from the checkpoint (read by rank 0, sent to all ranks); "
                "automatic after a gang restart (DDP_ORCH_RESTART_COUNT > 0)"),
    )


def _image_data(train: str, test: str) -> tuple[ArgSpec, ...]:
    """Where image workloads find their dataset, and how much of it to use."""
    return (
        ArgSpec("data_dir", str, "./data",
                "torchvision dataset root (relative paths: from the working directory); "
                "never downloaded"),
        ArgSpec("data", str, "auto",
                "auto: the real dataset when its folder exists, else a synthetic one of the "
                "same shape; real: require it; synthetic: always synthetic",
                ("auto", "real", "synthetic")),
        ArgSpec("train_samples", int, 0, f"use the first N training samples (0: all, {train})"),
        ArgSpec("test_samples", int, 0, f"use the first N test samples (0: all, {test})"),
    )


CATALOG: dict[str, WorkloadInfo] = {
    "noop": WorkloadInfo(
        name="noop",
        module="workloads.noop",
        summary="init the process group, one all_reduce, exit (launch overhead)",
        seed="-",
        args=(_device(), _pg_timeout()),
        rules=_device_rules(),
    ),
    "linear": WorkloadInfo(
        name="linear",
        module="workloads.linear",
        summary="linear regression y = 2x + 3 + noise; learns w~2, b~3",
        seed="000",
        args=_common(epochs=10, batch=32, lr=0.01) + (
            ArgSpec("samples", int, 10000, "size of the generated dataset"),
        ),
        rules=_device_rules(),
    ),
    "toy": WorkloadInfo(
        name="toy",
        module="workloads.toy",
        summary="2-feature, 2-class MLP (2-30-20-2); accuracy reduced over all ranks",
        seed="003",
        args=_common(epochs=3, batch=4, lr=0.5) + (
            ArgSpec("dataset", str, "seed",
                    "seed: the tutorial's 5 train / 2 test points; blobs: two generated "
                    "Gaussian clusters", ("seed", "blobs")),
            ArgSpec("samples", int, 200, "training points for --dataset blobs "
                                         "(plus a quarter as many test points)"),
        ),
        rules=_device_rules(),
    ),
    "mlp": WorkloadInfo(
        name="mlp",
        module="workloads.mlp",
        summary="3072-512-10 MLP on CIFAR-10-shaped data; DDP, or with --mode dp "
                "nn.DataParallel: one process over >= 2 GPUs, compared with DDP by "
                "`ddp-orch compare --local --workload mlp --gpus 0,1 --baseline dp`",
        seed="002",
        args=_common(epochs=1, batch=64, lr=0.01, num_workers=-1) + (
            ArgSpec("mode", str, "ddp",
                    "ddp: one process per device; dp: one process driving every visible "
                    "GPU with nn.DataParallel (needs >= 2 GPUs and world size 1: "
                    "`ddp-orch compare ... --baseline dp` runs it as compare's baseline)",
                    ("ddp", "dp")),
            ArgSpec("eval", bool, True, "measure test accuracy after each epoch"),
        ) + _speed("mlp", convnet=False) + _image_data("50000 for CIFAR-10", "10000"),
        rules=_device_rules() + _dp_rules() + _amp_rules(),
    ),
    "mnist": WorkloadInfo(
        name="mnist",
        module="workloads.mnist",
        summary="ConvNet with (Sync)BatchNorm on MNIST; AMP, checkpoint and resume",
        seed="004",
        args=_common(epochs=3, batch=64, lr=1e-4, num_workers=-1) + (
            ArgSpec("momentum", float, 0.0, "SGD momentum (the tutorial uses plain SGD)"),
            ArgSpec("sync_bn", bool, True,
                    "convert BatchNorm to SyncBatchNorm (CUDA only; on CPU plain "
                    "BatchNorm is kept and the result says why)"),
        ) + _speed("mnist", convnet=True) + _checkpointing() + _image_data("60000 for MNIST",
                                                                          "10000"),
        rules=_device_rules() + _amp_rules() + _resume_rules(),
    ),
    "resnet": WorkloadInfo(
        name="resnet",
        module="workloads.resnet",
        summary="torchvision ResNet-18 on CIFAR-10 with a data/compute time breakdown",
        seed="001",
        args=_common(epochs=1, batch=512, lr=0.01, num_workers=-1) + (
            ArgSpec("image_size", int, 224,
                    "resize the 32x32 images to this size (224 makes it compute-bound)"),
            ArgSpec("momentum", float, 0.9, "SGD momentum"),
            ArgSpec("augment", bool, False,
                    "random crop + horizontal flip (drawn per rank, see harness.data)"),
            ArgSpec("eval", bool, True, "measure test accuracy after each epoch"),
        ) + _speed("resnet", convnet=True) + _checkpointing()
        + _image_data("50000 for CIFAR-10", "10000"),
        rules=_device_rules() + _amp_rules() + _resume_rules() + _image_size_rules(),
    ),
    "collective": WorkloadInfo(
        name="collective",
        module="workloads.collective",
        summary="a tiny all-reduce between every pair of nodes, then across the gang: the "
                "smoke test of check --collective (each pair named, timed, its transport)",
        seed="-",
        args=(ArgSpec("bound", int, 30, "seconds each pair, and then the gang, may take",
                      minimum=1),
              ArgSpec("megabytes", int, 1, "size of the timed all-reduce, MiB", minimum=1),
              _device(), _pg_timeout()),
        rules=_device_rules(),
    ),
}


def build_parser(name: str) -> argparse.ArgumentParser:
    """An argparse parser for workload ``name``; bools get --x/--no-x."""
    import argparse

    info = CATALOG[name]
    parser = argparse.ArgumentParser(prog=info.module, description=info.summary)
    for arg in info.args:
        if arg.type is bool:
            parser.add_argument(arg.flag, dest=arg.name, default=arg.default,
                                action=argparse.BooleanOptionalAction, help=arg.help)
        else:
            parser.add_argument(arg.flag, dest=arg.name, type=arg.type,
                                default=arg.default, help=arg.help,
                                choices=arg.choices or None)
    parser.add_argument("--result-file", default=None,
                        help="where rank 0 writes its JSON result "
                             "(default: $DDP_ORCH_RESULT_FILE, else none)")
    return parser

