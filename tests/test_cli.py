"""The command line as a user meets it: golden dry-runs, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli

GOLDEN = os.path.join(ROOT, "tests", "golden")


@pytest.mark.parametrize("fmt", ["text", "json", "shell"])
def test_dry_run_of_the_example_matches_golden_word_for_word(fmt):
    result = run_cli("up", "cluster.yaml.example", "--dry-run", "--run-id", "resnet-demo-golden",
                     "--format", fmt)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(GOLDEN, f"example.{fmt}.txt"), encoding="utf-8") as fh:
        assert result.stdout == fh.read()


def test_json_dry_run_is_the_plan():
    result = run_cli("up", "cluster.yaml.example", "--dry-run", "--format", "json")
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 7
    assert [n["ranks"] for n in plan["nodes"]] == [[0, 2], [3, 6]]
    assert [n["env"]["CUDA_VISIBLE_DEVICES"] for n in plan["nodes"]] == ["3,4,5", "0,1,2,3"]


def test_controller_never_imports_torch():
    code = ("import sys, runpy\n"
            "sys.argv = ['ddp-orch', 'up', 'cluster.yaml.example', '--dry-run']\n"
            "try:\n    runpy.run_module('orchestrator', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "import orchestrator.controller.session, orchestrator.backends.local, orchestrator.backends.ssh\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('no torch')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("no torch")


def test_bad_file_exits_2_with_one_message_and_no_traceback(tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes:\n  - host: a\n    gpus: 0\n  - host: b\n    gpus: 2,2\n"
                   "workload: {name: linear}\n")
    result = run_cli("up", str(bad), "--dry-run")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == f"ddp-orch: error: {bad}:5: nodes[1].gpus: duplicate GPU 2 in '2,2'"
    assert result.stdout == ""


@pytest.mark.parametrize("args, words", [
    (["up"], "give a cluster file, or --local"),
    (["up", "--local", "--workload", "linaer"], "did you mean 'linear'?"),
    (["up", "--local", "--workload", "linear", "--gpus", "0,,1"], "--gpus"),
    (["up", "--local", "--workload", "linear", "--gpus", "0", "--procs", "2"], "not both"),
    (["up", "--local", "--workload", "linear", "--arg", "epoch=3"], "did you mean 'epochs'?"),
    (["up", "--local", "--workload", "linear", "--arg", "epochs"], "is not KEY=VALUE"),
    (["up", "cluster.yaml.example", "--procs", "2"], "go with --local"),
    (["up", "cluster.yaml.example", "--arg", "epochs=x", "--dry-run"], "expected int"),
    (["up", "cluster.yaml.example", "--run-id", "../x", "--dry-run"], "not a valid run id"),
    (["up", "/nonexistent.yaml"], "no such file"),
])
def test_bad_command_lines_exit_2(args, words):
    result = run_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_secret_env_values_are_masked_in_every_dry_run_format(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("env: {HF_TOKEN: hunter2-value, WANDB_API_KEY: k3y-value, PLAIN: visible}\n"
                       "nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear}\n")
    for fmt in ("text", "json", "shell"):
        out = run_cli("up", str(cluster), "--dry-run", "--format", fmt).stdout
        assert "hunter2-value" not in out and "k3y-value" not in out
        assert "visible" in out and "********" in out


def test_local_dry_run_shows_one_local_node():
    result = run_cli("up", "--local", "--workload", "linear", "--procs", "3", "--dry-run",
                     "--run-id", "loc", "--arg", "epochs=2")
    assert result.returncode == 0, result.stderr
    assert "node 0  localhost  ranks 0-2 (3 processes, local subprocess)" in result.stdout
    assert "--master-addr 127.0.0.1" in result.stdout
    assert "-m workloads.linear --epochs 2" in result.stdout


def test_arg_overrides_the_file_in_a_cluster_dry_run():
    result = run_cli("up", "cluster.yaml.example", "--dry-run", "--arg", "epochs=3",
                     "--arg", "lr=0.5")
    assert result.returncode == 0, result.stderr
    assert "-m workloads.linear --epochs 3 --lr 0.5" in result.stdout


def test_workloads_lists_the_catalog():
    result = run_cli("workloads")
    assert result.returncode == 0
    assert "linear" in result.stdout and "--global-batch-size" in result.stdout


def test_version_and_help():
    assert run_cli("--version").stdout.startswith("ddp-orch, version ")
    for args in (["--help"], ["up", "--help"], ["workloads", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "Usage:" in result.stdout
