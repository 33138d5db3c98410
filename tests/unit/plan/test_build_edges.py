"""``plan/build.py`` value by value: what ``scripts/mutation`` found no test
pinned. Expected values are written out by hand."""

from __future__ import annotations

import dataclasses
import textwrap

from orchestrator.config.loader import load_cluster_text
from orchestrator.config.catalog import builtin
from orchestrator.plan.build import (build_plan, entrypoint_of, node_run_dir, resolve_plan,
                                     setup_argv, setup_path_first)
from orchestrator.plan.model import GpuChoice

RUN = "r1"
TWO = "nodes:\n  - {host: a, gpus: 0}\n  - {host: b, gpus: 1}\nworkload: {name: linear}\n"


def spec_of(text: str):
    return load_cluster_text(textwrap.dedent(text), source="c.yaml")


def plan_of(text: str, **kw):
    return build_plan(spec_of(text), run_id=RUN, local_run_dir="/tmp/runs/r1", **kw)


def test_the_backend_s_master_address_is_used_when_the_file_names_none():
    assert plan_of(TWO, master_addr="10.0.0.9").master_addr == "10.0.0.9"
    assert plan_of(TWO).master_addr == "a"


def test_a_shared_run_dir_puts_remote_nodes_under_the_local_run_dir():
    shared = plan_of(TWO, shared_run_dir=True)
    assert [n.run_dir for n in shared.nodes] == ["/tmp/runs/r1/node-0", "/tmp/runs/r1/node-1"]
    apart = plan_of(TWO)
    assert [n.run_dir for n in apart.nodes] == ["~/.ddp-orch/runs/r1/node-0",
                                                "~/.ddp-orch/runs/r1/node-1"]


def test_node_run_dir_is_not_shared_unless_asked():
    spec = spec_of(TWO)
    assert node_run_dir(spec, 1, RUN, "/l") == "~/.ddp-orch/runs/r1/node-1"
    assert node_run_dir(spec, 1, RUN, "/l", True) == "/l/node-1"


def test_every_node_starts_at_restart_zero_and_unbuffered():
    for node in plan_of(TWO).nodes:
        assert node.env["DDP_ORCH_RESTART_COUNT"] == "0"
        assert node.env["PYTHONUNBUFFERED"] == "1"


def test_setup_commands_and_their_timeout_and_outputs_reach_the_plan():
    plan = plan_of(TWO + "setup: [pip install x, [make, all]]\nsetup_timeout: 90\n"
                   "outputs: [out/*.txt]\n")
    assert plan.setup == (("sh", "-c", "pip install x"), ("make", "all"))
    assert plan.setup_timeout_s == 90.0
    assert plan.outputs == ("out/*.txt",)
    assert plan_of(TWO + "setup_timeout: 90\n").setup_timeout_s == 0.0  # no setup, no timeout


def test_setup_argv_wraps_only_shell_text():
    assert setup_argv("echo hi") == ("sh", "-c", "echo hi")
    assert setup_argv(("echo", "hi")) == ("echo", "hi")


def test_setup_path_first_is_the_directory_of_an_absolute_python():
    assert setup_path_first("/opt/venv/bin/python") == "/opt/venv/bin"
    assert setup_path_first("/python3") == "/"
    assert setup_path_first("python3") is None


def test_a_script_without_a_code_directory_is_relative_to_its_own_directory():
    workload = spec_of("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear}\n").workload
    bare = dataclasses.replace(workload, name=None, script="/p/scripts/train.py", code=None)
    entry = entrypoint_of(bare, builtin())
    assert (entry.module, entry.script) == (None, "train.py")
    module = dataclasses.replace(workload, name=None, module="pkg.train", script=None, code=None)
    assert entrypoint_of(module, builtin()).script is None


def test_resolve_rewrites_only_a_leading_tilde_and_keeps_an_unknown_home():
    plan = plan_of(TWO)
    node = dataclasses.replace(plan.nodes[0], env={**plan.nodes[0].env, "A": "~", "B": "x~/y",
                                                   "C": "~user/z"})
    plan = dataclasses.replace(plan, nodes=(node, plan.nodes[1]))
    resolved = resolve_plan(plan, master_port=29500, homes={0: "/home/u"})
    env = resolved.nodes[0].env
    assert (env["A"], env["B"], env["C"]) == ("/home/u", "x~/y", "~user/z")
    assert resolved.nodes[1].run_dir == "~/.ddp-orch/runs/r1/node-1"  # no home known for node 1


def test_resolve_places_hosts_master_and_a_one_process_node_s_gpus():
    plan = plan_of(TWO)
    one = dataclasses.replace(plan.nodes[1], one_process=True)
    plan = dataclasses.replace(plan, nodes=(plan.nodes[0], one))
    resolved = resolve_plan(plan, master_port=1, homes={}, hosts={1: "c7"}, master_addr="c1",
                            gpus={0: GpuChoice((2, 3)), 1: GpuChoice((0, 1, 2))})
    assert [n.host for n in resolved.nodes] == ["a", "c7"]
    assert resolved.master_addr == "c1"
    assert [n.nproc for n in resolved.nodes] == [2, 1]
    assert [n.first_rank for n in resolved.nodes] == [0, 2]
    assert resolved.world_size == 3
    assert resolved.nodes[1].env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert resolved_keeps_master(plan) == "a"


def resolved_keeps_master(plan):
    return resolve_plan(plan, master_port=1, homes={}).master_addr


def test_a_one_process_node_is_planned_as_one_process():
    spec = spec_of("nodes:\n  - {host: a, gpus: [0, 1]}\nworkload: {name: linear}\n")
    spec = dataclasses.replace(spec, nodes=(dataclasses.replace(spec.nodes[0], one_process=True),))
    node = build_plan(spec, run_id=RUN, local_run_dir="/l").nodes[0]
    assert (node.one_process, node.nproc, node.gpus) == (True, 1, (0, 1))


def test_a_workload_with_no_name_module_or_script_is_shown_as_a_question_mark():
    spec = spec_of(TWO)
    bare = dataclasses.replace(spec.workload, name=None, module=None, script=None)
    assert build_plan(dataclasses.replace(spec, workload=bare), run_id=RUN,
                      local_run_dir="/l").workload == "?"
