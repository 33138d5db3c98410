"""Each rank's GPU while a run goes on (``engine/gpuuse.py``): the samples a
node's heartbeats carry, kept per GPU, put on each rank, and the rank whose
GPU sat far below the others named for the summary."""

from __future__ import annotations

from orchestrator.engine.gpuuse import GpuUse, idle_rank, rank_gpu


def test_samples_keep_the_latest_the_mean_and_the_peak_and_drop_what_is_not_one():
    use = GpuUse()
    use.add({"3": [90, 1000], "5": [10, 50]})
    use.add({"3": [70, 3000], "5": [None, 40], "x": [1, 1], "6": [True, 1], "7": [1],
             "8": [-1, 0], "9": "busy"})
    use.add(["not", "a", "map"])
    assert use.now == {3: (70, 3000), 5: (None, 40)}
    assert use.mean_util(3) == 80.0 and use.mean_util(5) == 10.0 and use.mean_util(6) is None
    assert rank_gpu(use, 3) == {"gpu": 3, "gpu_util": 70, "gpu_mem_mib": 3000,
                                "gpu_util_mean": 80.0, "gpu_mem_peak_mib": 3000}
    assert rank_gpu(use, None) == rank_gpu(use, 4) == {}


def ranks(*means):
    return {str(k): {"node_rank": k // 2, "host": f"h{k // 2}", "gpu": k, "gpu_util_mean": m}
            for k, m in enumerate(means)}


def test_the_rank_far_below_the_median_is_named_with_its_node_and_gpu():
    assert idle_rank(ranks(95, 93, 12, 96)) == (
        "rank 2 (node 1, h1, GPU 2) averaged 12% GPU utilisation against a median of 94%: "
        "it waits on something else (data loading, the CPU, its host)")


def test_nobody_is_named_when_no_rank_stands_out_or_the_gang_is_idle_or_alone():
    assert idle_rank(ranks(95, 60, 90)) is None  # 60 is above half the median (90)
    assert idle_rank(ranks(10, 2, 12)) is None  # the whole gang is idle: nothing to single out
    assert idle_rank(ranks(3)) is None
    assert idle_rank({"0": {"step": 3}, "1": {"step": 4}}) is None  # no GPU sampled


def test_the_memory_peak_is_the_highest_sample_not_the_latest():
    """3000 MiB, then 1000, then 2000: the peak stays 3000 while the rank's
    memory now is the latest, 2000; a sample without memory keeps both."""
    use = GpuUse()
    for used in (3000, 1000, 2000):
        use.add({"1": [50, used]})
    use.add({"1": [50, None]})
    assert use.mem_peak == {1: 3000}
    assert rank_gpu(use, 1)["gpu_mem_peak_mib"] == 3000
    assert rank_gpu(use, 1)["gpu_mem_mib"] is None
