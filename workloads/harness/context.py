"""Who this process is in the job, read once from the environment.

torchrun (and the ddp-orch launch on top of it) describes the job through
environment variables: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK (the node
rank), LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, plus ddp-orch's DDP_ORCH_DEVICE and
DDP_ORCH_RUN_ID, DDP_ORCH_GPU_UUIDS. ``read_context`` turns one snapshot of
that mapping into a frozen ``DistContext``; nothing else in the workloads
reads those variables, and nothing writes to ``os.environ``.

Device policy (``resolve_device``): ``cpu`` means CPU + gloo even when GPUs
are visible -- ddp-orch still sets CUDA_VISIBLE_DEVICES in that case, one
listed index per CPU process, and it must be ignored. ``cuda`` demands a GPU
per local rank and fails at once otherwise, naming what torch sees; ddp-orch
decides cuda or cpu once for the whole gang, so no rank may quietly differ.
``auto`` (a script run alone or under plain torchrun) takes CUDA + NCCL when
any GPU is visible, else CPU + gloo, and says so in a warning on rank 0.

``context_from_environ`` also binds a CUDA rank to its GPU at once
(``bind_device``): anything that asks CUDA a question later (bf16 support,
device properties) then asks about this rank's GPU instead of opening a
context on cuda:0, and a GPU other than the one ddp-orch planned is refused
before any work.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, NamedTuple

import torch
import torch.distributed as dist

from workloads.catalog import NO_CUDA_DEVICE
from workloads.contract import (DEVICE_CHOICES, DEVICE_ENV, GPU_UUIDS_ENV, RESULT_FILE_ENV,
                                RUN_ID_ENV)


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
    cuda_device_order: str | None  # CUDA_DEVICE_ORDER, for the rank table
    planned_gpu_uuids: tuple[str, ...]  # DDP_ORCH_GPU_UUIDS, in CUDA_VISIBLE_DEVICES order
    fallback: str | None  # why ``auto`` fell back to CPU (a warning for rank 0), else None

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def torch_device(self) -> torch.device:
        return torch.device(self.device)


class CudaView(NamedTuple):
    """What torch sees of CUDA in this process: enough to say why a GPU is missing."""

    build: str | None  # torch.version.cuda: None for a CPU-only build of torch
    available: bool  # torch.cuda.is_available()
    count: int  # torch.cuda.device_count()

    @property
    def usable(self) -> int:
        """GPUs this process can use: none unless CUDA is available."""
        return self.count if self.available else 0

    def describe(self, visible: str | None) -> str:
        shown = "(unset)" if visible is None else repr(visible)
        return (f"torch {torch.__version__} built for CUDA {self.build}, "
                f"torch.cuda.is_available() is {self.available}, "
                f"torch.cuda.device_count() is {self.count}, CUDA_VISIBLE_DEVICES={shown}")


def probe_cuda() -> CudaView:
    """Ask torch about CUDA; counting devices opens no context on any GPU."""
    return CudaView(torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())


class Placement(NamedTuple):
    """Where a rank runs: ``device``, ``backend``, and ``fallback`` -- why an
    ``auto`` run is on the CPU (None when it is not a fallback)."""

    device: str
    backend: str
    fallback: str | None = None


def visible_gpus(ctx: "DistContext") -> int:
    """The GPUs this rank drives: every visible one on CUDA, none on CPU."""
    return torch.cuda.device_count() if ctx.is_cuda else 0


def resolve_device(requested: str, local_rank: int, local_world_size: int,
                   cuda: Callable[[], CudaView], visible: str | None) -> Placement:
    """The placement for ``requested`` in auto/cuda/cpu; see module doc.

    ``cuda`` is only called when CUDA is a possibility, so a cpu run never
    touches the CUDA runtime. Every local rank checks the node's need (one
    GPU per local rank), so all of them fail together, not just the ones
    past the last GPU while the others wait at the rendezvous.
    """
    if requested not in DEVICE_CHOICES:
        raise WorkloadError(f"device must be one of {DEVICE_CHOICES}, got {requested!r}")
    if requested == "cpu":
        return Placement("cpu", "gloo")
    view = cuda()
    if view.usable == 0:
        if requested == "cuda":
            raise WorkloadError(f"{NO_CUDA_DEVICE}: {view.describe(visible)}")
        return Placement("cpu", "gloo",
                         f"device auto found no usable GPU ({view.describe(visible)}); "
                         "training on the CPU with gloo (ask for device cuda to make this "
                         "an error)")
    needed = max(local_rank + 1, local_world_size)
    if needed > view.usable:
        raise WorkloadError(
            f"{needed} processes on this node need a GPU each but only {view.usable} CUDA "
            f"device(s) are usable ({view.describe(visible)}); start at most one process "
            "per GPU, or use device 'cpu'")
    return Placement(f"cuda:{local_rank}", "nccl")


def read_context(env: Mapping[str, str], device: str | None = None, *,
                 cuda: Callable[[], CudaView] = probe_cuda,
                 hostname: str | None = None) -> DistContext:
    """Read the job description from ``env`` (normally ``os.environ``).

    ``device`` (a ``--device`` flag) overrides DDP_ORCH_DEVICE. Without
    torchrun's variables the process is a job of one (rank 0, world size 1).
    """
    launched = "RANK" in env and "WORLD_SIZE" in env
    local_rank = int(env.get("LOCAL_RANK", 0))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", 1))
    requested = device or env.get(DEVICE_ENV) or "auto"
    place = resolve_device(requested, local_rank, local_world_size, cuda,
                           env.get("CUDA_VISIBLE_DEVICES"))
    return DistContext(
        rank=int(env.get("RANK", 0)),
        local_rank=local_rank,
        world_size=int(env.get("WORLD_SIZE", 1)),
        node_rank=int(env.get("GROUP_RANK", 0)),
        local_world_size=local_world_size,
        device=place.device,
        backend=place.backend,
        launched=launched,
        hostname=hostname or socket.gethostname(),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        run_id=env.get(RUN_ID_ENV),
        requested_device=requested,
        result_file=env.get(RESULT_FILE_ENV) or None,
        cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
        planned_gpu_uuids=tuple(u.strip() for u in env.get(GPU_UUIDS_ENV, "").split(",")
                                if u.strip()),
        fallback=place.fallback,
    )


def context_from_environ(device: str | None = None) -> DistContext:
    """``read_context`` on a snapshot of this process's environment, with a
    CUDA rank already bound to its GPU (``bind_device``)."""
    ctx = read_context(dict(os.environ), device)
    bind_device(ctx)
    return ctx


def bind_device(ctx: DistContext) -> None:
    """Make this rank's GPU the current device, then check it is the planned one.

    Before this, any CUDA query about "the current device" (such as
    ``torch.cuda.is_bf16_supported()``) would open a context on cuda:0 in
    every local rank: memory on GPU 0 it never frees, per process.
    """
    if not ctx.is_cuda:
        return
    torch.cuda.set_device(ctx.torch_device())
    refused = planned_gpu_mismatch(ctx.planned_gpu_uuids, ctx.local_rank,
                                   gpu_identity(ctx.torch_device())[1])
    if refused:
        raise WorkloadError(refused)


def normalise_gpu_uuid(raw: str) -> str:
    """A GPU UUID in nvidia-smi's form, ``GPU-xxxxxxxx-xxxx-...``: torch prints
    the bare hex groups; a value already prefixed (GPU-/MIG-) is kept."""
    text = str(raw).strip()
    return text if text[:4].upper() in ("GPU-", "MIG-") else f"GPU-{text}"


def gpu_identity(device: torch.device) -> tuple[str, str]:
    """(model name, UUID in nvidia-smi's form) of ``device`` as this process sees it."""
    props = torch.cuda.get_device_properties(device)
    return props.name, normalise_gpu_uuid(str(props.uuid))


def planned_gpu_mismatch(planned: tuple[str, ...], local_rank: int, actual: str) -> str | None:
    """Why this rank is on the wrong GPU, or None (also when nothing was planned).

    ``planned`` lists the UUIDs ddp-orch meant, in CUDA_VISIBLE_DEVICES order,
    so local rank i should be on ``planned[i]``. UUIDs compare without their
    GPU-/MIG- prefix and case. The usual cause of a mismatch: the planner used
    nvidia-smi's PCI bus order, CUDA enumerates fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so the same index names another GPU.
    """
    if not planned:
        return None
    if local_rank >= len(planned):
        return (f"local rank {local_rank} has no planned GPU: {GPU_UUIDS_ENV} lists "
                f"{len(planned)} UUID(s) ({','.join(planned)})")
    if _uuid_key(planned[local_rank]) == _uuid_key(actual):
        return None
    return (f"local rank {local_rank} is on GPU {actual} but ddp-orch planned "
            f"{planned[local_rank]}; the usual cause is CUDA_DEVICE_ORDER not being "
            "PCI_BUS_ID (CUDA numbers GPUs fastest first, nvidia-smi by PCI bus): set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID")


def _uuid_key(uuid: str) -> str:
    return normalise_gpu_uuid(uuid)[4:].lower()


@contextmanager
def process_group(ctx: DistContext, timeout_s: int = 0) -> Iterator[None]:
    """Open the default process group for the body, destroy it in ``finally``.

    Under torchrun the group rendezvouses through env:// (MASTER_ADDR/PORT).
    Run alone, a one-process group on an in-memory HashStore is created
    instead, so every workload can use the same collectives and DDP wrapper
    whatever the world size, without opening a port or touching os.environ.
    ``timeout_s`` (``--pg-timeout``; 0: torch's default) bounds each collective.
    """
    import datetime

    extra: dict = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s > 0 else {}
    if ctx.is_cuda:  # the device itself was set when the context was read (bind_device)
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
