"""Refused before launch what is knowable before launch (issue 22), and the
dry-run refuses exactly what ``up`` refuses: the same message, exit 2, and
no run recorded by either.

The command lines here never start a rank: each is refused first, so ``up``
without ``--dry-run`` is as fast as the dry-run.
"""

from __future__ import annotations

import os
import sys

import pytest

from conftest import ROOT, run_cli
from fakesmi import LOCAL, fake_smi


# 1. --device cuda with CPU processes: one rule for the file and the options -----------


# 2. workdir: that no node would use ------------------------------------------------


# 3. the dry-run refuses what up refuses, in the same words ----------------------------


# 5. a localhost node's GPUs: what check says, up says ------------------------------


@pytest.mark.live
def test_check_and_up_say_the_same_about_a_localhost_node_without_its_gpus(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"python: {sys.executable}\nnodes: [{{host: localhost, gpus: '0,1'}}]\n"
                    "workload: {name: noop}\n")
    env = {"PATH": fake_smi(tmp_path / "smi", 0) + os.pathsep + os.path.dirname(sys.executable)
           + os.pathsep + "/usr/bin:/bin"}
    check = run_cli("check", str(path), env=env)
    up = run_cli("up", str(path), "--runs-dir", str(tmp_path / "runs"), env=env)
    problem = "no GPU 1 on this node (nvidia-smi lists GPUs: 0)"
    assert check.returncode == 1
    row = next(line for line in check.stdout.splitlines() if " gpus " in line)
    assert "FAIL" in row.upper() and problem in row, check.stdout
    assert "set `device: cpu` for a CPU rehearsal" in row
    assert up.returncode == 2 and "nodes[0].gpus: node 0 (localhost) lists GPUs 0,1, but " \
        f"{problem}" in up.stderr, up.stderr
    assert "set `device: cpu` for a CPU rehearsal" in up.stderr


# the README's quick start, at a world size that divides no batch -------------------

@pytest.mark.live
def test_the_quick_start_runs_on_three_processes(tmp_path):
    result = run_cli(*LOCAL, "--workload", "linear", "--procs", "3", "--arg", "epochs=1",
                     "--runs-dir", str(tmp_path), cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert "SUCCEEDED" in result.stdout.upper()
