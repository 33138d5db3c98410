"""Who this process is in the job, read once from the environment.

torchrun (and the ddp-orch launch on top of it) describes the job through
environment variables: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK (the node
rank), LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, plus ddp-orch's DDP_ORCH_DEVICE and
DDP_ORCH_RUN_ID. ``read_context`` turns one snapshot of that mapping into a
frozen ``DistContext``; nothing else in the workloads reads those variables,
and nothing writes to ``os.environ``.

Device policy (``resolve_device``): ``cpu`` means CPU + gloo even when GPUs
are visible -- ddp-orch still sets CUDA_VISIBLE_DEVICES in that case, one
listed index per CPU process, and it must be ignored. ``cuda`` demands a GPU
per local rank and fails clearly otherwise. ``auto`` takes CUDA + NCCL when
any GPU is visible, else CPU + gloo.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from workloads.catalog import NO_CUDA_DEVICE
from workloads.contract import DEVICE_CHOICES, DEVICE_ENV, RESULT_FILE_ENV, RUN_ID_ENV


class WorkloadError(ValueError):
    """A workload was asked for something it cannot do; the message says why.

    A ValueError (not SystemExit) so that torchrun's ``@record`` writes it to
    the error file and the controller can show it. The message is the whole
    story, so each rank prints it as one line, not a traceback (the worker
    shim reads ``contract.ONE_LINE_ERROR``; the error file keeps the traceback).
    """

    ddp_orch_one_line = True  # contract.ONE_LINE_ERROR


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; built once, never mutated."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    local_world_size: int
    device: str  # "cpu" or "cuda:<local index>"
    backend: str  # "gloo" or "nccl"
    launched: bool  # True under torchrun (env:// rendezvous), False when run alone
    hostname: str
    cuda_visible_devices: str | None
    run_id: str | None
    requested_device: str  # what was asked for: auto / cuda / cpu
    result_file: str | None  # DDP_ORCH_RESULT_FILE (a --result-file flag wins)

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def _visible_cuda_devices() -> int:
    """How many GPUs this process can use (0 without a CUDA build or driver)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_gpus(ctx: "DistContext") -> int:
    """The GPUs this rank drives: every visible one on CUDA, none on CPU."""
    return torch.cuda.device_count() if ctx.is_cuda else 0


def resolve_device(requested: str, local_rank: int,
                   cuda_devices: Callable[[], int]) -> tuple[str, str]:
    """(device, backend) for ``requested`` in auto/cuda/cpu; see module doc.

    ``cuda_devices`` is only called when CUDA is a possibility, so a cpu run
    never touches the CUDA runtime.
    """
    if requested not in DEVICE_CHOICES:
        raise WorkloadError(f"device must be one of {DEVICE_CHOICES}, got {requested!r}")
    if requested == "cpu":
        return "cpu", "gloo"
    count = cuda_devices()
    if count == 0:
        if requested == "cuda":
            raise WorkloadError(NO_CUDA_DEVICE)
        return "cpu", "gloo"
    if local_rank >= count:
        raise WorkloadError(
            f"local rank {local_rank} needs its own GPU but only {count} CUDA device(s) "
            "are visible; start at most one process per GPU, or use device 'cpu'")
    return f"cuda:{local_rank}", "nccl"


def read_context(env: Mapping[str, str], device: str | None = None, *,
                 cuda_devices: Callable[[], int] = _visible_cuda_devices,
                 hostname: str | None = None) -> DistContext:
    """Read the job description from ``env`` (normally ``os.environ``).

    ``device`` (a ``--device`` flag) overrides DDP_ORCH_DEVICE. Without
    torchrun's variables the process is a job of one (rank 0, world size 1).
    """
    launched = "RANK" in env and "WORLD_SIZE" in env
    local_rank = int(env.get("LOCAL_RANK", 0))
    requested = device or env.get(DEVICE_ENV) or "auto"
    dev, backend = resolve_device(requested, local_rank, cuda_devices)
    return DistContext(
        rank=int(env.get("RANK", 0)),
        local_rank=local_rank,
        world_size=int(env.get("WORLD_SIZE", 1)),
        node_rank=int(env.get("GROUP_RANK", 0)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        device=dev,
        backend=backend,
        launched=launched,
        hostname=hostname or socket.gethostname(),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        run_id=env.get(RUN_ID_ENV),
        requested_device=requested,
        result_file=env.get(RESULT_FILE_ENV) or None,
    )


def context_from_environ(device: str | None = None) -> DistContext:
    """``read_context`` on a snapshot of this process's environment."""
    return read_context(dict(os.environ), device)


@contextmanager
def process_group(ctx: DistContext) -> Iterator[None]:
    """Open the default process group for the body, destroy it in ``finally``.

    Under torchrun the group rendezvouses through env:// (MASTER_ADDR/PORT).
    Run alone, a one-process group on an in-memory HashStore is created
    instead, so every workload can use the same collectives and DDP wrapper
    whatever the world size, without opening a port or touching os.environ.
    """
    extra = {}
    if ctx.is_cuda:
        torch.cuda.set_device(ctx.torch_device())
        extra["device_id"] = ctx.torch_device()  # bind NCCL to our GPU eagerly
    if ctx.launched:
        dist.init_process_group(ctx.backend, rank=ctx.rank,
                                world_size=ctx.world_size, **extra)
    else:
        dist.init_process_group(ctx.backend, store=dist.HashStore(), rank=0,
                                world_size=1, **extra)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # on every exit path; see harness.job


def synchronize(ctx: DistContext) -> None:
    """Wait for queued device work, so a clock read after it means something."""
    if ctx.is_cuda:
        torch.cuda.synchronize(ctx.torch_device())
