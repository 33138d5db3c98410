"""The command line as a user meets it: golden dry-runs, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from dryrun import golden_shell

GOLDEN = os.path.join(ROOT, "tests", "golden")


@pytest.mark.parametrize("fmt", ["text", "json", "shell"])
def test_dry_run_of_the_example_matches_golden_word_for_word(fmt):
    # --runs-dir: the shell lines name this machine's run directory, which
    # is otherwise found from the current directory or the user's default.
    result = run_cli("up", "cluster.yaml.example", "--dry-run", "--run-id", "resnet-demo-golden",
                     "--runs-dir", "runs", "--format", fmt)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(GOLDEN, f"example.{fmt}.txt"), encoding="utf-8") as fh:
        assert result.stdout == golden_shell(fh.read())


def test_json_dry_run_is_the_plan():
    result = run_cli("up", "cluster.yaml.example", "--dry-run", "--format", "json")
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 7
    assert [n["ranks"] for n in plan["nodes"]] == [[0, 2], [3, 6]]
    assert [n["env"]["CUDA_VISIBLE_DEVICES"] for n in plan["nodes"]] == ["3,4,5", "0,1,2,3"]


# Runs the example's dry run in-process, then imports every controller
# module, and reports what that did: the exit code, the output and any torch
# module loaded (the controller must start fast on a laptop without torch).
NO_TORCH_PROBE = """
import contextlib, importlib, io, json, pkgutil, runpy, sys
sys.argv = ['ddp-orch', 'up', 'cluster.yaml.example', '--dry-run', '--run-id', 'resnet-demo-golden']
out = io.StringIO()
code = 0
try:
    with contextlib.redirect_stdout(out):
        runpy.run_module('orchestrator', run_name='__main__')
except SystemExit as exc:
    code = exc.code
import orchestrator
modules = [m.name for m in pkgutil.walk_packages(orchestrator.__path__, 'orchestrator.')
           if not m.name.endswith('__main__')]
for name in modules:
    importlib.import_module(name)
print(json.dumps({'exit': code, 'stdout': out.getvalue(), 'modules': modules,
                  'torch': sorted(m for m in sys.modules if m.split('.')[0] == 'torch')}))
"""


def test_the_dry_run_and_every_controller_module_load_without_torch():
    result = subprocess.run([sys.executable, "-c", NO_TORCH_PROBE], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.splitlines()[-1])
    assert probe["exit"] in (0, None), probe
    with open(os.path.join(GOLDEN, "example.text.txt"), encoding="utf-8") as fh:
        assert probe["stdout"] == fh.read()  # the dry run really ran, to its end
    assert {"orchestrator.controller.session", "orchestrator.backends.ssh",
            "orchestrator.backends.slurm.backend", "orchestrator.report.compare"} <= set(probe["modules"])
    assert probe["torch"] == []


# One command run in-process, then the modules it loaded, as JSON.
LOADED_PROBE = """
import contextlib, io, json, runpy, sys
sys.argv = ['ddp-orch', *json.loads(sys.argv[1])]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        runpy.run_module('orchestrator', run_name='__main__')
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""
# What starts, follows or reaches a run: a command that only reads a file or
# the run records must not pay for it (bench/cli_latency.py times them).
ENGINE = {"orchestrator.engine.run", "orchestrator.engine.gang", "orchestrator.engine.keptgang",
          "orchestrator.engine.nodehandle", "orchestrator.engine.agentlink",
          "orchestrator.engine.preflight", "orchestrator.backends.agentrun", "paramiko"}


@pytest.mark.parametrize("argv, also_unloaded", [
    (["--help"], {"yaml", "orchestrator.config.loader", "orchestrator.engine.results"}),
    (["ps"], {"yaml", "orchestrator.config.loader", "orchestrator.engine.results"}),
    (["status", "no-such-run"], {"yaml", "orchestrator.config.loader"}),
    (["up", "cluster.yaml.example", "--dry-run"], set()),
], ids=["help", "ps", "status", "dry-run"])
def test_commands_that_start_nothing_do_not_load_the_engine(argv, also_unloaded, tmp_path):
    result = subprocess.run([sys.executable, "-c", LOADED_PROBE, json.dumps(argv)], cwd=ROOT,
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT,
                                 "DDP_ORCH_RUNS_DIR": str(tmp_path / "runs")})
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "orchestrator.cli.main" in loaded  # the command really ran
    assert not loaded & (ENGINE | also_unloaded), sorted(loaded & (ENGINE | also_unloaded))


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
    (["up", "cluster.yaml.example", "--env", "RANK=3", "--dry-run"],
     "--env: RANK cannot be set here"),
    (["up", "cluster.yaml.example", "--env", "DDP_ORCH_RUN_ID=x", "--dry-run"],
     "cannot be set here"),
    (["up", "cluster.yaml.example", "--env", "9LIVES=1", "--dry-run"],
     "'9LIVES': not a valid environment variable name"),
    (["up", "cluster.yaml.example", "--env", "NCCL_DEBUG", "--dry-run"], "is not KEY=VALUE"),
])
def test_bad_command_lines_exit_2(args, words):
    result = run_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_secret_env_values_are_never_printed_by_any_dry_run_format(tmp_path):
    """Masked in text and json; the shell lines, which must run, take each
    from the node's environment and stop there if it is not set."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("env: {HF_TOKEN: hunter2-value, WANDB_API_KEY: k3y-value, PLAIN: visible}\n"
                       "nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear}\n")
    for fmt in ("text", "json", "shell"):
        out = run_cli("up", str(cluster), "--dry-run", "--format", fmt).stdout
        assert "hunter2-value" not in out and "k3y-value" not in out
        assert "visible" in out
        assert ("********" in out) == (fmt != "shell")
    assert ' HF_TOKEN="${HF_TOKEN:?export HF_TOKEN on this node first}" ' in out
    assert "# Secret values are not printed: the lines take HF_TOKEN, WANDB_API_KEY from" in out


def test_env_on_the_command_line_wins_over_the_files_and_is_masked(tmp_path):
    """``up --env`` over the top-level and the per-node ``env:``, on every
    node; a secret name given this way is masked like the file's."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("env: {LEVEL: file, KEEP: same}\n"
                       "nodes:\n  - {host: a, gpus: 0, env: {LEVEL: node}}\n"
                       "  - {host: b, gpus: 0}\nworkload: {name: linear}\n")
    result = run_cli("up", str(cluster), "--dry-run", "--format", "json",
                     "--env", "LEVEL=cli", "--env", "HF_TOKEN=hunter2-value",
                     "--env", "EMPTY=")
    assert result.returncode == 0, result.stderr
    assert "hunter2-value" not in result.stdout
    nodes = json.loads(result.stdout)["nodes"]
    assert [n["env"]["LEVEL"] for n in nodes] == ["cli", "cli"]
    assert [n["env"]["KEEP"] for n in nodes] == ["same", "same"]
    assert [n["env"]["EMPTY"] for n in nodes] == ["", ""]
    assert [n["env"]["HF_TOKEN"] for n in nodes] == ["********", "********"]


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


def test_arg_amp_off_reaches_the_workload_as_off():
    """YAML reads the value of ``--arg amp=off`` as false; mnist takes the word."""
    result = run_cli("up", "--local", "--workload", "mnist", "--procs", "1", "--dry-run",
                     "--arg", "amp=off")
    assert result.returncode == 0, result.stderr
    assert "-m workloads.mnist --amp off" in result.stdout


def test_workloads_lists_the_catalog():
    result = run_cli("workloads")
    assert result.returncode == 0
    assert "linear" in result.stdout and "--global-batch-size" in result.stdout


def test_version_and_help():
    assert run_cli("--version").stdout.startswith("ddp-orch, version ")
    for args in (["--help"], ["up", "--help"], ["workloads", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and "Usage:" in result.stdout


# --- your own project: -- PROGRAM ARGS, as typed after torchrun ----------------------

@pytest.fixture
def project(tmp_path):
    """A project root with a package, configs and a script, and its cluster file."""
    for rel in ("proj/__init__.py", "proj/train.py", "configs/x.yaml", "scripts/train.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "cluster.yaml").write_text(
        "nodes:\n  - {host: a, procs: 2}\n  - {host: b, procs: 1}\n"
        "workload:\n  code: .\n  module: proj.train\n  args: [configs/x.yaml, 50, 10]\n")
    return tmp_path


def shim_tail(text: str) -> list[str]:
    """Each node's program words (after the shim) from a text dry-run."""
    return [line.split("-m ddp_orch_shim ", 1)[1] for line in text.splitlines()
            if "-m ddp_orch_shim " in line]


def test_the_dry_run_shows_the_files_program_and_the_code_root_as_cwd(project):
    result = run_cli("up", str(project / "cluster.yaml"), "--dry-run", "--run-id", "p")
    assert result.returncode == 0, result.stderr
    assert shim_tail(result.stdout) == ["-m proj.train configs/x.yaml 50 10"] * 2
    assert "  cwd      ~/.ddp-orch/runs/p/node-0/project" in result.stdout
    assert f"code dir   {project}: " in result.stdout
    shell = run_cli("up", str(project / "cluster.yaml"), "--dry-run", "--run-id", "p",
                    "--format", "shell").stdout
    assert 'cd "$HOME"/.ddp-orch/runs/p/node-1/project && ' in shell


@pytest.mark.parametrize("program, shown", [
    (["scripts/train.py", "--config", "configs/x.yaml", "50", "10"],
     "scripts/train.py --config configs/x.yaml 50 10"),
    (["-m", "proj.train", "--lr=0.1", "-v", "-v", "--", "a b"],
     "-m proj.train --lr=0.1 -v -v -- 'a b'"),
    (["proj/train.py"], "proj/train.py"),
])
def test_a_program_after_the_double_dash_replaces_the_files(project, program, shown):
    result = run_cli("up", str(project / "cluster.yaml"), "--dry-run", "--", *program)
    assert result.returncode == 0, result.stderr
    assert shim_tail(result.stdout) == [shown] * 2  # quoted once, for the shell only
    plan = json.loads(run_cli("up", str(project / "cluster.yaml"), "--dry-run", "--format",
                              "json", "--", *program).stdout)
    for node in plan["nodes"]:
        assert node["argv"][node["argv"].index("ddp_orch_shim") + 1:] == program
        assert node["code_root"].endswith(f"/node-{node['node_rank']}/project")


def test_a_program_runs_here_from_this_directory_with_local(project):
    result = run_cli("up", "--local", "--procs", "2", "--dry-run", "--run-id", "l", "--",
                     "-m", "proj.train", "50", "10", cwd=str(project))
    assert result.returncode == 0, result.stderr
    assert shim_tail(result.stdout) == ["-m proj.train 50 10"]
    assert f"code dir   {project}: " in result.stdout


@pytest.mark.parametrize("after, words", [
    ([], "nothing after --"),
    (["--lr", "0.1"], "'--lr' is not a program"),
    (["-m"], "-m without a module name"),
    (["-m", "proj/train.py"], "'proj/train.py' is not a module name"),
    (["nope.py"], "script 'nope.py' not found"),
    (["python", "train.py"], "ddp-orch starts python through torchrun itself"),
    (["../elsewhere.py"], "is outside the code directory"),
])
def test_a_bad_program_after_the_double_dash_exits_2(project, after, words):
    (project.parent / "elsewhere.py").write_text("")
    result = run_cli("up", str(project / "cluster.yaml"), "--dry-run", "--", *after)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("ddp-orch: error: command line: -- PROGRAM: ")
    assert words in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_program_words_without_the_double_dash_or_with_arg_are_refused(project):
    result = run_cli("up", str(project / "cluster.yaml"), "scripts/train.py")
    assert result.returncode == 2
    assert "go after --: ddp-orch up FILE -- train.py" in result.stderr
    result = run_cli("up", str(project / "cluster.yaml"), "--arg", "x=1", "--dry-run", "--",
                     "scripts/train.py")
    assert result.returncode == 2 and "--arg and a program after -- together" in result.stderr
    result = run_cli("up", str(project / "cluster.yaml"), "--arg", "x=1", "--dry-run")
    assert result.returncode == 2 and "this workload's args are a list" in result.stderr
