"""The edges of a rank's GPU use (``engine/gpuuse.py``) that
``test_gpuuse.py`` leaves open: the bounds of a believable sample, the
first sample, the rounding of the mean, and where ``idle_rank`` draws its
lines. Every value is worked out by hand."""

from __future__ import annotations

from orchestrator.engine.gpuuse import GpuUse, idle_rank, rank_gpu


def test_zero_is_a_sample_and_2_to_the_40_is_not():
    """0% and 0 MiB are real readings (an idle GPU); 2**40 MiB is past any
    GPU and the entry is dropped, its last value below it kept."""
    use = GpuUse()
    use.add({"0": [0, 0]})
    assert use.now == {0: (0, 0)} and use.mem_peak == {0: 0} and use.mean_util(0) == 0.0
    use.add({"0": [1, (1 << 40) - 1]})
    use.add({"0": [2, 1 << 40]})
    assert use.now[0] == (1, (1 << 40) - 1) and use.util_count[0] == 2


def test_a_bad_entry_first_does_not_hide_the_good_ones_after_it():
    use = GpuUse()
    use.add({"x": [1, 1], "3": [90, 1000], "4": [True, 5], "5": [10, 50]})
    assert use.now == {3: (90, 1000), 5: (10, 50)}


def test_the_mean_is_rounded_to_a_tenth_and_none_without_a_utilisation_sample():
    use = GpuUse()
    for util in (30, 40, 30):  # 33.33...
        use.add({"2": [util, 100]})
    use.add({"7": [None, 100]})
    assert rank_gpu(use, 2)["gpu_util_mean"] == 33.3
    assert rank_gpu(use, 7) == {"gpu": 7, "gpu_util": None, "gpu_mem_mib": 100,
                                "gpu_util_mean": None, "gpu_mem_peak_mib": 100}


def ranks(means: dict[int, float]) -> dict:
    return {str(k): {"node_rank": 0, "host": "h", "gpu": k, "gpu_util_mean": m}
            for k, m in means.items()}


def test_in_a_gang_of_two_the_idle_rank_is_named():
    """90 and 10: a median of 50, and 10 is under half of it."""
    assert idle_rank(ranks({0: 90, 1: 10})).startswith("rank 1 (node 0, h, GPU 1) averaged 10%")


def test_of_two_equally_idle_ranks_the_lower_is_named_whatever_the_order():
    assert idle_rank(ranks({2: 10, 1: 90, 0: 10, 3: 95})).startswith("rank 0 ")


def test_a_median_of_exactly_20_percent_is_busy_enough_and_half_of_it_is_not_far_below():
    assert idle_rank(ranks({0: 20, 1: 20, 2: 5})).startswith("rank 2 ")  # 5 < 10
    assert idle_rank(ranks({0: 90, 1: 45, 2: 90})) is None  # 45 is half of 90: not under
