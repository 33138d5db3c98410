"""The edges of a run's GPUs in reports (``report/gpus.py``) that
``test_gpu_report.py`` and ``test_pace.py`` leave open: a plan whose nodes
are not all records, and a full 80 GiB card in ``status``'s words."""

from __future__ import annotations

from orchestrator.report.gpus import gpu_lines, gpu_words


def test_a_plan_node_that_is_no_record_is_passed_over():
    plan = {"nodes": ["node0", 3, {"node_rank": 1, "host": "b", "gpus": [0]}]}
    assert gpu_lines(plan) == ["  node 1 (b): GPUs 0"]


def test_a_ranks_memory_is_its_mib_over_1024():
    """81920 MiB is 80.0 GiB (over 1025 it would be 79.9)."""
    assert gpu_words({"gpu": 0, "gpu_util": 100, "gpu_mem_mib": 81920}) == \
        ", GPU 0 100% busy, 80.0 GiB"
