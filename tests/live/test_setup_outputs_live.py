"""``setup:``, ``outputs:`` and ``prune`` on real runs (issue 21, items 4-7).

On the SSH lab (two sshd hosts on loopback) and on this machine, with a
small project written at test time: a training script, a
``requirements.txt`` naming a local wheel (there is no network), and a
``setup:`` that installs it with ``pip install --no-index --target deps``
on every node, which the ranks then import. Node 1's setup is the slower
one, so a rank that started before every node's setup was done would show.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import sys
import time
import zipfile

import pytest

from bounds import assert_gone_within, assert_stopped_at_once, teardowns
from conftest import run_cli
from labhome import lab_cluster, lab_home
from procscan import wait_gone

pytestmark = pytest.mark.live
# one rank a node: the barrier and the outputs are per node (a node's ranks
# are one torchrun's), and each rank more costs a torch import
TWO_NODES = ["{host: node0, procs: 1}", "{host: node1, procs: 1}"]

TRAIN = '''\
"""Imports what setup installed, records when each rank started, writes outputs."""
import json, os, sys, time
started = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "deps"))
rank = int(os.environ["RANK"])
with open(os.path.join(HERE, f"started-{rank}"), "w") as fh:
    fh.write(str(started))
try:
    from labdep import VALUE  # what setup installed
except ImportError:
    VALUE = None  # a run without setup
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
seen = torch.tensor([started], dtype=torch.float64)
everyone = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, seen)
if rank == 0:
    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.json"), "w") as fh:
        json.dump({"labdep": VALUE, "started": [float(t) for t in everyone]}, fh)
    with open(os.path.join(out, "plot.png"), "wb") as fh:
        fh.write(bytes(range(256)))
    os.symlink("/etc/hostname", os.path.join(out, "link"))
    if "--steps" in sys.argv:
        time.sleep(float(sys.argv[sys.argv.index("--steps") + 1]))
    if "--fail" in sys.argv:
        raise RuntimeError("planned failure after writing the outputs")
    with open(os.environ["DDP_ORCH_RESULT_FILE"], "w") as fh:
        json.dump({"world_size": dist.get_world_size(), "labdep": VALUE}, fh)
dist.destroy_process_group()
'''


def _wheel(path: str) -> None:
    """``labdep-1.0-py3-none-any.whl``, built by hand: a pure-Python wheel."""
    files = {"labdep/__init__.py": b'VALUE = "installed by setup"\n',
             "labdep-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: labdep\n"
                                              b"Version: 1.0\n",
             "labdep-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                           b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()) + "labdep-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("labdep-1.0.dist-info/RECORD", record)


def project(root) -> None:
    """``root/proj``: train.py, requirements.txt and the wheel it names."""
    proj = root / "proj"
    (proj / "wheels").mkdir(parents=True)
    (proj / "train.py").write_text(TRAIN)
    _wheel(str(proj / "wheels" / "labdep-1.0-py3-none-any.whl"))
    (proj / "requirements.txt").write_text("./wheels/labdep-1.0-py3-none-any.whl\n")


SETUP = f"""\
setup:
  - if [ "$DDP_ORCH_NODE_RANK" = 1 ]; then sleep 2; fi; echo "preparing node $DDP_ORCH_NODE_RANK in $PWD"
  - [python, -m, pip, install, --no-index, --no-deps, --disable-pip-version-check, --target, deps, -r, requirements.txt]
  - date +%s.%N > setup-stamp
setup_timeout: 120
"""
OUTPUTS = "outputs: [out/metrics.json, 'out/*.png', out/link, 'nothing/*']\n"


def lab_project(lab, tmp_path, name: str, *, args: str = "", extra: str = SETUP + OUTPUTS,
                nodes=TWO_NODES) -> tuple[dict, str]:
    project(tmp_path)
    workload = "workload: {script: proj/train.py" + (f", args: {args}" if args else "") + "}\n"
    return lab_home(lab, tmp_path), lab_cluster(lab, tmp_path, nodes, workload, extra=extra,
                                                name=name)


def cli(env, tmp_path, *args, timeout: float = 240):
    return run_cli(*args, "--runs-dir", str(tmp_path / "runs"), env=env, timeout=timeout)


def node_files(tmp_path, run_id: str, k: int, name: str) -> list[str]:
    return glob.glob(str(tmp_path / "remote" / "runs" / run_id / f"node-{k}" / "**" / name),
                     recursive=True)


def test_setup_installs_on_every_node_before_any_rank_and_outputs_come_home(ssh_lab, tmp_path):
    env, cluster = lab_project(ssh_lab, tmp_path, "setup-ok")
    result = cli(env, tmp_path, "up", cluster, "--run-id", "setup-ok")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert json.loads((tmp_path / "runs" / "setup-ok" / "result.json").read_text())["labdep"] \
        == "installed by setup"
    # each node's setup ran in its code root, streamed under its prefix and kept in its log
    for k in (0, 1):
        assert f"[node{k} node{k}] [setup]: preparing node {k} in " in result.stdout
        log = (tmp_path / "runs" / "setup-ok" / f"node-{k}.log").read_text()
        assert "[setup]: Successfully installed labdep-1.0" in log
        assert "ddp-orch: setup done in" in log
    # every rank started after every node's setup was done (node 1's took 2 s longer)
    stamps = [float(open(node_files(tmp_path, "setup-ok", k, "setup-stamp")[0]).read())
              for k in (0, 1)]
    metrics = json.loads((tmp_path / "runs" / "setup-ok" / "outputs" / "out" / "metrics.json")
                         .read_text())
    assert metrics["labdep"] == "installed by setup"
    assert min(metrics["started"]) > max(stamps), (metrics["started"], stamps)
    # and ddp-orch says the processes started then, not before setup ran
    said = [line for line in result.stdout.splitlines() if line.startswith("ddp-orch: ")]
    running = said.index(next(line for line in said if "running setup: on 2 node(s)" in line))
    assert said[running + 1:].count("ddp-orch: setup: done on every node; started 2 processes "
                                    "on 2 node(s)") == 1, said
    assert not any("started" in line for line in said[:running]), said
    # outputs: home from node 0's code root; the link refused, the unmatched glob named
    outputs = tmp_path / "runs" / "setup-ok" / "outputs"
    assert (outputs / "out" / "plot.png").read_bytes() == bytes(range(256))
    assert not os.path.lexists(outputs / "out" / "link")
    summary = result.stdout.split("run setup-ok: ")[1]
    size = (outputs / "out" / "metrics.json").stat().st_size + 256
    assert f"outputs: 2 file(s), {size} B in {outputs}/ (out/metrics.json, out/plot.png)" \
        in summary
    assert "refused: out/link: a symbolic link (never followed)" in summary
    assert "no match on node 0: nothing/*" in summary
    status = cli(env, tmp_path, "status", "setup-ok").stdout
    assert f"outputs: 2 file(s)" in status and str(outputs) in status
    logs = cli(env, tmp_path, "logs", "setup-ok")
    assert f"ddp-orch logs: outputs: 2 file(s)" in logs.stderr and str(outputs) in logs.stderr


def test_a_failing_setup_names_its_node_and_starts_no_rank(ssh_lab, tmp_path):
    extra = ('setup:\n  - echo checking\n  - test "$DDP_ORCH_NODE_RANK" != 1 || '
             '{ echo "no wheel here" >&2; exit 7; }; sleep 1\n' + OUTPUTS)
    env, cluster = lab_project(ssh_lab, tmp_path, "setup-bad", extra=extra)
    began = time.monotonic()
    result = cli(env, tmp_path, "up", cluster, "--run-id", "setup-bad", "--grace", "3")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert time.monotonic() - began < 60
    assert ("root cause: node 1 (node1): setup failed: `sh -c 'test \"$DDP_ORCH_NODE_RANK\" "
            "!= 1 || { echo \"no wheel here\" >&2; exit 7; }; sleep 1'` exited 7; "
            "last lines: no wheel here\n") in result.stdout, out
    assert "[rank" not in result.stdout
    for k in (0, 1):
        assert not node_files(tmp_path, "setup-bad", k, "started-*"), "a rank started"
    state = json.loads((tmp_path / "runs" / "setup-bad" / "state.json").read_text())
    assert [o["state"] for o in state["outcomes"]] == ["stopped", "failed"]
    # README: gone within the grace period (3 s here): node 0, waiting at the
    # barrier, is stopped at once after node 1's setup failed there
    node0, node1 = teardowns(tmp_path / "runs", "setup-bad")
    assert node1["reason"] == "setup failed", node1
    assert_stopped_at_once(node0, node1["torn_down_at"], "stopped: node 1 (node1) failed (exit 7)")
    assert_gone_within([node0], node1["torn_down_at"], 3)
    assert wait_gone("setup-bad", 10, labs=[ssh_lab]) == set()

    # kept by the nodes' keepers, with restarts to spare: the same, and no restart
    kept = cli(env, tmp_path, "up", cluster, "--run-id", "setup-bad-kept", "--grace", "3",
               "--max-restarts", "2")
    assert kept.returncode == 1, kept.stdout + kept.stderr
    assert "root cause: node 1 (node1): setup failed: " in kept.stdout
    assert "no restart: node 1's setup failed; setup runs once per run" in kept.stdout
    assert "attempt 1" not in kept.stdout and "[rank" not in kept.stdout
    for k in (0, 1):
        assert not node_files(tmp_path, "setup-bad-kept", k, "started-*"), "a rank started"
    node0, node1 = teardowns(tmp_path / "runs", "setup-bad-kept")
    assert node1["reason"] == "setup failed" and "node 1 failed" in node0["reason"], node0
    assert_gone_within([node0], node1["torn_down_at"], 3)
    assert wait_gone("setup-bad-kept", 10, labs=[ssh_lab]) == set()


def test_outputs_come_home_after_a_failure_and_on_attach_and_prune_spares_a_live_run(
        ssh_lab, tmp_path):
    """One test for what were two, whose runs were alike (no ``setup:``: not
    the subject; it took 2 s and two pip installs per run): the failed run
    whose outputs came home is the ended run ``prune`` removes (it was a
    run of its own, which is ended all the same), while a detached run,
    lingering 6 s so that ``prune`` finds it live, is spared and brings its
    outputs home on ``attach``. (Were test_outputs_come_home_after_a_failure_
    and_a_glob_that_escapes_is_refused and test_a_kept_run_brings_outputs_
    home_on_attach_and_prune_spares_it_while_live.) Both runs have a
    ``setup:`` with ``when_changed``, which costs them an ``echo``: the
    first runs it on both nodes, the second (its keepers) skips it, since
    requirements.txt, the command, env and python are unchanged."""
    count = tmp_path / "setup-count"  # outside every run directory, as a pip install's effect
    when_changed = (f"setup: {{commands: 'echo ran >> {count}', "
                    "when_changed: [requirements.txt]}\n")
    env, cluster = lab_project(ssh_lab, tmp_path, "out-fail", args="[--fail]",
                               extra=when_changed + OUTPUTS)
    result = cli(env, tmp_path, "up", cluster, "--run-id", "out-fail", "--grace", "3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "planned failure after writing the outputs" in result.stdout
    assert count.read_text() == "ran\nran\n"  # each node's setup ran: no stamp yet
    assert "ddp-orch: setup runs: no successful setup recorded here yet" in result.stdout
    metrics = tmp_path / "runs" / "out-fail" / "outputs" / "out" / "metrics.json"
    assert len(json.loads(metrics.read_text())["started"]) == 2  # every rank's
    assert "outputs: 2 file(s)" in result.stdout
    escaping = tmp_path / "escaping.yaml"
    escaping.write_text(open(cluster).read().replace("out/metrics.json", "../../*.json"))
    refused = cli(env, tmp_path, "up", str(escaping), "--dry-run")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "outputs[0]: '../../*.json' escapes the code root (..)" in refused.stderr

    kept = tmp_path / "kept.yaml"
    kept.write_text(open(cluster).read().replace("args: [--fail]", "args: [--steps, '6']"))
    started = cli(env, tmp_path, "up", str(kept), "--run-id", "kept-run", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    remote = tmp_path / "remote" / "runs"
    assert (remote / "out-fail" / "node-1").is_dir() and (remote / "kept-run" / "node-1").is_dir()

    pruned = cli(env, tmp_path, "prune")
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert "pruned out-fail: " in pruned.stdout and " on node 1 (node1)" in pruned.stdout
    assert "kept   kept-run: live" in pruned.stdout
    assert "freed " in pruned.stdout.splitlines()[-1]
    assert not (tmp_path / "runs" / "out-fail").exists()
    assert not (remote / "out-fail").exists()
    assert (remote / "kept-run" / "node-0").is_dir() and (tmp_path / "runs" / "kept-run").is_dir()

    attached = cli(env, tmp_path, "attach", "kept-run")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "outputs: 2 file(s)" in attached.stdout
    assert (tmp_path / "runs" / "kept-run" / "outputs" / "out" / "metrics.json").exists()
    assert count.read_text() == "ran\nran\n", "an unchanged setup ran again"
    for k in (0, 1):  # each node's keeper said so, in the node's stream
        stream = (remote / "kept-run" / f"node-{k}" / "agent.out").read_text()
        assert "ddp-orch: setup skipped: requirements.txt, commands, env and python unchanged " \
               "since " in stream, stream[:2000]
    again = cli(env, tmp_path, "prune", "kept-run", "--older-than", "1h")
    assert again.returncode == 1 and "within --older-than" in again.stdout
    gone = cli(env, tmp_path, "prune", "kept-run")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not (remote / "kept-run").exists() and not (tmp_path / "runs" / "kept-run").exists()


def test_setup_and_outputs_on_this_machine(tmp_path):
    project(tmp_path)
    cluster = tmp_path / "local.yaml"
    cluster.write_text(f"python: {sys.executable}\nnodes: [{{host: localhost, procs: 2}}]\n"
                       "workload: {script: proj/train.py}\n" + SETUP + OUTPUTS)
    result = run_cli("up", str(cluster), "--run-id", "local-setup", "--runs-dir",
                     str(tmp_path / "runs"), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[setup]: Successfully installed labdep-1.0" in result.stdout
    run = tmp_path / "runs" / "local-setup"
    assert json.loads((run / "outputs" / "out" / "metrics.json").read_text())["labdep"] \
        == "installed by setup"
    assert json.loads((run / "outputs.json").read_text())["refused"][0]["path"] == "out/link"


def test_setup_and_outputs_under_slurm(slurm_lab, tmp_path):
    """The same barrier held by the job's nodes (files in the shared run
    directory), and the outputs copied from it into the same outputs/."""
    project(tmp_path)
    cluster = tmp_path / "slurm.yaml"
    cluster.write_text(f"backend: slurm\npython: {sys.executable}\n"
                       "nodes: [{host: node1, procs: 1}, {host: node2, procs: 1}]\n"
                       "workload: {script: proj/train.py}\n" + SETUP + OUTPUTS)
    result = run_cli("up", str(cluster), "--run-id", "slurm-setup", "--runs-dir",
                     str(tmp_path / "runs"), "--grace", "3", env=slurm_lab.env(), timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "runs" / "slurm-setup"
    assert "[node1 node2] [setup]: preparing node 1 in " in result.stdout
    stamps = [float(open(glob.glob(str(run / f"node-{k}" / "**" / "setup-stamp"),
                                   recursive=True)[0]).read()) for k in (0, 1)]
    metrics = json.loads((run / "outputs" / "out" / "metrics.json").read_text())
    assert metrics["labdep"] == "installed by setup"
    assert min(metrics["started"]) > max(stamps), (metrics["started"], stamps)
    assert "refused: out/link: a symbolic link (never followed)" in result.stdout
    assert slurm_lab.wait_queue_empty() == []
