"""Your own project over the SSH lab, as torchrun runs it from the project root.

``tests/programs/project`` is shaped like a real one: a package (``proj/``,
run with ``python -m proj.train``), ``configs/x.yaml`` read by its relative
path, and ``scripts/train.py``, which imports the package from the root.
Its programs take PyTorch's DDP tutorial-series arguments (``multinode.py
50 10``: total_epochs save_every), and every rank reports what it saw:
working directory, argv, ``__name__`` and the config it read. The file's
``module:`` with a positional list of ``args:`` and a ``-- PROGRAM ARGS``
on the command line (a script, then a module) must each reach every rank
verbatim, with the node's copy of the code root as the working directory.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import ROOT, run_cli
from labhome import lab_cluster, lab_home

pytestmark = pytest.mark.live
PROJECT = os.path.join(ROOT, "tests", "programs", "project")
NODES = ["{host: node0, procs: 2}", "{host: node1, procs: 1}"]
CONFIG = "lr: 0.1\nbatch_size: 32\n"
WORKLOAD = ("workload:\n  code: project\n  module: proj.train\n"
            "  args: [50, 10, --config, configs/x.yaml, -v, -v, --lr=0.10, 'a b']\n")


@pytest.fixture
def project(ssh_lab, tmp_path):
    """The project copied into ``tmp_path/project``, a cluster file beside it
    (``code: project``), and the env of a home for the lab."""
    shutil.copytree(PROJECT, tmp_path / "project",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return lab_home(ssh_lab, tmp_path), lab_cluster(ssh_lab, tmp_path, NODES, WORKLOAD,
                                                     name="proj")


def run_project(tmp_path, env, cluster, run_id, *program):
    result = run_cli("up", cluster, "--run-id", run_id, "--runs-dir", str(tmp_path / "runs"),
                     *(("--", *program) if program else ()), env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = json.loads((tmp_path / "runs" / run_id / "result.json").read_text())["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2]
    return result, ranks


def code_root(tmp_path, run_id, rank):
    node = 0 if rank < 2 else 1  # node0 runs ranks 0-1, node1 rank 2
    return str(tmp_path / "remote" / "runs" / run_id / f"node-{node}" / "project")


def test_a_module_with_positional_list_args_runs_from_the_code_root(ssh_lab, tmp_path,
                                                                    project):
    env, cluster = project
    result, ranks = run_project(tmp_path, env, cluster, "mod")
    for seen in ranks:
        root = code_root(tmp_path, "mod", seen["rank"])
        assert seen["cwd"] == root  # as `torchrun -m proj.train` from the project root
        assert seen["argv"] == [f"{root}/proj/train.py", "50", "10", "--config",
                                "configs/x.yaml", "-v", "-v", "--lr=0.10", "a b"]
        assert seen["name"] == "__main__" and seen["entry"] == "module proj.train"
        assert (seen["total_epochs"], seen["save_every"]) == (50, 10)
        assert seen["config"] == CONFIG  # configs/x.yaml, by its relative path
    # each rank's line reached its node's log as printed
    for node, rank in ((0, 0), (0, 1), (1, 2)):
        log = (tmp_path / "runs" / "mod" / f"node-{node}.log").read_text()
        assert f'[rank{rank}]: seen {{"argv": ["{code_root(tmp_path, "mod", rank)}' in log


def test_a_script_after_the_double_dash_replaces_the_files_program(ssh_lab, tmp_path, project):
    env, cluster = project
    typed = ("scripts/train.py", "--config=configs/x.yaml", "50", "10", "--", "-x")
    result, ranks = run_project(tmp_path, env, cluster, "script", *typed)
    plan = json.loads((tmp_path / "runs" / "script" / "plan.json").read_text())
    for node in plan["nodes"]:  # what ran is what the dry-run shows
        assert node["argv"][node["argv"].index("ddp_orch_shim") + 1:] == list(typed)
    for seen in ranks:
        assert seen["cwd"] == code_root(tmp_path, "script", seen["rank"])
        assert seen["argv"] == list(typed)  # argv[0] as typed, as plain python gives it
        assert seen["name"] == "__main__" and seen["entry"] == "script scripts/train.py"
        assert (seen["total_epochs"], seen["save_every"], seen["config"]) == (50, 10, CONFIG)


def test_a_module_after_the_double_dash_with_the_tutorials_arguments(ssh_lab, tmp_path, project):
    env, cluster = project
    result, ranks = run_project(tmp_path, env, cluster, "dashm", "-m", "proj.train", "50", "10")
    for seen in ranks:
        root = code_root(tmp_path, "dashm", seen["rank"])
        assert seen["cwd"] == root
        assert seen["argv"] == [f"{root}/proj/train.py", "50", "10"]
        assert (seen["total_epochs"], seen["save_every"], seen["rest"]) == (50, 10, [])
