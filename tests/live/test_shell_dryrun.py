"""`up --dry-run --format shell` runs as printed: each line executed as it
stands, on this machine, on the SSH lab's hosts and in the Slurm lab's
allocation, starts the run by hand and it finishes with its result.

The only help the lines get is what a user's machine has: `ddp-orch` on
PATH (here a two-line wrapper around this tree's `python -m orchestrator`),
`ssh` reading the user's config (here the lab's, which OpenSSH would not
find through $HOME), and MASTER_PORT set to a free port, as the lines' own
header says to do when 29500 may be taken (other tests run beside these).

Golden: tests/golden/slurm.shell.txt is
    python -m orchestrator up tests/golden/slurm.yaml --dry-run --format shell \\
        --run-id slurm-golden --runs-dir /shared/runs
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT, TESTS, run_cli
from labhome import lab_cluster, lab_home
from orchestrator.engine.bundle import build_bundle

GOLDEN = os.path.join(TESTS, "golden")
PYTHON = sys.executable


def sections(text: str) -> tuple[list[str], dict[int, list[str]], list[str]]:
    """The commands of a shell dry-run: this machine's (before the first
    node), each node's, and those after the nodes (``wait``)."""
    here: list[str] = []
    nodes: dict[int, list[str]] = {}
    after: list[str] = []
    current = here
    for line in text.splitlines():
        node = re.match(r"# node (\d+)  ", line)
        if node:
            current = nodes.setdefault(int(node.group(1)), [])
        elif line.startswith("# every node's step"):
            current = after
        elif line and not line.startswith("#"):
            current.append(line)
    return here, nodes, after


def user_path(tmp_path, ssh_config: str | None = None) -> dict[str, str]:
    """PATH with `ddp-orch` (this tree's) and, for the SSH lab, an `ssh`
    that reads the lab's config; plus MASTER_PORT, a free port."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ddp-orch").write_text(
        f"#!/bin/sh\nPYTHONPATH={ROOT} exec {PYTHON} -m orchestrator \"$@\"\n")
    if ssh_config:
        (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {ssh_config} \"$@\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_PORT": str(port)}


def run_here(lines: list[str], cwd, env: dict[str, str]) -> None:
    """Each line in a fresh shell, one after the other, as typed."""
    for line in lines:
        done = subprocess.run(["sh", "-c", line], cwd=str(cwd), env={**os.environ, **env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stdout, done.stderr)


def test_the_slurm_shell_dry_run_matches_golden_word_for_word():
    result = run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--format", "shell",
                     "--run-id", "slurm-golden", "--runs-dir", "/shared/runs")
    assert result.returncode == 0, result.stderr
    with open(os.path.join(GOLDEN, "slurm.shell.txt"), encoding="utf-8") as fh:
        assert result.stdout == fh.read()


def test_every_format_shows_the_same_master_port(tmp_path):
    """auto in text and json; in the shell lines the one $MASTER_PORT, with
    its default stated, on every node's torchrun (never a made-up number)."""
    args = ("up", "--local", "--workload", "noop", "--procs", "2", "--dry-run", "--run-id", "p")
    text = run_cli(*args).stdout
    plan = json.loads(run_cli(*args, "--format", "json").stdout)
    shell = run_cli(*args, "--format", "shell", cwd=str(tmp_path)).stdout
    assert "master     127.0.0.1:auto (a free port on node 0, chosen at launch)" in text
    assert plan["master_port"] == "auto"
    assert shell.startswith("# p: world size 2, master 127.0.0.1:auto, backend local\n")
    assert "these\n# lines use $MASTER_PORT, 29500 unless you set it" in shell
    _here, nodes, _after = sections(shell)
    assert [line.count('--master-port "${MASTER_PORT:-29500}" ') for line in nodes[0]] == [1]
    assert list(tmp_path.iterdir()) == []  # the dry-run wrote nothing: the lines do, when run


def test_slurm_lines_agree_with_themselves():
    """The lines of a Slurm form, checked against each other: the bundle is
    written where each node's unpack reads it, every step runs inside the
    allocation, on the node its header names, and reaches the master
    address the allocation's shell exported, in its own code root."""
    result = run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--format", "shell",
                     "--run-id", "s", "--runs-dir", "/shared/runs")
    here, nodes, after = sections(result.stdout)
    bundle = "/shared/runs/s/bundle.tar.gz"
    assert here[0] == f"ddp-orch bundle --output {bundle} tests/golden/slurm.yaml"
    assert here[1:3] == [f"mkdir -p /shared/runs/s/node-{k} && tar -xzf {bundle} "
                         f"-C /shared/runs/s/node-{k}" for k in (0, 1)]
    assert here[3].startswith("salloc ") and "--nodelist=node1,node2" in here[3]
    assert here[4] == ('export MASTER_ADDR="$(srun --nodes=1 --ntasks=1 --nodelist=node1 '
                       'hostname < /dev/null)"')
    for k, host in ((0, "node1"), (1, "node2")):
        [line] = nodes[k]
        assert line.startswith(f"srun --nodes=1 --ntasks=1 --nodelist={host} sh -c 'cd "
                               f"/shared/runs/s/node-{k}/code && ")
        assert line.endswith("' < /dev/null &")
        assert '--master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}" ' in line
        assert f"--node-rank {k} " in line
    assert after == ["wait"]


def test_the_printed_bundle_command_writes_the_bundle_up_uploads(project, tmp_path_factory):
    """Your own program after --: the dry-run's `ddp-orch bundle` line, run
    as printed from the project, writes what `up` would upload (the
    built-ins, the shim, the project), the program's words kept after --."""
    dry = run_cli("up", "--local", "--procs", "2", "--dry-run", "--format", "shell",
                  "--run-id", "b", "--runs-dir", "runs", "--", "-m", "proj.train", "--out", "a b", cwd=str(project))
    here, _nodes, _after = sections(dry.stdout)
    assert here[0] == ("ddp-orch bundle --output runs/b/bundle.tar.gz --local --procs 2 -- "
                       "-m proj.train --out 'a b'")
    elsewhere = tmp_path_factory.mktemp("user")  # not in the project, which is uploaded
    run_here(here[:1], project, user_path(elsewhere))
    expected = elsewhere / "expected.tar.gz"
    build_bundle(str(expected), str(project))
    with tarfile.open(project / "runs" / "b" / "bundle.tar.gz") as got, \
            tarfile.open(expected) as want:
        names = got.getnames()
        assert names == want.getnames()
    assert {"code/ddp_orch_shim.py", "project/proj/train.py"} <= set(names)


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
    procs = [subprocess.Popen(["ssh", "-F", config, f"node{k}",
                               f"export MASTER_PORT={env['MASTER_PORT']}; {line}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in (0, 1) for line in nodes[k]]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
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
