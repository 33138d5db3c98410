"""Step clocks in the style of seed 001: data time, compute(+sync) time, batch time.

For each step: *data* is the device's wait for the next batch (on the CPU,
the wait for the loader), *compute* is host-to-device copy + the batch's
preprocessing + forward + backward (with DDP's gradient all-reduce) +
optimizer step, and *batch* is the two together; *all-reduce* is the part
of compute the step spent waiting for the gradients' all-reduce once its
own backward was done (what the overlap did not hide), and *forward* the
part before the all-reduce began. Averages cover every step; the per-step
series is kept at a bounded size (``CappedSeries``) so a long run does not
bloat result.json.

``StepClock`` takes those times without ever waiting for the device: on a
GPU each mark is a CUDA event recorded on the stream, and a step's times are
read once its last event has passed, a step or more later, or at the next
point that waits anyway (the loss window's all_reduce, the epoch's end). A
``torch.cuda.synchronize`` per step, as the seed has, makes the CPU wait for
the GPU every step, so the host cannot queue the next step's work while the
GPU runs this one: small models then run at the speed of the CPU's kernel
launches, not the GPU's (tests/workloads/test_wl_sync.py counts the waits).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple


class CappedSeries:
    """Rows ``[step, ...]`` kept at most ``cap`` long by striding.

    Every ``stride``-th row offered is kept; when more than ``cap`` are kept,
    every other one is dropped and the stride doubles. The series thus always
    spans the whole run evenly, whatever its length.
    """

    def __init__(self, cap: int = 1000):
        self.cap = max(2, cap)
        self.stride = 1
        self.offered = 0
        self._kept: list[tuple[int, list[float]]] = []  # (offer index, row)

    def add(self, step: int, *values: float) -> None:
        index, self.offered = self.offered, self.offered + 1
        if index % self.stride:
            return
        self._kept.append((index, [step, *values]))
        if len(self._kept) > self.cap:
            self.stride *= 2
            self._kept = [(i, r) for i, r in self._kept if i % self.stride == 0]

    @property
    def rows(self) -> list[list[float]]:
        return [r for _, r in self._kept]


class StepTimer:
    """Sums and a capped series of the three per-step times (seconds), and
    the sum of the steps' forward passes where the step gives them (its part
    before the gradients' all-reduce: with data, the rank's time outside
    collectives, which names the slowest rank, ``report/pace.py``)."""

    def __init__(self, cap: int = 1000):
        self.steps = 0
        self.data_s = 0.0
        self.compute_s = 0.0
        self.forward_s = 0.0
        self.forward_steps = 0
        self.allreduce_s = 0.0
        self.allreduce_steps = 0
        self.series = CappedSeries(cap)

    def record(self, step: int, data_s: float, compute_s: float,
               forward_s: float | None = None, allreduce_s: float | None = None) -> None:
        self.steps += 1
        self.data_s += data_s
        self.compute_s += compute_s
        if forward_s is not None:
            self.forward_s += forward_s
            self.forward_steps += 1
        if allreduce_s is not None:
            self.allreduce_s += allreduce_s
            self.allreduce_steps += 1
        self.series.add(step, data_s, compute_s, data_s + compute_s)

    @property
    def batch_s(self) -> float:
        return self.data_s + self.compute_s

    def rank_stats(self) -> dict:
        """This rank's step time: mean over all steps, p50 and p95 over the kept
        series (at most ``cap`` evenly spaced steps), in seconds; where every
        step gave its forward pass, the means of that and of the wait for
        data (``forward_mean_s``, ``data_mean_s``)."""
        times = sorted(row[3] for row in self.series.rows)
        if not times:
            return {"steps": self.steps, "mean_s": 0.0, "p50_s": 0.0, "p95_s": 0.0}

        def pick(q: float) -> float:
            return times[min(len(times) - 1, int(q * (len(times) - 1) + 0.5))]

        outside = {"forward_mean_s": self.forward_s / self.steps,
                   "data_mean_s": self.data_s / self.steps} \
            if self.forward_steps == self.steps else {}
        return {"steps": self.steps, "mean_s": self.batch_s / max(self.steps, 1),
                "p50_s": pick(0.50), "p95_s": pick(0.95), **outside}

    def summary(self, global_samples: int) -> dict:
        """The ``timing`` fields of the result (``total_s`` is added by report)."""
        n = max(self.steps, 1)
        return {
            "steps": self.steps,
            "samples": global_samples,
            "train_s": self.batch_s,
            "avg_batch_s": self.batch_s / n,
            "avg_data_s": self.data_s / n,
            "avg_compute_s": self.compute_s / n,
            # the all-reduce's exposed part, within compute; where every step gave it
            **({"avg_allreduce_s": self.allreduce_s / n}
               if self.steps and self.allreduce_steps == self.steps else {}),
            # global samples over the summed batch times, as in seed 001
            "samples_per_s": global_samples / self.batch_s if self.batch_s > 0 else 0.0,
            "series": {"columns": ["step", "data_s", "compute_s", "batch_s"],
                       "stride": self.series.stride, "rows": self.series.rows},
        }


now = time.perf_counter


class StepTimes(NamedTuple):
    """One step's times in seconds (see module doc); None where not marked."""

    step: int
    data_s: float
    compute_s: float
    forward_s: float | None
    allreduce_s: float | None


class HostMarks:
    """Marks on the host's clock: on the CPU, a step's work is done when its
    calls return, so a mark is the time and is passed at once."""

    def mark(self) -> float:
        return now()

    def passed(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        pass

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaMarks:
    """Marks on the GPU's clock: a CUDA event recorded on the current stream
    (the rank's GPU, bound when its context was read), passed once the
    device has run everything queued before it. Recording waits for
    nothing; ``passed`` asks without waiting; only ``wait`` blocks."""

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def passed(self, mark: Any) -> bool:
        return mark.query()

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0


@dataclass
class _Step:
    """The marks of one step, until its times are read."""

    step: int
    waited_s: float  # the host's wait for the batch: the first step's data time
    after: Any  # the previous step's ``idle`` mark, or None
    begin: Any
    forward: Any = None
    grads: Any = None
    backward: Any = None
    end: Any = None


class StepClock:
    """Each step's times, read without waiting for the device (module doc).

    The Trainer marks a step's ``begin`` (its batch in hand), ``end`` (the
    optimizer step queued) and ``idle`` (the loop's own work done: the next
    wait for data starts there); the step function marks ``forward`` (the
    loss computed) and ``backward`` (backward returned), and DDP's
    communication hook ``grads`` as each gradient bucket is ready (the last
    one counts). ``ready`` returns the steps the device has finished,
    ``drain`` all of them, waiting for the last.
    """

    def __init__(self, marks: HostMarks | CudaMarks):
        self.marks = marks
        self._pending: deque[_Step] = deque()
        self._open: _Step | None = None
        self._idle: Any = None

    def new_epoch(self) -> None:
        """The next step's data time is the host's wait: the device was
        waiting for the epoch's end (evaluation, a checkpoint), not for data."""
        self._idle = None

    def begin(self, step: int, waited_s: float) -> None:
        self._open = _Step(step, waited_s, self._idle, self.marks.mark())

    def forward_done(self) -> None:
        if self._open is not None:
            self._open.forward = self.marks.mark()

    def grads_ready(self) -> None:
        if self._open is not None:
            self._open.grads = self.marks.mark()

    def backward_done(self) -> None:
        if self._open is not None:
            self._open.backward = self.marks.mark()

    def end(self) -> None:
        if self._open is not None:
            self._open.end = self.marks.mark()
            self._pending.append(self._open)
            self._open = None

    def idle(self) -> None:
        self._idle = self.marks.mark()

    def ready(self) -> list[StepTimes]:
        """The finished steps' times, in order; waits for nothing."""
        out = []
        while self._pending and self.marks.passed(self._pending[0].end):
            out.append(self._times(self._pending.popleft()))
        return out

    def drain(self) -> list[StepTimes]:
        """Every step's times, waiting for the last (a point that waits anyway)."""
        if self._pending and not self.marks.passed(self._pending[-1].end):
            self.marks.wait(self._pending[-1].end)
        return self.ready()

    def _times(self, s: _Step) -> StepTimes:
        between = self.marks.seconds
        data = between(s.after, s.begin) if s.after is not None else s.waited_s
        forward = between(s.begin, s.forward) if s.forward is not None else None
        allreduce = between(s.grads, s.backward) \
            if s.grads is not None and s.backward is not None else None
        return StepTimes(s.step, max(0.0, data), between(s.begin, s.end), forward,
                         None if allreduce is None else max(0.0, allreduce))


class _NoClock:
    """Where a step function runs outside a Trainer: its marks go nowhere."""

    def forward_done(self) -> None:
        pass

    def grads_ready(self) -> None:
        pass

    def backward_done(self) -> None:
        pass


NO_CLOCK = _NoClock()


def clock_for(is_cuda: bool) -> StepClock:
    """The clock of a rank on a GPU (CUDA events) or on the CPU (the host's)."""
    return StepClock(CudaMarks() if is_cuda else HostMarks())
