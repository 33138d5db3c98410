"""Unit tests of controller/refusals.py and session.py: what is refused before
anything starts, and what is left to the ranks."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.backends import choose
from orchestrator.engine.options import LaunchOptions
from orchestrator.config.loader import load_cluster_file, load_cluster_text
from orchestrator.config.localmode import local_spec
from orchestrator.controller.refusals import refuse
from orchestrator.controller.session import prepare
from orchestrator.errors import ConfigError


NO_SMI = {"ok": False, "absent": True, "error": "nvidia-smi not found on PATH"}
CPU_TORCH = {"ok": True, "torch": "2.14.1+cpu", "cuda": None, "available": False}


def smi(*indices: int, mig: tuple = ()) -> dict:
    """``gpus.facts``'s answer for idle GPUs ``indices``."""
    return {"ok": True, "driver": "550", "apps": [], "gpus": [
        {"index": k, "uuid": f"GPU-{k}", "bus_id": f"0:{k}", "name": "H100", "mig": k in mig,
         "memory_total_mib": 81559, "memory_used_mib": 1, "utilization": 0} for k in indices]}


def refusal(spec, options=LaunchOptions(), gpus_here=lambda: NO_SMI,
            torch_here=lambda python: CPU_TORCH) -> ConfigError:
    plan = choose(spec, options).plan("r", "/tmp/r")
    with pytest.raises(ConfigError) as caught:
        refuse(spec, plan, options, gpus_here, torch_here)
    return caught.value


def test_device_cuda_with_cpu_processes_is_refused_from_the_options_as_from_a_file():
    with pytest.raises(ConfigError) as from_file:
        load_cluster_text("device: cuda\nnodes: [{host: localhost, procs: 2}]\n"
                          "workload: {name: linear}\n", source="c.yaml")
    assert from_file.value.path == "device" and "cannot join a CUDA job" in str(from_file.value)
    with pytest.raises(ConfigError) as from_options:
        local_spec(None, workload="linear", gpus=None, procs=2, device="cuda", args={})
    assert from_options.value.path == "--device"
    assert "--procs 2 runs 2 CPU processes" in str(from_options.value)
    assert "cannot join a CUDA job" in str(from_options.value)
    # the file says cuda; --procs (or --local's default CPU processes) cannot give it
    base = load_cluster_text("device: cuda\nnodes: [{host: localhost, gpus: '0,1'}]\n"
                             "workload: {name: linear}\n", source="c.yaml")
    for procs, path in ((3, "--procs"), (None, "--local")):
        with pytest.raises(ConfigError) as caught:
            local_spec(base, workload=None, gpus=None, procs=procs, device=None, args={})
        assert caught.value.path == path and "c.yaml says device: cuda" in str(caught.value)
    # what runs on CPU, or asks for GPUs, is not this rule's business
    assert local_spec(base, workload=None, gpus=None, procs=2, device="cpu", args={})
    assert local_spec(None, workload="linear", gpus="0", procs=None, device="cuda", args={})


@pytest.mark.parametrize("text, why", [
    ("workdir: /scratch/x\nnodes: [{host: localhost, procs: 2}]\n", "every node is localhost"),
    ("workdir: /scratch/x\nbackend: ssh\nnodes: [{host: localhost, procs: 1}]\n",
     "every node is localhost"),
    ("workdir: /scratch/x\nnodes: {count: 2, procs: 1}\n", "under backend: slurm"),
])
def test_a_workdir_that_no_node_would_use_is_refused_with_what_to_use(text, why):
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(text + "workload: {name: linear}\n", source="c.yaml")
    assert caught.value.path == "workdir" and caught.value.line == 1
    assert f"no node would use it: {why}" in caught.value.message
    assert "--runs-dir" in caught.value.hint


def test_a_workdir_for_remote_nodes_stays_and_up_local_rehearses_the_file_without_it(tmp_path):
    text = ("workdir: /scratch/x\nmaster: {addr: 10.0.0.1}\n"
            "nodes: [{host: localhost, procs: 1}, {host: b, procs: 1}]\n"
            "workload: {name: linear}\n")
    spec = load_cluster_text(text, source="c.yaml")
    assert spec.workdir == "/scratch/x"
    plan = prepare(spec, LaunchOptions(), run_id="r", local_run_dir="/tmp/r")[1].plan
    assert plan.nodes[0].run_dir == "/tmp/r/node-0"  # localhost: in the run directory
    assert plan.nodes[1].run_dir == "/scratch/x/runs/r/node-1"
    assert local_spec(spec, workload=None, gpus=None, procs=2, device=None, args={})


def test_a_refusal_from_a_file_names_the_file_and_the_workload_argument(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [{host: localhost, procs: 2}]\n"
                    "workload: {name: resnet, args: {image-size: 4}}\n")
    spec = load_cluster_file(str(path))
    error = refusal(spec)
    assert str(error).startswith(f"{path}: workload.args.image_size: --image-size 4 is too "
                                 "small for ResNet-18 (>= 8)")


def test_resume_without_a_checkpoint_is_fine_where_ddp_orch_may_restart_the_run():
    spec = load_cluster_text("nodes: [{host: localhost, procs: 1}]\n"
                             "workload: {name: mnist, args: {resume: true}}\n")
    assert "--resume needs --checkpoint PATH" in refusal(spec).message
    prepare(spec, LaunchOptions(max_restarts=1), run_id="r", local_run_dir="/tmp/r")


def test_what_only_the_ranks_can_see_is_left_to_them():
    """A remote node's GPUs under device auto: the controller cannot know
    whether fp16 or dp will find CUDA there, so it does not refuse."""
    spec = load_cluster_text("nodes: [{host: a, gpus: '0,1'}]\n"
                             "workload: {name: mnist, args: {amp: fp16}}\n")
    prepare(spec, LaunchOptions(), run_id="r", local_run_dir="/tmp/r")
    cuda = dataclasses.replace(spec, device="cuda", workload=dataclasses.replace(
        spec.workload, name="mlp", args={"mode": "dp"}))
    assert "world size 2" in refusal(cuda).message
    one = dataclasses.replace(cuda, nodes=(dataclasses.replace(cuda.nodes[0], gpus=(0,)),))
    assert "--mode dp needs at least 2 visible CUDA devices, found 1" in refusal(one).message


def test_a_localhost_node_asking_for_missing_gpus_is_refused_unless_the_run_is_on_cpu():
    spec = load_cluster_text("nodes: [{host: localhost, gpus: '0,1'}]\n"
                             "workload: {name: linear}\n", source="c.yaml")
    error = refusal(spec, gpus_here=lambda: smi(0))
    assert str(error) == ("c.yaml:1: nodes[0].gpus: node 0 (localhost) lists GPUs 0,1, but "
                          "no GPU 1 on this node (nvidia-smi lists GPUs: 0); free now: 0\n"
                          "  hint: set `device: cpu` for a CPU rehearsal (the listed GPUs "
                          "become CPU processes)")
    assert refusal(spec).message == ("node 0 (localhost) lists GPUs 0,1, but nvidia-smi is "
                                     "not here, and its torch 2.14.1+cpu is built without CUDA")
    failing = {"ok": False, "error": "nvidia-smi --query-gpu: driver gone (exit 9)"}
    assert "nvidia-smi failed here: nvidia-smi --query-gpu: driver gone (exit 9)" in \
        refusal(spec, gpus_here=lambda: failing).message
    assert "in MIG mode" in refusal(spec, gpus_here=lambda: smi(0, 1, mig=(1,))).message
    plan = choose(spec, LaunchOptions()).plan("r", "/tmp/r")
    refuse(spec, plan, LaunchOptions(), lambda: smi(1, 0), lambda python: CPU_TORCH)
    seen = {"ok": True, "torch": "2.14.1", "cuda": "13.0", "available": True, "count": 2}
    refuse(spec, plan, LaunchOptions(), lambda: NO_SMI, lambda python: seen)  # torch's count
    assert "sees 1 GPU(s)" in refusal(spec, torch_here=lambda python: {**seen, "count": 1}
                                      ).message
    on_cpu = dataclasses.replace(spec, device="cpu")
    prepare(on_cpu, LaunchOptions(), run_id="r", local_run_dir="/tmp/r")  # no GPU asked for
