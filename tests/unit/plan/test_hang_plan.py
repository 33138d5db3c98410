"""Unit tests of the hang watchdog's settings in the plan: `hang_timeout` and
its floor, and the NCCL flight recorder a GPU run gets."""

from __future__ import annotations

import pytest

from orchestrator.engine.results import WantedFile, flight_recorder_files
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan


def plan_of(text: str):
    return build_plan(load_cluster_text(text, source="c.yaml"), run_id="r", local_run_dir="/l")


def test_every_run_gets_the_flight_recorder_gpu_runs_nccls_too_unless_the_file_sets_it():
    plan = plan_of("nodes: [{host: a, gpus: '0,1'}, {host: b, gpus: 2}]\n"
                   "env: {TORCH_NCCL_TRACE_BUFFER_SIZE: '100'}\nworkload: {name: noop}\n")
    node = plan.nodes[1]
    assert node.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # the user's value, under torch 2.8's name too (it reads that one first)
    assert node.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == node.env["TORCH_FR_BUFFER_SIZE"] == "100"
    prefix = f"{node.run_dir}/nccl_trace_rank_"
    assert node.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    assert node.env["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert flight_recorder_files(node) == [
        WantedFile(f"{prefix}2", "nccl_trace/node-1/rank-2", 64 << 20)]
    assert node.env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == prefix  # NCCL's own trigger
    cpu = plan_of("nodes: [{host: a, procs: 2}]\nworkload: {name: noop}\n")
    # gloo's recorder (torch >= 2.8) under the new names only: nothing of NCCL
    assert not any(k.startswith("TORCH_NCCL") for k in cpu.nodes[0].env)
    cpu_prefix = f"{cpu.nodes[0].run_dir}/nccl_trace_rank_"
    assert flight_recorder_files(cpu.nodes[0]) == [
        WantedFile(f"{cpu_prefix}{rank}", f"nccl_trace/node-0/rank-{rank}", 64 << 20)
        for rank in (0, 1)]


def test_a_flight_recorder_prefix_under_either_name_is_the_one_fetched():
    plan = plan_of("nodes: [{host: a, gpus: 0}]\nenv: {TORCH_FR_DUMP_TEMP_FILE: /tmp/fr_}\n"
                   "workload: {name: noop}\n")
    node = plan.nodes[0]
    assert node.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/tmp/fr_"
    assert flight_recorder_files(node)[0].remote == "/tmp/fr_0"
    only_new = {k: v for k, v in node.env.items() if k != "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    import dataclasses
    assert flight_recorder_files(dataclasses.replace(node, env=only_new))[0].remote == "/tmp/fr_0"


def test_hang_timeout_in_the_file_and_its_floor():
    spec = load_cluster_text("hang_timeout: 30\nnodes: [{host: a, procs: 1}]\n"
                             "workload: {name: noop}\n")
    assert spec.hang_timeout == 30.0
    with pytest.raises(ConfigError, match="hang_timeout: 5 is out of range 10-"):
        load_cluster_text("hang_timeout: 5\nnodes: [{host: a, procs: 1}]\nworkload: {name: noop}\n")
