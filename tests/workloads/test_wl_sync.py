"""How often the training loop makes the host wait for the GPU, counted on a CPU.

On a GPU, a host read of a device value (``.item()``, ``.tolist()``, ...),
``torch.cuda.synchronize`` or a CUDA event's ``synchronize`` stops the CPU
until the GPU has caught up, so it cannot queue the next step while the GPU
runs this one (``workloads/harness/timing.py``). These tests run the real
``Trainer`` and ``make_step`` on CPU tensors, as a rank that believes it is
on CUDA: its context says CUDA, ``torch.cuda.Event`` and
``torch.cuda.synchronize`` are a stand-in GPU that passes an event only
``LAG`` events after it was recorded (or at a wait), and every host read the
harness makes counts as a wait. A sync per step creeping back into the loop
fails them; the starting commit of issue 46 had one per step in ``Trainer``
(``synchronize(ctx)``) and one in ``make_step``, on the real GPU path.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections import Counter

import pytest
import torch
from torch import nn

from workloads.harness import data as hdata
from workloads.harness import train
from workloads.harness.context import DistContext, process_group, read_context
from workloads.harness.report import RankZeroLog
from workloads.harness.timing import CudaMarks, HostMarks, clock_for

LAG = 3  # events the stand-in GPU runs behind the host
DATA_CODE = os.sep + os.path.join("torch", "utils", "data") + os.sep  # host tensors only


@dataclasses.dataclass(frozen=True)
class CudaLooking(DistContext):
    """A rank on the CPU whose context says CUDA: the harness takes its GPU
    path (events, the device's waits) while its tensors stay on the CPU."""

    @property
    def is_cuda(self) -> bool:
        return True


class StandInGpu:
    """The GPU's side of events and waits: the host's every wait (``waits``,
    each with what made it) lets the device catch up; otherwise it passes an
    event ``LAG`` events after it was recorded."""

    def __init__(self):
        self.recorded = 0
        self.caught_up = 0
        self.waits: list[str] = []

    def wait(self, why: str) -> None:
        self.waits.append(why)
        self.caught_up = self.recorded

    def event_class(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False, **_kw):
                assert enable_timing, "a timing event must be asked for"
                self.index = None

            def record(self, stream=None):
                self.index, gpu.recorded = gpu.recorded, gpu.recorded + 1
                self.at = time.perf_counter()

            def query(self) -> bool:
                return self.index < gpu.caught_up or self.index < gpu.recorded - LAG

            def synchronize(self):
                gpu.wait("Event.synchronize")

            def elapsed_time(self, end) -> float:
                # CUDA refuses (cudaErrorNotReady) to time events it has not run
                assert self.query() and end.query(), "elapsed_time before the GPU ran them"
                return (end.at - self.at) * 1000.0

        return Event


@pytest.fixture
def gpu(monkeypatch) -> StandInGpu:
    """The stand-in GPU, and every host read the harness makes counted as a
    wait for it (reads by DataLoader, whose tensors are the host's, not)."""
    standin = StandInGpu()
    monkeypatch.setattr(torch.cuda, "Event", standin.event_class())
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: standin.wait("torch.cuda.synchronize"))
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        real = getattr(torch.Tensor, name)

        def read(self, *args, _real=real, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if DATA_CODE not in caller:
                standin.wait(f"Tensor.{_name} in {os.path.basename(caller)}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)
    return standin


@pytest.fixture
def cpu_ctx():
    c = read_context({}, "cpu")
    with process_group(c):
        yield c


def waits_per_step(gpu: StandInGpu, monkeypatch, ctx, epochs: int = 2) -> tuple[list, object]:
    """Train linear on 400 points in batches of 4 (100 steps an epoch, a loss
    window every 10); return the waits made from each step's heartbeat to
    the next (the step's tail, the next one's body; the last, to the end of
    ``run``), the trainer, and the heartbeats' compute times."""
    from workloads.linear import make_dataset

    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    ddp = train.wrap_ddp(model, ctx)
    loader = hdata.train_loader(make_dataset(400, 0), ctx, 4, seed=1, shuffle=False)
    step = train.make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), nn.MSELoss())
    beats, times = [], []

    def beat(step_no, samples=None, compute_s=None, data_s=None):
        beats.append(len(gpu.waits))
        times.append(compute_s)

    monkeypatch.setattr(train, "heartbeat", beat)
    looks_cuda = CudaLooking(**dataclasses.asdict(ctx))
    trainer = train.Trainer(looks_cuda, loader, step, RankZeroLog(ctx, "t"), seed=1,
                            epochs=epochs)
    gpu.waits.clear()
    trainer.run()
    bounds = [0] + beats + [len(gpu.waits)]
    return [gpu.waits[a:b] for a, b in zip(bounds, bounds[1:])], trainer, times


def test_a_step_makes_the_host_wait_only_where_the_loss_window_is_read(gpu, monkeypatch,
                                                                       cpu_ctx):
    per_step, trainer, times = waits_per_step(gpu, monkeypatch, cpu_ctx)
    assert Counter(w for waits in per_step for w in waits) == {
        "Tensor.tolist in train.py": 20}  # in 200 steps: the 20 windows' losses
    # each after its window's last step: the all-reduced loss read by the host
    assert [i for i, waits in enumerate(per_step) if waits] == list(range(10, 201, 10))


def test_every_steps_times_are_read_without_waiting(gpu, monkeypatch, cpu_ctx):
    """Each step's times come off the stand-in GPU once it has passed them:
    all 200 reach the timer (with the forward pass and the all-reduce's
    exposed wait, from DDP's hook), and the heartbeats carry them from a
    step or more later instead of waiting for them."""
    per_step, trainer, times = waits_per_step(gpu, monkeypatch, cpu_ctx)
    timer = trainer.timer
    assert timer.steps == 200 and timer.forward_steps == 200 and timer.allreduce_steps == 200
    assert 0 < timer.forward_s < timer.compute_s and timer.allreduce_s >= 0
    assert times[0] is None  # the first step's events are still on the "GPU"
    assert sum(t is not None for t in times) >= 150


def test_the_rank_on_a_gpu_uses_events_and_on_the_cpu_the_hosts_clock():
    assert isinstance(clock_for(True).marks, CudaMarks)
    assert isinstance(clock_for(False).marks, HostMarks)
