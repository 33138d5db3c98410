"""Unit tests of controller/compare.py: the baseline and DDP specs `compare`
runs (one process on node 0, the DataParallel baseline, threads per process)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from conftest import run_cli
from orchestrator.config.localmode import local_spec
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan
from orchestrator.controller.compare import baseline_spec, ddp_spec
from orchestrator.config.loader import load_cluster_file


def test_baseline_is_one_process_on_node0_first_gpu():
    spec = load_cluster_file("cluster.yaml.example")
    base = baseline_spec(spec)
    assert len(base.nodes) == 1 and base.nodes[0].gpus == (3,) and base.world_size == 1
    assert base.workload == spec.workload and base.name == "resnet-demo-baseline"


def test_cpu_processes_of_both_sides_run_one_thread_each_unless_the_file_says():
    """The speed-up compares processes, not threads: torchrun would give the
    1-process baseline every core and each DDP process one thread."""
    spec = local_spec(None, workload="linear", args={}, gpus=None, procs=2, device=None)
    for side in (baseline_spec(spec), ddp_spec(spec)):
        assert [dict(node.env).get("OMP_NUM_THREADS") for node in side.nodes] == ["1"]
    mine = dataclasses.replace(spec, nodes=tuple(
        dataclasses.replace(node, env={**node.env, "OMP_NUM_THREADS": "2"})
        for node in spec.nodes))
    for side in (baseline_spec(mine), ddp_spec(mine)):
        assert [dict(node.env)["OMP_NUM_THREADS"] for node in side.nodes] == ["2"]
    gpu = load_cluster_file("cluster.yaml.example")
    assert all("OMP_NUM_THREADS" not in node.env
               for side in (baseline_spec(gpu), ddp_spec(gpu)) for node in side.nodes)


def mlp_spec(**kw):
    options = {"gpus": None, "procs": None, "device": None, **kw}
    return local_spec(None, workload=options.pop("workload", "mlp"), args={}, **options)


def test_dp_baseline_is_one_process_seeing_all_of_node0s_gpus_in_mode_dp():
    """The commands compare --baseline dp runs (not run on GPUs here): mlp
    --mode dp as one process with every GPU of node 0 visible, against
    mlp --mode ddp, one process per GPU."""
    spec = mlp_spec(gpus="0,1")
    base, ddp = baseline_spec(spec, "dp"), ddp_spec(spec, "dp")
    plan = build_plan(base, run_id="b", local_run_dir="/r/b")
    assert plan.world_size == 1 and plan.nodes[0].nproc == 1
    assert plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.entrypoint.module == "workloads.mlp"
    assert plan.entrypoint.args[-2:] == ("--mode", "dp")
    ddp_plan = build_plan(ddp, run_id="d", local_run_dir="/r/d")
    assert ddp_plan.world_size == 2 and ddp_plan.entrypoint.args[-2:] == ("--mode", "ddp")
    assert ddp_plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"


@pytest.mark.parametrize("kw,message", [
    ({"procs": 2}, "needs at least 2 GPUs on node 0 (localhost), which has procs: 2"),
    ({"gpus": "1"}, "needs at least 2 GPUs on node 0 (localhost), which has 1 GPU"),
    ({"gpus": "0,1", "device": "cpu"}, "which has device: cpu"),
    ({"gpus": "0,1", "workload": "resnet"}, "mlp workload's --mode dp, but the workload here "
                                            "is resnet"),
])
def test_dp_baseline_is_refused_without_two_gpus_or_on_another_workload(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        baseline_spec(mlp_spec(**kw), "dp")
    assert str(caught.value).startswith("command line: --baseline dp: ")
    assert "ddp-orch compare --local --workload mlp --gpus 0,1 --baseline dp" in \
        str(caught.value).split("hint: ")[1]


def test_the_baseline_of_gpus_chosen_at_launch_is_one_gpu_chosen_the_same_way():
    from orchestrator.config.loader import load_cluster_text

    spec = load_cluster_text("nodes: [{host: a, gpus: 'free:3'}, {host: b, gpus: free}]\n"
                             "workload: {name: mlp}\n")
    base = baseline_spec(spec)
    assert [(n.host, n.gpu_request, n.gpus, n.nproc) for n in base.nodes] == \
        [("a", "free:1", None, 1)]
    listed = load_cluster_text("nodes: [{host: a, gpus: '5,2'}]\nworkload: {name: mlp}\n")
    assert [(n.gpu_request, n.gpus) for n in baseline_spec(listed).nodes] == [(None, (5,))]
    dp = baseline_spec(spec, "dp").nodes[0]  # one process over the three it is given
    assert (dp.gpu_request, dp.nproc, dp.one_process) == ("free:3", 1, True)


class _Run:
    """A launched run's directory, as far as compare reads it."""

    def __init__(self, plan):
        self._plan = plan

    def plan(self):
        return self._plan


def test_a_side_that_succeeds_without_a_result_names_the_file_and_how_to_write_it():
    """(issue 32) A user's script that writes no result: the real reason,
    not "the baseline run ... succeeded"; raised at once, so the other side
    never runs."""
    from orchestrator.controller.compare import launch_run
    from orchestrator.errors import LaunchError
    from orchestrator.records.outcome import RunOutcome, RunState

    plan = {"workload": "train.py", "nodes": [
        {"host": "gpu-a", "env": {"DDP_ORCH_RESULT_FILE": "/home/u/.ddp-orch/runs/b/node-0/"
                                                          "result.json"}}]}
    launched = []

    def launch(spec):
        launched.append(spec)
        return RunOutcome("b", RunState.SUCCEEDED, 1.0, (), None, None), _Run(plan)

    with pytest.raises(LaunchError) as caught:
        launch_run("baseline", "the spec", launch)
    message = str(caught.value)
    assert launched == ["the spec"]
    assert message.startswith("the baseline run b succeeded, but `train.py` wrote no result: "
                              "compare reads the JSON object that rank 0 writes to the path "
                              "in $DDP_ORCH_RESULT_FILE (for this run /home/u/.ddp-orch/runs/"
                              "b/node-0/result.json on node 0, gpu-a)")
    assert "write_json_atomic(os.environ[RESULT_FILE_ENV]" in message
    assert '"samples_per_s"' in message and '"avg_batch_s"' in message
    assert caught.value.exit_code == 1  # known only once it ran: not bad input


def test_a_reused_run_without_a_result_is_refused_before_anything_runs(tmp_path):
    import json

    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.records.rundir import RunDir
    from orchestrator.records.store import NodeRecord, write_state

    runs = tmp_path / "runs"
    run_id = "mine-20261126-120000-abcd"
    run = RunDir.create(str(runs), run_id)
    run.write_plan({"workload": "train.py", "nodes": [
        {"host": "localhost", "env": {"DDP_ORCH_RESULT_FILE": f"{run.path}/node-0/result.json"}}]})
    write_state(run, run_id=run_id, backend="local", state=RunState.SUCCEEDED, started=1.0,
                nodes=[NodeRecord(0, "localhost", f"{run.path}/node-0", "python3")],
                outcome=RunOutcome(run_id, RunState.SUCCEEDED, 1.0, (), None, None))
    (tmp_path / "train.py").write_text("print('trained')\n")
    (tmp_path / "c.yaml").write_text("nodes: [{host: localhost, procs: 1}]\ndevice: cpu\n"
                                     "workload: {script: train.py}\n")
    result = run_cli("compare", str(tmp_path / "c.yaml"), "--ddp-run", run_id,
                     "--runs-dir", str(runs), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the ddp run {run_id} succeeded, but `train.py` wrote no result" in result.stderr
    assert f"{run.path}/node-0/result.json" in result.stderr
    # nothing ran: no baseline run beside the reused one
    assert [p for p in os.listdir(runs) if not p.startswith(".")] == [run_id]
    assert json.loads((runs / run_id / "state.json").read_text())["state"] == "succeeded"


def test_the_run_on_node_0_alone_is_node_0_as_the_file_gives_it():
    """(issue 46) Seed 001's 1 GPU, then N GPUs of one node, then the
    cluster: on the example's 3 + 4 GPUs, node 0 alone is its 3 GPUs."""
    from orchestrator.controller.compare import node_spec

    spec = load_cluster_file("cluster.yaml.example")
    node = node_spec(spec)
    assert node.nodes == (spec.nodes[0],) and node.world_size == 3
    assert node.workload == spec.workload and node.name == "resnet-demo-node0"
    plan = build_plan(node, run_id="n", local_run_dir="/r/n")
    assert plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "3,4,5"  # the file's node 0


def test_node_0_alone_is_left_out_where_it_would_repeat_another_run(tmp_path):
    """One node is the cluster run; one process on node 0 is the baseline;
    a DataParallel baseline is node 0's GPUs already. CPU processes run one
    thread each, as on the other sides."""
    from orchestrator.controller.compare import node_spec

    one = local_spec(None, workload="linear", args={}, gpus=None, procs=2, device=None)
    assert node_spec(one) is None
    text = ("nodes:\n  - {host: localhost, procs: %d}\n  - {host: localhost, procs: 2}\n"
            "workload: {name: linear}\n")
    (tmp_path / "single.yaml").write_text(text % 1)
    assert node_spec(load_cluster_file(str(tmp_path / "single.yaml"))) is None
    (tmp_path / "two.yaml").write_text(text % 2)
    two = load_cluster_file(str(tmp_path / "two.yaml"))
    node = node_spec(two)
    assert node.world_size == 2 and dict(node.nodes[0].env)["OMP_NUM_THREADS"] == "1"
    assert node_spec(two, "dp") is None
