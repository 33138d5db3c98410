"""`up --dry-run --format shell` runs as printed: each line executed as it
stands, on this machine, on the SSH lab's hosts and in the Slurm lab's
allocation, starts the run by hand and it finishes with its result.

The only help the lines get is what a user's machine has: no `ddp-orch` on
PATH (the lines call the one that printed them, here this tree's `python -m
orchestrator`, by its path; PYTHONPATH as the dry-run had it), `ssh` reading
the user's config (here the lab's, which OpenSSH would not find through
$HOME), and MASTER_PORT set to a free port, as the lines' own header says to
do when 29500 may be taken (other tests run beside these).

Golden: tests/golden/slurm.shell.txt is
    python -m orchestrator up tests/golden/slurm.yaml --dry-run --format shell \\
        --run-id slurm-golden --runs-dir /shared/runs
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import run_cli
from labhome import lab_cluster, lab_home
from dryrun import PYTHON, run_gang, run_here, sections, user_path


@pytest.mark.live
def test_the_local_shell_dry_run_runs_line_by_line(tmp_path):
    """A local run's lines, each in a fresh shell: the bundle, its unpacking,
    then node 0's line started from another directory (its paths are
    absolute); real torchrun, two processes, two steps of linear."""
    work = tmp_path / "work"
    work.mkdir()
    dry = run_cli("up", "--local", "--workload", "linear", "--procs", "2",
                  "--arg", "max_steps=2", "--dry-run", "--format", "shell", "--run-id", "byhand",
                  "--runs-dir", "runs", cwd=str(work))
    assert dry.returncode == 0, dry.stderr
    here, nodes, after = sections(dry.stdout)
    assert len(here) == 2 and list(nodes) == [0] and after == []
    env = user_path(tmp_path)
    run_here(here, work, env)
    run_here(nodes[0], "/", env)
    result = json.loads((work / "runs" / "byhand" / "node-0" / "result.json").read_text())
    assert result["world_size"] == 2 and result["timing"]["steps"] == 2


@pytest.mark.live
@pytest.mark.parametrize("ssh_lab", [2], indirect=True)
def test_the_ssh_shell_dry_run_runs_on_two_lab_hosts(ssh_lab, tmp_path):
    """Two SSH lab hosts: this machine's lines (the bundle, sent over `ssh`
    to each node's run directory), then each node's line run on its host
    over ssh, both at once."""
    home = lab_home(ssh_lab, tmp_path)
    cluster = lab_cluster(ssh_lab, tmp_path, ["{host: node0, procs: 1}", "{host: node1, procs: 1}"],
                          "workload: {name: linear, args: {max_steps: 2}}\n", name="byhand")
    dry = run_cli("up", cluster, "--dry-run", "--format", "shell", "--run-id", "byhand",
                  env=home, cwd=str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    here, nodes, _after = sections(dry.stdout)
    config = os.path.join(home["HOME"], ".ssh", "config")
    env = user_path(tmp_path, config)
    run_here(here, tmp_path, env)
    done = run_gang([["ssh", "-F", config, f"node{k}", f"export MASTER_PORT={env['MASTER_PORT']}; {line}"]
                     for k in (0, 1) for line in nodes[k]], timeout=240)
    assert [code for code, _ in done] == [0, 0], done
    remote = tmp_path / "remote" / "runs" / "byhand"
    result = json.loads((remote / "node-0" / "result.json").read_text())
    assert result["world_size"] == 2 and result["timing"]["steps"] == 2
    assert (remote / "node-1" / "code" / "ddp_orch_shim.py").is_file()


@pytest.mark.live
@pytest.mark.parametrize("nodes", ["[{host: node1, procs: 1}, {host: node2, procs: 1}]",
                                   "{count: 2, procs: 1}"], ids=["pinned", "placed"])
def test_the_slurm_shell_dry_run_runs_in_an_allocation(slurm_lab, tmp_path, nodes):
    """The Slurm lab: the bundle unpacked into the shared run directory,
    then `salloc` with the job's options, its shell reading the rest of the
    lines (node 0's host name, one step per node, wait); nodes named in the
    file, or chosen by Slurm (each step then by its index)."""
    path = tmp_path / "byhand.yaml"
    path.write_text(f"name: byhand\nbackend: slurm\npython: {PYTHON}\nnodes: {nodes}\n"
                    "workload: {name: linear, args: {max_steps: 2}}\n")
    dry = run_cli("up", str(path), "--dry-run", "--format", "shell", "--run-id", "byhand",
                  "--runs-dir", str(tmp_path / "runs"), env=slurm_lab.env(), cwd=str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    here, nodes, after = sections(dry.stdout)
    cut = next(i for i, line in enumerate(here) if line.startswith("salloc "))
    env = {**slurm_lab.env(), **user_path(tmp_path), "SHELL": "/bin/sh"}
    run_here(here[:cut], tmp_path, env)
    rest = here[cut + 1:] + nodes[0] + nodes[1] + after
    done = subprocess.run(["sh", "-c", here[cut]], input="\n".join(rest) + "\n", cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout, done.stderr)
    result = json.loads((tmp_path / "runs" / "byhand" / "node-0" / "result.json").read_text())
    assert result["world_size"] == 2 and result["timing"]["steps"] == 2
    assert slurm_lab.wait_queue_empty() == []
