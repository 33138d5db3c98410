"""Unit tests of issue 29's plan side: GPUs asked for by what they are
(``free:N``, ``all``) planned as placeholders, resolved at launch into
indices, ranks and world size; the rank table, the dry-run header and
``plan.json`` (to and from) for both."""

from __future__ import annotations

import json
import textwrap

import pytest

from orchestrator.backends import choose
from orchestrator.engine.options import LaunchOptions
from orchestrator.config.loader import load_cluster_text
from orchestrator.plan.build import build_plan, resolve_plan
from orchestrator.plan.model import GpuChoice
from orchestrator.plan.render import dryrun_from_dict, dryrun_to_dict, render_text
from workloads import contract

RUN = "r1"
MIXED = """\
    nodes:
      - {host: a, gpus: '5,3'}
      - {host: b, gpus: free:3}
      - {host: c, gpus: all}
    workload: {name: linear}
    """
H100 = "NVIDIA H100 80GB HBM3"
CHOSEN = {1: GpuChoice((7, 2, 4), ("GPU-7", "GPU-2", "GPU-4"), (H100, H100, H100)),
          2: GpuChoice((1, 0), ("GPU-c1", "GPU-c0"), ("NVIDIA A100", "NVIDIA A100"))}


def spec_of(text: str):
    return load_cluster_text(textwrap.dedent(text), source="c.yaml")


def plan_of(text: str):
    return build_plan(spec_of(text), run_id=RUN, local_run_dir=f"/tmp/runs/{RUN}")


def resolved(plan, gpus=CHOSEN, device=None):
    return resolve_plan(plan, master_port=29500, homes={k: "/home/u" for k in range(3)},
                        gpus=gpus, device=device)


def dryrun(text: str, gpus=None, device=None):
    spec = spec_of(text)
    backend = choose(spec, LaunchOptions())
    plan = backend.plan(RUN, f"/tmp/runs/{RUN}")
    if gpus is not None:
        plan = resolved(plan, gpus, device)
    return backend.dryrun(plan)


# planned ------------------------------------------------------------------------------


def test_a_request_is_a_placeholder_until_the_launch():
    plan = plan_of(MIXED)
    a, b, c = plan.nodes
    assert a.env["CUDA_VISIBLE_DEVICES"] == "5,3"  # the user's order
    assert b.env["CUDA_VISIBLE_DEVICES"] == "<free:3: chosen at launch>"
    assert c.env["CUDA_VISIBLE_DEVICES"] == "<all: chosen at launch>"
    assert [n.gpus_pending for n in plan.nodes] == [False, True, True]
    assert [n.gpu_request for n in plan.nodes] == [None, "free:3", "all"]
    assert [(n.first_rank, n.nproc) for n in plan.nodes] == [(0, 2), (2, 3), (5, 0)]
    assert not plan.resolved and not plan.world_size_known
    assert [r.gpu for r in plan.ranks] == [5, 3, None, None, None]


def test_free_n_alone_keeps_the_world_size_known():
    plan = plan_of("nodes: [{host: a, gpus: free:3}, {host: b, gpus: '0'}]\n"
                   "workload: {name: linear}\n")
    assert plan.world_size_known and plan.world_size == 4
    assert [n.first_rank for n in plan.nodes] == [0, 3]
    assert not plan.resolved  # still pending: the indices are the node's to choose


def test_cuda_device_order_is_set_on_every_node_gpu_or_cpu():
    plan = plan_of("nodes: [{host: a, gpus: free}, {host: b, procs: 2}]\n"
                   "workload: {name: linear}\n")
    for node in plan.nodes:
        assert node.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert plan.nodes[1].env["CUDA_VISIBLE_DEVICES"] == ""


def test_the_flight_recorder_is_set_under_both_names_and_a_users_value_under_both():
    plan = plan_of("""\
        nodes:
          - {host: a, gpus: free:1}
          - {host: b, gpus: '0', env: {TORCH_NCCL_TRACE_BUFFER_SIZE: '50'}}
          - {host: c, gpus: '0', env: {TORCH_FR_DUMP_TEMP_FILE: /scratch/fr_}}
        workload: {name: linear}
        """)
    a, b, c = (node.env for node in plan.nodes)
    assert a["TORCH_NCCL_TRACE_BUFFER_SIZE"] == a["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert a["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == a["TORCH_FR_DUMP_TEMP_FILE"] == \
        f"~/.ddp-orch/runs/{RUN}/node-0/nccl_trace_rank_"
    assert b["TORCH_NCCL_TRACE_BUFFER_SIZE"] == b["TORCH_FR_BUFFER_SIZE"] == "50"
    assert c["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == c["TORCH_FR_DUMP_TEMP_FILE"] == "/scratch/fr_"
    cpu = plan_of("device: cpu\nnodes: [{host: a, gpus: free:2}]\nworkload: {name: linear}\n")
    assert not any(k.startswith("TORCH_NCCL_") for k in cpu.nodes[0].env)  # gloo's: the new
    assert {k: v for k, v in cpu.nodes[0].env.items() if k.startswith("TORCH_FR_")} == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": f"~/.ddp-orch/runs/{RUN}/node-0/nccl_trace_rank_"}


# resolved ------------------------------------------------------------------------------


def test_resolve_sets_counts_prefix_sums_and_the_world_size():
    plan = resolved(plan_of(MIXED), device="cuda")
    assert [(n.first_rank, n.nproc, n.gpus) for n in plan.nodes] == [
        (0, 2, (5, 3)), (2, 3, (7, 2, 4)), (5, 2, (1, 0))]
    assert plan.world_size == 7 and plan.resolved and plan.world_size_known
    assert [list(n.ranks) for n in plan.nodes] == [[0, 1], [2, 3, 4], [5, 6]]
    assert [(r.rank, r.node_rank, r.local_rank, r.gpu, r.gpu_uuid, r.gpu_model)
            for r in plan.ranks] == [
        (0, 0, 0, 5, None, None), (1, 0, 1, 3, None, None),
        (2, 1, 0, 7, "GPU-7", H100), (3, 1, 1, 2, "GPU-2", H100), (4, 1, 2, 4, "GPU-4", H100),
        (5, 2, 0, 1, "GPU-c1", "NVIDIA A100"), (6, 2, 1, 0, "GPU-c0", "NVIDIA A100")]
    a, b, c = (node.env for node in plan.nodes)
    assert (a["CUDA_VISIBLE_DEVICES"], b["CUDA_VISIBLE_DEVICES"], c["CUDA_VISIBLE_DEVICES"]) == \
        ("5,3", "7,2,4", "1,0")
    assert contract.GPU_UUIDS_ENV == "DDP_ORCH_GPU_UUIDS"
    assert b[contract.GPU_UUIDS_ENV] == "GPU-7,GPU-2,GPU-4" and contract.GPU_UUIDS_ENV not in a
    assert plan.device == "cuda" and all(n.env[contract.DEVICE_ENV] == "cuda" for n in plan.nodes)
    assert all(n.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for n in plan.nodes)
    assert [n.gpu_request for n in plan.nodes] == [None, "free:3", "all"]  # kept, to say how


def test_a_choice_smaller_than_planned_moves_every_later_rank():
    # the first node asked for all and got one GPU: the next node's ranks start at 1
    plan = plan_of("nodes: [{host: a, gpus: all}, {host: b, gpus: '2,6'}]\n"
                   "workload: {name: linear}\n")
    assert [n.first_rank for n in plan.nodes] == [0, 0]
    done = resolved(plan, {0: GpuChoice((3,))})
    assert [(n.first_rank, n.nproc) for n in done.nodes] == [(0, 1), (1, 2)]
    assert done.world_size == 3 and [r.gpu for r in done.ranks] == [3, 2, 6]
    assert done.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "3"
    assert contract.GPU_UUIDS_ENV not in done.nodes[0].env  # no nvidia-smi UUIDs: none set
    assert done.device == "auto" and done.nodes[0].env[contract.DEVICE_ENV] == "auto"


def test_each_ranks_threads_are_its_share_of_its_nodes_cores_once_launched():
    """``OMP_NUM_THREADS``: said in words until the launch knows each node's
    cores (torchrun would give every rank 1 and print its banner), then
    the cores over the node's ranks as chosen, at least 1; a user's wins."""
    plan = plan_of(MIXED.replace("{host: c, gpus: all}",
                                 "{host: c, gpus: all, env: {OMP_NUM_THREADS: '6'}}"))
    assert [n.env["OMP_NUM_THREADS"] for n in plan.nodes] == \
        ["<cores / ranks, at launch>"] * 2 + ["6"]
    done = resolve_plan(plan, master_port=29500, homes={}, gpus=CHOSEN,
                        cores={0: 16, 1: 2, 2: 64})
    # a: 16 cores, 2 ranks; b: 2 cores, 3 ranks (chosen); c: the user's
    assert [n.env["OMP_NUM_THREADS"] for n in done.nodes] == ["8", "1", "6"]
    # all's count is the chosen one: 7 cores over its 2 GPUs' ranks
    two = plan_of("nodes: [{host: a, gpus: all}]\nworkload: {name: linear}\n")
    chosen = resolve_plan(two, master_port=1, homes={}, gpus={0: GpuChoice((0, 1))}, cores={0: 7})
    assert chosen.nodes[0].env["OMP_NUM_THREADS"] == "3"
    # what a node says is not taken on trust: at least 1, at most MAX_CORES over the ranks
    odd = resolve_plan(plan, master_port=1, homes={}, gpus=CHOSEN, cores={0: -4, 1: 10 ** 12})
    assert [n.env["OMP_NUM_THREADS"] for n in odd.nodes][:2] == ["1", str((1 << 16) // 3)]
    # a node whose cores are not known yet (a scheduler's, until its job runs) keeps the words
    assert resolve_plan(plan, master_port=1, homes={}, gpus=CHOSEN).nodes[0].env[
        "OMP_NUM_THREADS"] == "<cores / ranks, at launch>"


def test_a_listed_node_found_on_the_node_keeps_its_count():
    plan = resolved(plan_of(MIXED), {**CHOSEN, 0: GpuChoice((5, 3), ("U5", "U3"), ("X", "X"))})
    assert plan.nodes[0].env[contract.GPU_UUIDS_ENV] == "U5,U3" and plan.world_size == 7


# rendered --------------------------------------------------------------------------------


def test_the_dry_run_shows_pending_nodes_as_one_row_and_the_world_size_as_decided_later():
    text = render_text(dryrun(MIXED))
    assert "world size decided at launch (node 1 gpus: free:3, node 2 gpus: all; the nodes' " \
           "agents choose), device auto" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["RANK", "NODE", "HOST", "LOCAL_RANK", "GPU"] in rows
    assert ["0", "0", "a", "0", "5"] in rows and ["1", "0", "a", "1", "3"] in rows
    assert ["?", "1", "b", "?", "rank(s)", "free:3:", "chosen", "at", "launch"] in rows
    assert ["?", "2", "c", "?", "rank(s)", "all:", "chosen", "at", "launch"] in rows
    assert "MODEL" not in text
    assert "node 1  b  ranks chosen at launch (gpus: free:3, " in text
    assert "    CUDA_VISIBLE_DEVICES=<free:3: chosen at launch>\n" in text
    assert "    CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in text


def test_the_dry_run_never_shows_a_process_count_of_0():
    """Issue #45: ``gpus: all`` showed ``--nproc-per-node 0``; ``free:3``
    knows its 3 already."""
    info = dryrun(MIXED)
    text = render_text(info)
    commands = [line for line in text.splitlines() if "torch.distributed.run" in line]
    assert [c.split("--nproc-per-node ")[1].split(" --master-addr")[0] for c in commands] == \
        ["2", "3", "<chosen at launch>"]
    assert "--nproc-per-node 0" not in text
    assert [n.argv[n.argv.index("--nproc-per-node") + 1] for n in info.nodes] == \
        ["2", "3", "<chosen at launch>"]  # the json's argv, word for word
    done = dryrun(MIXED, CHOSEN, "cuda")
    assert [n.argv[n.argv.index("--nproc-per-node") + 1] for n in done.nodes] == ["2", "3", "2"]


def test_free_n_alone_shows_its_count_and_the_world_size():
    text = render_text(dryrun("nodes: [{host: a, gpus: free:3}, {host: b, gpus: '0'}]\n"
                              "workload: {name: linear}\n"))
    assert "2 node(s), world size 4, device auto" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["?", "0", "a", "3", "rank(s)", "free:3:", "chosen", "at", "launch"] in rows
    assert ["3", "1", "b", "0", "0"] in rows  # node 1's rank comes after node 0's three


def test_the_resolved_table_has_model_and_uuid_columns():
    text = render_text(dryrun(MIXED, CHOSEN, "cuda"))
    rows = [line.split() for line in text.splitlines()]
    assert ["RANK", "NODE", "HOST", "LOCAL_RANK", "GPU", "MODEL", "UUID"] in rows
    assert ["0", "0", "a", "0", "5", "-", "-"] in rows
    assert ["4", "1", "b", "2", "4", "NVIDIA", "H100", "80GB", "HBM3", "GPU-4"] in rows
    assert ["6", "2", "c", "1", "0", "NVIDIA", "A100", "GPU-c0"] in rows
    assert "world size 7, device cuda" in text and "chosen at launch" not in text
    assert "node 1  b  ranks 2-4 (3 processes, " in text


# plan.json ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [None, CHOSEN], ids=["pending", "resolved"])
def test_plan_json_round_trips_requests_uuids_and_models(gpus):
    info = dryrun(MIXED, gpus)
    data = json.loads(json.dumps(dryrun_to_dict(info)))
    nodes = data["nodes"]
    assert [n.get("gpu_request") for n in nodes] == [None, "free:3", "all"]
    assert "gpu_request" not in nodes[0]
    back = dryrun_from_dict(data)
    assert [n.gpu_request for n in back.plan.nodes] == [None, "free:3", "all"]
    assert [n.gpus_pending for n in back.plan.nodes] == [n.gpus_pending for n in info.plan.nodes]
    assert back.plan.world_size_known == info.plan.world_size_known
    assert [(n.gpus, n.first_rank, n.nproc, n.gpu_uuids, n.gpu_models)
            for n in back.plan.nodes] == [(n.gpus, n.first_rank, n.nproc, n.gpu_uuids,
                                          n.gpu_models) for n in info.plan.nodes]
    assert back.plan.ranks == info.plan.ranks
    assert json.loads(json.dumps(dryrun_to_dict(back))) == data
    if gpus is not None:
        assert nodes[1]["gpus"] == [7, 2, 4] and nodes[1]["gpu_uuids"] == ["GPU-7", "GPU-2",
                                                                           "GPU-4"]
        assert nodes[2]["gpu_models"] == ["NVIDIA A100", "NVIDIA A100"]
        assert data["ranks"][2] == {"rank": 2, "node_rank": 1, "host": "b", "local_rank": 0,
                                    "gpu": 7, "gpu_uuid": "GPU-7", "gpu_model": H100}
        assert "gpu_uuid" not in data["ranks"][0]  # a listed GPU nvidia-smi did not name
        assert render_text(back).count("chosen at launch") == 0
    else:
        assert nodes[1]["gpus"] is None and "gpu_uuids" not in nodes[1]
        assert "node 1  b  ranks chosen at launch (gpus: free:3, " in render_text(back)
