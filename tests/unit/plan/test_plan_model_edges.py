"""The plan's types and a node's dry-run header, value by value (expected
values written out by hand; ``scripts/mutation`` found them untested)."""

from __future__ import annotations

from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.model import Entrypoint, NodePlan, RunPlan


def node(**kw) -> NodePlan:
    fields = dict(node_rank=1, host="gpu2", python="python3", gpus=(0, 1, 2, 3), first_rank=3,
                  nproc=4, run_dir="/w/runs/r1/node-1", env={"DDP_ORCH_RESULT_FILE": "/w/r.json"},
                  unset_env=())
    fields.update(kw)
    return NodePlan(**fields)


def plan(*nodes: NodePlan, port="auto") -> RunPlan:
    return RunPlan(run_id="r1", name="r", backend="ssh", world_size=4, master_addr="gpu1",
                   master_port=port, device="cuda", workload="linear", code=None,
                   entrypoint=Entrypoint("m", None, ()), nodes=nodes, ranks=())


def test_the_header_names_the_node_its_ranks_and_how_it_is_reached():
    launch = NodeLaunch(node=node(), where="ssh u@gpu2:22", env={}, unset_env=(), argv=())
    assert launch.header() == "node 1  gpu2  ranks 3-6 (4 processes, ssh u@gpu2:22)"
    assert (launch.node_rank, launch.host, launch.run_dir) == (1, "gpu2", "/w/runs/r1/node-1")


def test_the_header_of_one_process_says_process():
    launch = NodeLaunch(node=node(nproc=1, first_rank=0, node_rank=0), where="local subprocess",
                        env={}, unset_env=(), argv=())
    assert launch.header() == "node 0  gpu2  rank 0 (1 process, local subprocess)"
    later = NodeLaunch(node=node(nproc=1, first_rank=2), where="local subprocess",
                       env={}, unset_env=(), argv=())
    assert later.header() == "node 1  gpu2  rank 2 (1 process, local subprocess)"  # not 2-2


def test_the_header_of_gpus_chosen_at_launch():
    launch = NodeLaunch(node=node(gpus=None, gpu_request="free:2"), where="ssh gpu2", env={},
                        unset_env=(), argv=())
    assert launch.header() == "node 1  gpu2  ranks chosen at launch (gpus: free:2, ssh gpu2)"


def test_a_node_plan_s_derived_paths_and_ranks():
    n = node(code_rel="project")
    assert n.ranks == range(3, 7)
    assert n.code_dir == "/w/runs/r1/node-1/code"
    assert n.code_root == "/w/runs/r1/node-1/project"
    assert n.result_file == "/w/r.json"
    assert node(code_rel="code").code_root == "/w/runs/r1/node-1/code"
    assert node().is_local is False and node(host="localhost").is_local is True


def test_gpus_are_pending_only_when_requested_and_not_chosen():
    assert node(gpus=None, gpu_request="free:1").gpus_pending is True
    assert node(gpus=(0,), gpu_request="free:1").gpus_pending is False
    assert node(gpus=None, gpu_request=None).gpus_pending is False


def test_a_plan_is_resolved_once_port_home_and_gpus_are_known():
    assert plan(node(), port=29500).resolved is True
    assert plan(node(), port="auto").resolved is False
    assert plan(node(run_dir="~/runs/x"), port=29500).resolved is False
    assert plan(node(gpus=None, gpu_request="free:1"), port=29500).resolved is False


def test_the_world_size_waits_only_for_all_and_free():
    assert plan(node(gpus=None, gpu_request="all")).world_size_known is False
    assert plan(node(gpus=None, gpu_request="free")).world_size_known is False
    assert plan(node(gpus=None, gpu_request="free:2")).world_size_known is True
    assert plan(node(gpus=(0,), gpu_request="all")).world_size_known is True


def test_an_entrypoint_s_argv():
    assert Entrypoint("pkg.train", None, ("--lr", "0.1")).argv() == ("-m", "pkg.train", "--lr", "0.1")
    assert Entrypoint(None, "scripts/t.py", ("a",)).argv() == ("scripts/t.py", "a")
    assert Entrypoint(None, None, ()).argv() == ("",)
