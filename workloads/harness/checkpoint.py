"""Checkpoints at epoch boundaries, and resuming from them after a restart.

Rank 0 saves after every completed epoch: model, optimizer, GradScaler,
the epoch and step counters, and the sampler epoch (which, with the seed,
fixes the data order of every later epoch: ``harness.data.seed_epoch``, so
no RNG state needs saving). It writes a temp file beside the target,
fsyncs it and renames it over, so a crash mid-save leaves the previous
checkpoint whole. Resuming, rank 0 reads the file and broadcasts its bytes,
so other nodes need no copy; every rank then decodes them with
``torch.load(weights_only=True)``. The broadcast is a plain uint8 tensor,
not ``broadcast_object_list``: that one needs numpy, which a node with torch
alone (as the README promises) lacks.

Where: ``--checkpoint PATH``; when the run may restart (ddp-orch sets
``DDP_ORCH_MAX_RESTARTS``), by default ``checkpoint.pt`` in the node's run
directory (the working directory), so a whole-gang restart
(``DDP_ORCH_RESTART_COUNT`` > 0) finds it. When: ``--resume``, or
any restart whose checkpoint exists. A resumed run continues exactly as
an uninterrupted one with the same seed and world size.
"""

from __future__ import annotations

import io
import os
import tempfile
from typing import Any, Callable

import torch

from workloads import contract
from workloads.harness.context import DistContext, WorkloadError
from workloads.harness.evidence import broadcast_bytes, broadcast_json

DEFAULT_NAME = "checkpoint.pt"


def checkpoint_path(args: Any) -> str:
    """``--checkpoint``, else the default when the run may restart, else "" (none)."""
    if args.checkpoint:
        return args.checkpoint
    return DEFAULT_NAME if contract.max_restarts() > 0 else ""


def save(path: str, state: dict) -> None:
    """torch.save to a temp file beside ``path``, fsync, then rename over it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-ckpt-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(ctx: DistContext, path: str) -> dict:
    """Rank 0 reads ``path``; every rank gets the state (or the same error)."""
    where = os.path.abspath(path)
    blob, error = b"", None
    if ctx.is_rank0:
        try:
            with open(path, "rb") as fh:
                blob = fh.read()
        except OSError as err:
            error = f"cannot resume from {where}: {err}"
    error = broadcast_json(ctx, error)
    if error:
        raise WorkloadError(error)
    blob = broadcast_bytes(ctx, blob)
    try:
        return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- every rank decodes the same bytes, fails alike
        raise WorkloadError(f"cannot resume from {where}: {err}") from err


def resume_state(ctx: DistContext, args: Any, log: Callable[[str], None]) -> dict | None:
    """The state to continue from: ``--resume``, or after a gang restart the
    latest checkpoint if there is one (every rank agrees: rank 0 decides)."""
    path = checkpoint_path(args)
    restart = contract.restart_count()
    if args.resume:
        return load(ctx, path)
    if not (restart and path):
        return None
    if not broadcast_json(ctx, ctx.is_rank0 and os.path.exists(path)):
        log(f"restart {restart}: no checkpoint at {path} yet; training starts from scratch")
        return None
    state = load(ctx, path)
    log(f"restart {restart}: resuming from {path} (epoch {state['epoch']}, step {state['step']})")
    return state


def epoch_saver(args: Any, ctx: DistContext, workload: str, model, optimizer, scaler,
                log: Callable[[str], None], **extra) -> Callable[[Any], None]:
    """An on_epoch_end piece: rank 0 saves after each *completed* epoch."""
    path = checkpoint_path(args)

    def save_epoch(trainer) -> None:
        if not (path and trainer.epoch_complete and ctx.is_rank0):
            return
        save(path, {"workload": workload, "epoch": trainer.epoch, "step": trainer.step,
                    "sampler_epoch": trainer.epoch, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "world_size": ctx.world_size, "seed": args.seed, **extra})
        log(f"checkpoint (epoch {trainer.epoch}, step {trainer.step}) -> {path}")

    return save_epoch


def restore(state: dict, model, optimizer, scaler, ctx: DistContext, args: Any,
            log: Callable[[str], None], workload: str) -> tuple[int, int]:
    """Load ``state`` into the model, optimizer and scaler; (epoch, step) to start at."""
    if state.get("workload") not in (None, workload):
        raise WorkloadError(f"{checkpoint_path(args)} is a checkpoint of {state['workload']}, "
                            f"not of {workload}; give --checkpoint a path of its own")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    if (state.get("world_size"), state.get("seed")) != (ctx.world_size, args.seed):
        log(f"note: checkpoint written with world size {state.get('world_size')} and seed "
            f"{state.get('seed')}; this run differs, so it will not continue exactly "
            "like an uninterrupted run")
    return int(state["epoch"]), int(state["step"])
