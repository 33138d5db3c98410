"""Each rank's GPU while the run goes on, from the nodes' heartbeats, and at
the end the rank whose GPU sat far below the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

MAX_GPUS = 1024  # a sample naming more than this many GPUs is not believed
# A rank's GPU is "far below" when its mean utilisation is under this share of
# the median rank's, with the median itself busy enough to mean something.
IDLE_SHARE = 0.5
IDLE_MEDIAN_MIN = 20.0


@dataclass
class GpuUse:
    """One node's GPU samples: the latest per index, mean utilisation, peak memory."""

    now: dict[int, tuple[int | None, int | None]] = field(default_factory=dict)
    util_sum: dict[int, float] = field(default_factory=dict)
    util_count: dict[int, int] = field(default_factory=dict)
    mem_peak: dict[int, int] = field(default_factory=dict)

    def add(self, sample: object) -> None:
        """A heartbeat's ``gpus``, ``{"3": [util %, memory MiB]}``; anything else
        is ignored (it crossed the network)."""
        if not isinstance(sample, dict):
            return
        for key, value in list(sample.items())[:MAX_GPUS]:
            if not (isinstance(key, str) and key.isdigit() and isinstance(value, list)
                    and len(value) == 2 and all(_count(v) for v in value)):
                continue
            index, (util, used) = int(key), value
            self.now[index] = (util, used)
            if util is not None:
                self.util_sum[index] = self.util_sum.get(index, 0.0) + util
                self.util_count[index] = self.util_count.get(index, 0) + 1
            if used is not None:
                self.mem_peak[index] = max(used, self.mem_peak.get(index, 0))

    def mean_util(self, index: int) -> float | None:
        count = self.util_count.get(index)
        return self.util_sum[index] / count if count else None


def _count(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and 0 <= value < 1 << 40)


def rank_gpu(use: GpuUse, gpu: int | None) -> dict[str, Any]:
    """What ``progress.json`` says of a rank's GPU; nothing before a sample."""
    if gpu is None or gpu not in use.now:
        return {}
    util, used = use.now[gpu]
    mean = use.mean_util(gpu)
    return {"gpu": gpu, "gpu_util": util, "gpu_mem_mib": used,
            "gpu_util_mean": None if mean is None else round(mean, 1),
            "gpu_mem_peak_mib": use.mem_peak.get(gpu)}


def idle_rank(ranks: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The rank whose GPU sat far below the others, in words; None when none
    stands out or fewer than two were sampled."""
    means = {int(rank): float(seen["gpu_util_mean"]) for rank, seen in ranks.items()
             if isinstance(seen, Mapping) and isinstance(seen.get("gpu_util_mean"), (int, float))
             and str(rank).isdigit()}
    if len(means) < 2:
        return None
    from statistics import median  # only at a run's end: its import is not free

    middle = median(means.values())
    rank, low = min(means.items(), key=lambda kv: (kv[1], kv[0]))
    if middle < IDLE_MEDIAN_MIN or low >= IDLE_SHARE * middle:
        return None
    seen = ranks[str(rank)]
    return (f"rank {rank} (node {seen.get('node_rank')}, {seen.get('host')}, GPU "
            f"{seen.get('gpu')}) averaged {low:.0f}% GPU utilisation against a median of "
            f"{middle:.0f}%: it waits on something else (data loading, the CPU, its host)")
