"""Refused before launch what is knowable before launch (issue 22), and the
dry-run refuses exactly what ``up`` refuses: the same message, exit 2, and
no run recorded by either.

The command lines here never start a rank: each is refused first, so ``up``
without ``--dry-run`` is as fast as the dry-run.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys

import pytest

from conftest import ROOT, run_cli
from orchestrator.backends import backend_for
from orchestrator.backends.base import LaunchOptions
from orchestrator.config.loader import load_cluster_file, load_cluster_text
from orchestrator.config.localmode import local_spec
from orchestrator.controller.refusals import refuse
from orchestrator.controller.session import prepare
from orchestrator.errors import ConfigError

LOCAL = ("up", "--local")
NO_SMI = {"gpu_error": "nvidia-smi not found"}


def fake_smi(directory, *indices: int) -> str:
    """A directory holding an ``nvidia-smi`` that lists GPUs ``indices``."""
    directory.mkdir(exist_ok=True)
    smi = directory / "nvidia-smi"
    listing = "".join(f"GPU {k}: Fake GPU (UUID: GPU-{k})\\n" for k in indices)
    smi.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return str(directory)


def refusal(spec, options=LaunchOptions(), gpus_here=lambda: NO_SMI) -> ConfigError:
    plan = backend_for(spec, options).plan("r", "/tmp/r")
    with pytest.raises(ConfigError) as caught:
        refuse(spec, plan, options, gpus_here)
    return caught.value


# 1. --device cuda with CPU processes: one rule for the file and the options -----------

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


def test_device_cuda_with_procs_on_the_command_line_is_exit_2_before_anything():
    result = run_cli(*LOCAL, "--workload", "linear", "--procs", "2", "--device", "cuda",
                     "--dry-run")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(
        "ddp-orch: error: command line: --device: --device cuda, but --procs 2 runs 2 CPU "
        "processes, which have no GPU and cannot join a CUDA job\n  hint: "), result.stderr


# 2. workdir: that no node would use ------------------------------------------------

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


# 3. the dry-run refuses what up refuses, in the same words ----------------------------

REFUSED = {
    "resnet-image-size": ((*LOCAL, "--workload", "resnet", "--procs", "2",
                           "--arg", "image_size=4"),
                          "--arg image_size: --image-size 4 is too small for ResNet-18 (>= 8)"),
    "mlp-dp-world": ((*LOCAL, "--workload", "mlp", "--procs", "2", "--arg", "mode=dp"),
                     "--arg mode: --mode dp is single-process nn.DataParallel but this job "
                     "has world size 2"),
    "mlp-dp-cpu": ((*LOCAL, "--workload", "mlp", "--procs", "1", "--arg", "mode=dp"),
                   "--arg mode: --mode dp needs at least 2 visible CUDA devices, found 0"),
    "mnist-fp16-cpu": ((*LOCAL, "--workload", "mnist", "--procs", "1", "--arg", "amp=fp16"),
                       "--arg amp: --amp fp16 needs CUDA; on CPU use --amp bf16 or --amp off"),
    "mnist-resume": ((*LOCAL, "--workload", "mnist", "--procs", "1", "--arg", "resume=true"),
                     "--arg resume: --resume needs --checkpoint PATH"),
    "device-arg-cuda": ((*LOCAL, "--workload", "linear", "--procs", "2",
                         "--arg", "device=cuda"),
                        "--arg device: device 'cuda' was requested but no CUDA device is "
                        "visible to this process"),
    "gpus-missing": ((*LOCAL, "--workload", "linear", "--gpus", "0,1"),
                     "--gpus: no GPU 1 (nvidia-smi lists [0]), but --gpus asks for GPUs 0,1"),
    "no-nvidia-smi": ((*LOCAL, "--workload", "linear", "--gpus", "0"),
                      "--gpus: nvidia-smi not found, but --gpus asks for GPU 0"),
}


@pytest.fixture
def smi_path(tmp_path):
    """PATH for the CLI: an nvidia-smi that lists GPU 0 only (``gpus-missing``),
    or none at all (``no-nvidia-smi``): the CLI needs no other program."""
    return {"gpus-missing": fake_smi(tmp_path / "smi", 0), "no-nvidia-smi": str(tmp_path)}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_dry_run_and_up_refuse_alike_and_record_nothing(case, tmp_path, smi_path):
    argv, expected = REFUSED[case]
    runs = tmp_path / "runs"
    env = {"PATH": smi_path[case]} if case in smi_path else None
    dry = run_cli(*argv, "--dry-run", "--runs-dir", str(runs), env=env)
    real = run_cli(*argv, "--runs-dir", str(runs), env=env)
    for result in (dry, real):
        assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    assert dry.stderr == real.stderr
    assert dry.stderr.startswith(f"ddp-orch: error: command line: {expected}"), dry.stderr
    assert "\n  hint: " in dry.stderr
    assert not runs.exists() or os.listdir(runs) == []


def test_the_upload_cap_is_the_dry_runs_refusal_too_with_a_fix_for_a_script(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    with open(project / "data.bin", "wb") as fh:  # sparse: 70 MiB on paper, none on disk
        fh.truncate(70 * 1024 * 1024)
    runs = tmp_path / "runs"
    argv = (*LOCAL, "--procs", "1", "--runs-dir", str(runs), "--", "train.py")
    dry = run_cli(*argv[:-2], "--dry-run", *argv[-2:], cwd=str(project))
    real = run_cli(*argv, cwd=str(project))
    for result in (dry, real):
        assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)
    assert dry.stderr == real.stderr
    assert f"workload.code: the code directory {project} holds 70.0 MiB" in dry.stderr
    assert "70.0 MiB  data.bin" in dry.stderr
    assert "hint: keep data, checkpoints and outputs out of it (train.py can read them" in \
        dry.stderr and ".ddp-orch-ignore" in dry.stderr and "--data-dir" not in dry.stderr
    assert not runs.exists() or os.listdir(runs) == []
    (project / ".ddp-orch-ignore").write_text("data.bin\n")  # the fix the hint gives
    assert run_cli(*argv[:-2], "--dry-run", *argv[-2:], cwd=str(project)).returncode == 0


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


# 5. a localhost node's GPUs: what check says, up says ------------------------------

def test_a_localhost_node_asking_for_missing_gpus_is_refused_unless_the_run_is_on_cpu():
    spec = load_cluster_text("nodes: [{host: localhost, gpus: '0,1'}]\n"
                             "workload: {name: linear}\n", source="c.yaml")
    error = refusal(spec, gpus_here=lambda: {"gpus": [0]})
    assert str(error) == ("c.yaml:1: nodes[0].gpus: no GPU 1 (nvidia-smi lists [0]), but "
                          "node 0 (localhost) lists GPUs 0,1\n  hint: set `device: cpu` for "
                          "a CPU rehearsal (the listed GPUs become CPU processes)")
    assert "nvidia-smi not found" in refusal(spec).message
    refuse(spec, backend_for(spec, LaunchOptions()).plan("r", "/tmp/r"), LaunchOptions(),
           lambda: {"gpus": [1, 0]})
    on_cpu = dataclasses.replace(spec, device="cpu")
    prepare(on_cpu, LaunchOptions(), run_id="r", local_run_dir="/tmp/r")  # no GPU asked for


@pytest.mark.live
def test_check_and_up_say_the_same_about_a_localhost_node_without_its_gpus(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"python: {sys.executable}\nnodes: [{{host: localhost, gpus: '0,1'}}]\n"
                    "workload: {name: noop}\n")
    env = {"PATH": fake_smi(tmp_path / "smi", 0) + os.pathsep + os.path.dirname(sys.executable)
           + os.pathsep + "/usr/bin:/bin"}
    check = run_cli("check", str(path), env=env)
    up = run_cli("up", str(path), "--runs-dir", str(tmp_path / "runs"), env=env)
    problem = "no GPU 1 (nvidia-smi lists [0])"
    assert check.returncode == 1
    row = next(line for line in check.stdout.splitlines() if " gpus " in line)
    assert "FAIL" in row.upper() and problem in row, check.stdout
    assert "set `device: cpu` for a CPU rehearsal" in row
    assert up.returncode == 2 and f"nodes[0].gpus: {problem}" in up.stderr, up.stderr
    assert "set `device: cpu` for a CPU rehearsal" in up.stderr


# the README's quick start, at a world size that divides no batch -------------------

@pytest.mark.live
def test_the_quick_start_runs_on_three_processes(tmp_path):
    result = run_cli(*LOCAL, "--workload", "linear", "--procs", "3", "--arg", "epochs=1",
                     "--runs-dir", str(tmp_path), cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "SUCCEEDED" in result.stdout.upper()
