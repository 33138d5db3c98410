"""Step clocks in the style of seed 001: data time, compute(+sync) time, batch time.

For each step: *data* is the wait for the next batch from the loader,
*compute* is host-to-device copy + forward + backward (with DDP's gradient
all-reduce) + optimizer step, up to a device synchronise, and *batch* is the
two together. Averages cover every step; the per-step series is kept at a
bounded size (``CappedSeries``) so a long run does not bloat result.json.
"""

from __future__ import annotations

import time


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
        self.series = CappedSeries(cap)

    def record(self, step: int, data_s: float, compute_s: float,
               forward_s: float | None = None) -> None:
        self.steps += 1
        self.data_s += data_s
        self.compute_s += compute_s
        if forward_s is not None:
            self.forward_s += forward_s
            self.forward_steps += 1
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
            # global samples over the summed batch times, as in seed 001
            "samples_per_s": global_samples / self.batch_s if self.batch_s > 0 else 0.0,
            "series": {"columns": ["step", "data_s", "compute_s", "batch_s"],
                       "stride": self.series.stride, "rows": self.series.rows},
        }


now = time.perf_counter
