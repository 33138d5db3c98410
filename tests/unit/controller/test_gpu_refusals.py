"""Unit tests of controller/refusals.py with GPUs chosen at launch: a
built-in's rules on the world size wait for the nodes' choice
(``refuse_resolved``), and apply at once where the count is known."""

from __future__ import annotations

import pytest

from orchestrator.backends import choose
from orchestrator.engine.options import LaunchOptions
from orchestrator.config.loader import load_cluster_text
from orchestrator.controller.refusals import refuse, refuse_resolved
from orchestrator.errors import ConfigError
from orchestrator.plan.build import resolve_plan
from orchestrator.plan.model import GpuChoice

DP = "workload: {name: mlp, args: {mode: dp}}\n"


def planned(nodes: str):
    spec = load_cluster_text(f"nodes: {nodes}\n" + DP, source="c.yaml")
    return spec, choose(spec, LaunchOptions()).plan("r", "/tmp/r")


def never(*args):
    raise AssertionError("this machine's GPUs are not asked about a remote node")


def test_a_world_size_rule_waits_while_the_nodes_choose_then_refuses_the_resolved_plan():
    spec, plan = planned("[{host: a, gpus: free}]")
    refuse(spec, plan, LaunchOptions(), never, never)  # world size unknown: nothing to say
    done = resolve_plan(plan, master_port=1, homes={0: "/h"}, gpus={0: GpuChoice((2, 5))})
    with pytest.raises(ConfigError) as caught:
        refuse_resolved(spec, done, LaunchOptions())
    error = caught.value
    assert (error.path, error.source) == ("workload.args.mode", "c.yaml")
    assert "--mode dp is single-process nn.DataParallel but this job has world size 2" \
        in str(error)
    assert error.hint.endswith("(every rank would refuse it after the start)")


def test_one_chosen_gpu_is_a_world_size_the_rule_accepts():
    spec, plan = planned("[{host: a, gpus: all}]")
    done = resolve_plan(plan, master_port=1, homes={0: "/h"}, gpus={0: GpuChoice((4,))})
    assert refuse_resolved(spec, done, LaunchOptions()) is None


def test_free_n_is_a_known_world_size_refused_before_anything_starts():
    spec, plan = planned("[{host: a, gpus: free:2}]")
    with pytest.raises(ConfigError) as caught:
        refuse(spec, plan, LaunchOptions(), never, never)
    assert "world size 2" in str(caught.value) and caught.value.path == "workload.args.mode"
