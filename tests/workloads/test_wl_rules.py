"""The catalog's rules: the controller refuses before launch in the very
words a rank uses after it (``workloads/catalog.py``'s ``Rule``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from orchestrator.engine.options import LaunchOptions
from orchestrator.config.loader import load_cluster_text
from orchestrator.controller.session import prepare
from orchestrator.errors import ConfigError
from orchestrator.plan.build import args_to_argv
from workloads.catalog import CATALOG
from workloads.harness.context import WorkloadError
from workloads.harness.job import start

CASES = [  # (workload, args, world size)
    ("resnet", {"image_size": 4}, 2),
    ("resnet", {"resume": True}, 1),
    ("mnist", {"resume": True}, 2),
    ("mnist", {"amp": "fp16"}, 1),
    ("resnet", {"amp": "fp16"}, 2),
    ("mlp", {"amp": "fp16"}, 1),
    ("mlp", {"mode": "dp"}, 3),
    ("mlp", {"mode": "dp"}, 1),
    ("linear", {"device": "cuda"}, 2),
    ("noop", {"device": "cuda"}, 1),
]


@pytest.mark.parametrize("name, args, world", CASES,
                         ids=[f"{n}-{'-'.join(map(str, a.values()))}-{w}" for n, a, w in CASES])
def test_the_controller_refuses_in_the_words_every_rank_would_use(name, args, world,
                                                                  monkeypatch):
    if args.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("a rank here would see a GPU: this case needs a machine without one")
    spec = load_cluster_text(f"nodes: [{{host: localhost, procs: {world}}}]\n"
                             f"workload: {{name: {name}}}\n")
    spec = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, args=args))
    with pytest.raises(ConfigError) as controller:
        prepare(spec, LaunchOptions(), run_id="r", local_run_dir="/tmp/r")
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "DDP_ORCH_DEVICE": "cpu",
                       "CUDA_VISIBLE_DEVICES": ""}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DDP_ORCH_MAX_RESTARTS", raising=False)
    with pytest.raises(WorkloadError) as rank:
        start(name, list(args_to_argv(args)))
    said = str(rank.value)
    if args.get("device") == "cuda":  # a rank adds what its torch sees, which no controller can
        said = said.split(": torch ", 1)[0]
    assert said == controller.value.message


def test_every_rule_names_an_argument_of_its_workload():
    for info in CATALOG.values():
        for rule in info.rules:
            assert info.arg(rule.arg) is not None, (info.name, rule.arg)
            assert rule.hint
