"""Refusals from the command line: exit 2 before anything, the dry run and
`up` alike, nothing recorded."""

from __future__ import annotations

import os

import pytest

from conftest import run_cli
from fakesmi import LOCAL, fake_smi


def test_device_cuda_with_procs_on_the_command_line_is_exit_2_before_anything():
    result = run_cli(*LOCAL, "--workload", "linear", "--procs", "2", "--device", "cuda",
                     "--dry-run")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(
        "ddp-orch: error: command line: --device: --device cuda, but --procs 2 runs 2 CPU "
        "processes, which have no GPU and cannot join a CUDA job\n  hint: "), result.stderr


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
                     "--gpus: GPUs 0,1 asked for, but no GPU 1 on this node (nvidia-smi lists "
                     "GPUs: 0); free now: 0"),
    "no-nvidia-smi": ((*LOCAL, "--workload", "linear", "--gpus", "0"),
                      "--gpus: GPU 0 asked for, but nvidia-smi is not here, and its torch "),
}


@pytest.fixture
def smi_path(tmp_path):
    """PATH for the CLI: an nvidia-smi that lists GPU 0 only (``gpus-missing``),
    or none at all (``no-nvidia-smi``): the CLI needs no other program."""
    return {"gpus-missing": fake_smi(tmp_path / "smi", 0), "no-nvidia-smi": str(tmp_path)}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_dry_run_and_up_refuse_alike_and_record_nothing(case, tmp_path, smi_path):
    """And before a collective smoke test, which would launch runs of its own."""
    argv, expected = REFUSED[case]
    runs = tmp_path / "runs"
    env = {"PATH": smi_path[case]} if case in smi_path else None
    dry = run_cli(*argv, "--dry-run", "--runs-dir", str(runs), env=env)
    real = run_cli(*argv, "--runs-dir", str(runs), env=env)
    smoked = run_cli(*argv, "--preflight", "collective", "--runs-dir", str(runs), env=env)
    for result in (dry, real, smoked):
        assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    assert dry.stderr == real.stderr == smoked.stderr
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
