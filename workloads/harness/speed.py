"""The GPU's own speed-ups, as options, and the tutorial's settings one flag away.

Each keeps the experiment what it is (the same model, data and updates, up
to the precision of the arithmetic) and has a default; the rank-0 log and
``ddp-orch up``'s summary name each one's value (``catalog.describe_speed``,
from the result's ``speed``):

* ``--amp``: auto is bf16 where the GPU has it natively (compute
  capability 8.0 and up: Ampere, Hopper, ...) and off elsewhere (an older
  GPU, the CPU); fp16 adds seed 004's GradScaler. bf16 on a GPU without it
  natively is refused: ``torch.cuda.is_bf16_supported()`` says yes there
  too, counting emulation, which is slower than fp32;
* ``--tf32``: TF32 for fp32 matmuls and convolutions, on compute
  capability 8.0 and up (torch's default: convolutions only);
* ``--channels-last`` (the ConvNets): NHWC weights and inputs, the layout
  tensor cores convolve fastest;
* ``--cudnn-benchmark``: cuDNN times its algorithms once per input shape
  and keeps the fastest; the shapes here are fixed;
* ``--seed-settings``: the tutorial's own settings, over all of the above
  (``catalog.SEED_AMP``: fp32 for 001 and 002, fp16 for 004; torch's
  defaults for the rest).

TF32 and cuDNN's benchmark are settings of the process (``torch.backends``),
set once here, before any work; on the CPU none of them applies but bf16.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from workloads.catalog import AMP_FP16_ON_CPU, SEED_AMP
from workloads.harness.context import DistContext, WorkloadError

NATIVE_BF16 = (8, 0)  # compute capability from which bf16 (and TF32) run natively


@dataclass(frozen=True)
class Amp:
    """Mixed precision as resolved for this run: dtype None means off."""

    mode: str  # off / fp16 / bf16
    device_type: str
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def capability(ctx: DistContext) -> tuple[int, int] | None:
    """This rank's GPU's compute capability (None on the CPU); its own GPU:
    the context bound it before anything asks (``context.bind_device``)."""
    return tuple(torch.cuda.get_device_capability(ctx.torch_device())) if ctx.is_cuda else None


def resolve_amp(requested: str, ctx: DistContext, cc: tuple[int, int] | None = None) -> Amp:
    """``--amp`` auto/off/fp16/bf16 for this device; refuses what cannot work.

    auto is bf16 on a GPU with native bf16, else off. fp16 on CPU is refused:
    CPU autocast is meant for bf16, and a GradScaler there would only hide
    that. bf16 on a GPU without it natively is refused, naming the GPU.
    """
    dev = "cuda" if ctx.is_cuda else "cpu"
    if ctx.is_cuda and cc is None:
        cc = capability(ctx)
    native = cc is not None and cc >= NATIVE_BF16
    mode = requested if requested != "auto" else ("bf16" if native else "off")
    if mode == "off":
        return Amp("off", dev, None, None)
    if mode == "fp16":
        if not ctx.is_cuda:
            raise WorkloadError(AMP_FP16_ON_CPU)  # the catalog's rule refuses it first
        return Amp("fp16", dev, torch.float16, torch.amp.GradScaler("cuda"))
    if mode == "bf16":
        if ctx.is_cuda and not native:
            raise WorkloadError(
                f"--amp bf16: {torch.cuda.get_device_name(ctx.torch_device())} (compute "
                f"capability {cc[0]}.{cc[1]}) has no native bfloat16, which needs "
                f"{NATIVE_BF16[0]}.{NATIVE_BF16[1]} or newer; torch would emulate it, slower "
                "than fp32: use --amp fp16 (with GradScaler) or --amp off")
        return Amp("bf16", dev, torch.bfloat16, None)
    raise WorkloadError(f"--amp must be auto, off, fp16 or bf16, got {requested!r}")


@dataclass(frozen=True)
class Speed:
    """The speed settings of this run, as applied (see module doc)."""

    amp: Amp
    tf32: str  # on / off / default (torch's: convolutions only) / unsupported / "" (CPU)
    channels_last: bool | None  # None: no ConvNet
    cudnn_benchmark: bool | None  # None on the CPU
    seed_settings: bool
    requested_amp: str
    capability: tuple[int, int] | None

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def record(self, loader_workers: int, requested_workers: int) -> dict[str, Any]:
        """The result's ``speed``, which ``catalog.describe_speed`` words."""
        return {"device": self.amp.device_type, "amp": self.amp.mode,
                "amp_requested": self.requested_amp, "tf32": self.tf32,
                "channels_last": self.channels_last, "cudnn_benchmark": self.cudnn_benchmark,
                "seed_settings": self.seed_settings,
                "capability": list(self.capability) if self.capability else None,
                "loader_workers": loader_workers,
                "loader_workers_auto": requested_workers < 0}


def resolve_speed(args: Any, ctx: DistContext, workload: str) -> Speed:
    """This rank's speed settings from ``args`` (the catalog's speed
    arguments); sets the process's TF32 and cuDNN flags on a GPU."""
    cc = capability(ctx)
    seed = bool(args.seed_settings)
    convnet = hasattr(args, "channels_last")
    requested = SEED_AMP[workload] if seed else args.amp
    if seed and requested == "fp16" and not ctx.is_cuda:
        requested = "off"  # the tutorial's fp16 needs CUDA; its CPU run is fp32
    amp = resolve_amp(requested, ctx, cc)
    if not ctx.is_cuda:
        return Speed(amp, "", False if convnet else None, None, seed, requested, None)
    if seed:
        tf32 = "default"  # as the tutorial ran: torch's flags untouched
    else:
        tf32 = "unsupported" if cc < NATIVE_BF16 else "on" if args.tf32 else "off"
        torch.backends.cuda.matmul.allow_tf32 = tf32 == "on"
        torch.backends.cudnn.allow_tf32 = tf32 == "on"
    benchmark = False if seed else bool(args.cudnn_benchmark)
    torch.backends.cudnn.benchmark = benchmark
    channels_last = (not seed and bool(args.channels_last)) if convnet else None
    return Speed(amp, tf32, channels_last, benchmark, seed, requested, cc)
