"""GPUs on shared machines, live on the SSH lab with the stand-in nvidia-smi
(``tests/labs/fakesmi.py``): what ``free:N`` chooses on each node, busy and
held GPUs refused before any rank starts, ``--allow-busy-gpus`` and
``--wait-gpus``, the locks held for a run's life and let go however it
ends, a failing or missing nvidia-smi, ``device: auto`` on a torch that sees
no GPU, the mixed-models warning and ``check``'s GPU table.

Every run here is a CPU rehearsal (``device: cpu``: each chosen index one
CPU process), except the ``device: auto`` refusal. One lab and one stand-in
serve the whole module: each test sets the GPUs it needs first. The locks
are the real ones (``/tmp/ddp-orch-gpus``), keyed by the stand-in's UUIDs,
which are unique to it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli, start_cli, wait_for_lines
from fakesmi import fake_nvidia_smi, set_state, ssh_lab_path_line
from labhome import lab_cluster, lab_home
from procscan import environ_of, wait_gone, workers
from sshlab import SshLab, _require_sshd

from orchestrator.agent.node import gpulocks

pytestmark = pytest.mark.live
PROGRAMS = os.path.join(ROOT, "tests", "programs")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
NOOP = "workload: {name: noop}\n"
SLEEPER = "workload: {script: sleeper.py}\n"
CPU = "device: cpu\n"
EXIT_REFUSED = 2
# setpriv's words for a second user that may read what root's interpreter needs
READ_ANYWHERE = ("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")


class Gpus:
    """The module's lab, its home for the CLI and the stand-in's directory."""

    def __init__(self, lab: SshLab, root, smi: str):
        self.lab, self.root, self.smi = lab, root, smi
        self.env = lab_home(lab, root)
        self.addr = [h.addr for h in lab.hosts]
        shutil.copy(os.path.join(PROGRAMS, "sleeper.py"), root)

    def set(self, node0: list[dict], node1: list[dict] | None = None, **kwargs) -> dict:
        """Node 0's GPUs (and node 1's); the state written, with UUIDs."""
        hosts = {self.addr[0]: node0, self.addr[1]: node1 if node1 is not None else []}
        return set_state(self.smi, hosts, **kwargs)

    def uuids(self, written: dict, node: int) -> list[str]:
        return [g["uuid"] for g in written["hosts"][self.addr[node]]["gpus"]]

    def cluster(self, name: str, nodes: list[str], workload: str = NOOP, extra: str = CPU) -> str:
        return lab_cluster(self.lab, self.root, nodes, workload, extra=extra, name=name)

    def up(self, cluster: str, run_id: str, *extra: str, timeout: float = 180):
        return run_cli("up", cluster, "--run-id", run_id, "--runs-dir", self.runs, "--grace", "3",
                       *extra, env=self.env, timeout=timeout)

    def start(self, cluster: str, run_id: str, *extra: str) -> subprocess.Popen:
        return start_cli("up", cluster, "--run-id", run_id, "--runs-dir", self.runs, "--grace",
                         "3", *extra, env=self.env)

    @property
    def runs(self) -> str:
        return str(self.root / "runs")

    def plan(self, run_id: str) -> dict:
        return json.loads((self.root / "runs" / run_id / "plan.json").read_text())

    def result(self, run_id: str) -> dict:
        return json.loads((self.root / "runs" / run_id / "result.json").read_text())


@pytest.fixture(scope="module")
def gpus_lab(tmp_path_factory):
    _require_sshd()
    root = tmp_path_factory.mktemp("gpus")
    smi = fake_nvidia_smi(root.parent / f"{root.name}-smi", [])
    with SshLab(2, extra_sshd=[ssh_lab_path_line(smi)]) as lab:
        yield Gpus(lab, root, smi)


@pytest.fixture
def busy_pids():
    """Real processes for the stand-in to list on GPUs (``busy_pids(n)``);
    each is killed after the test."""
    procs: list[subprocess.Popen] = []

    def make(n: int) -> list[int]:
        new = [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
        procs.extend(new)
        return [p.pid for p in new]

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()


def idle(n: int, name: str = H100, **extra) -> list[dict]:
    return [{"name": name, **extra} for _ in range(n)]


def wait_free(keys: list[str], timeout: float) -> dict:
    """``gpulocks.holders(keys)`` once every key is free, or as it stands
    after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        held = {k: who for k, who in gpulocks.holders(keys).items() if who is not None}
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


def stop(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Ctrl-C for a run started with ``Gpus.start``; its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=timeout)
    return out


# -- 1. the seed's layout, chosen by itself -----------------------------------

def test_free_n_chooses_the_seed_layout_on_busy_nodes(gpus_lab, busy_pids):
    """Node 0: 8 GPUs, 0-2 run other processes, 6-7 are full of another
    container's memory: free:3 gets 3,4,5. Node 1: 4 idle A100s, free:4
    gets 0-3. Seven ranks, each node's CUDA_VISIBLE_DEVICES the chosen
    indices, plan.json with what was asked and what was chosen, and the
    gang's mixed models said before any rank starts."""
    pids = busy_pids(3)
    node0 = idle(8)
    for k, pid in enumerate(pids):
        node0[k] = {"name": H100, "memory_used": 2000,
                    "processes": [{"pid": pid, "used_mib": 2000}]}
    node0[6] = {"name": H100, "memory_used": 5000}  # another container's: no process here
    node0[7] = {"name": H100, "memory_used": 1025}  # just over the 1024 MiB threshold
    node0[4] = {"name": H100, "memory_used": 1024}  # at the threshold: free
    written = gpus_lab.set(node0, idle(4, A100))
    cluster = gpus_lab.cluster("seed", ["{host: node0, gpus: 'free:3'}",
                                        "{host: node1, gpus: 'free:4'}"])
    ran = gpus_lab.up(cluster, "gpu-seed")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    res = gpus_lab.result("gpu-seed")
    assert res["world_size"] == 7
    table = sorted(res["rank_table"], key=lambda r: r["rank"])
    assert [(r["node_rank"], r["local_rank"]) for r in table] == \
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [r["cuda_visible_devices"] for r in table] == ["3,4,5"] * 3 + ["0,1,2,3"] * 4
    assert {r["cuda_device_order"] for r in table} == {"PCI_BUS_ID"}
    plan = gpus_lab.plan("gpu-seed")
    nodes = plan["nodes"]
    assert [n["gpus"] for n in nodes] == [[3, 4, 5], [0, 1, 2, 3]]
    assert [n["gpu_request"] for n in nodes] == ["free:3", "free:4"]
    uuids0, uuids1 = gpus_lab.uuids(written, 0), gpus_lab.uuids(written, 1)
    assert nodes[0]["gpu_uuids"] == uuids0[3:6] and nodes[1]["gpu_uuids"] == uuids1
    assert nodes[0]["gpu_models"] == [H100] * 3 and nodes[1]["gpu_models"] == [A100] * 4
    ranks = sorted(plan["ranks"], key=lambda r: r["rank"])
    assert [(r["gpu"], r["gpu_uuid"]) for r in ranks] == \
        list(zip([3, 4, 5, 0, 1, 2, 3], uuids0[3:6] + uuids1))
    warning = next(line for line in out.splitlines() if "warning: mixed GPU models:" in line)
    assert f"4x {A100}" in warning and f"3x {H100}" in warning
    # said once, before the start, and again in the summary
    assert out.index("ddp-orch: warning: mixed GPU models:") < out.index("started 7 processes")
    assert f"node 0 (node0): GPUs 3,4,5 (free:3), 3x {H100}" in ran.stdout
    assert f"node 1 (node1): GPUs 0,1,2,3 (free:4), 4x {A100}" in ran.stdout
    assert wait_free(uuids0 + uuids1, 15) == {}


def test_the_dry_run_says_chosen_at_launch_and_asks_no_node(gpus_lab):
    """Every nvidia-smi of the lab would hang: a dry-run that asked one would
    not return."""
    gpus_lab.set(idle(4), idle(4), hang=True)
    cluster = gpus_lab.cluster("dry", ["{host: node0, gpus: 'free:3'}",
                                       "{host: node1, gpus: free}"])
    ran = run_cli("up", cluster, "--dry-run", env=gpus_lab.env, timeout=30)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "free:3: chosen at launch" in ran.stdout and "free: chosen at launch" in ran.stdout


def test_free_and_all_the_dry_run_says_what_it_cannot_know_and_up_says_where_ranks_went(
        gpus_lab):
    """Issue #45, a newcomer's first file: free:3 on node 0, all on node 1.
    The dry-run shows free:3's 3 processes, all's as chosen at launch (it
    showed --nproc-per-node 0) and each rank's threads in words; ``up
    --quiet`` says which ranks went to which node and GPUs once, before any
    other line (it was only in plan.json and status); each rank's threads
    are its node's cores over its ranks; and ``top --once`` on the ended run
    gives its end and its mean rates (it said "gang: no rate yet")."""
    shutil.copy(os.path.join(PROGRAMS, "paced_ranks.py"), gpus_lab.root)
    gpus_lab.set(idle(4), idle(2, A100))
    cluster = gpus_lab.cluster(
        "first", ["{host: node0, gpus: 'free:3'}", "{host: node1, gpus: all}"],
        "workload: {script: paced_ranks.py, args: [--mode, free, --seconds, '6', --slow-rank, "
        "'-1', --compute, '0.1']}\n")
    dry = run_cli("up", cluster, "--dry-run", env=gpus_lab.env, timeout=60)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    commands = [line for line in dry.stdout.splitlines() if "torch.distributed.run" in line]
    assert " --node-rank 0 --nproc-per-node 3 --master-addr " in commands[0], commands
    assert " --node-rank 1 --nproc-per-node <chosen at launch> --master-addr " in commands[1]
    assert dry.stdout.count("\n    OMP_NUM_THREADS=<cores / ranks, at launch>\n") == 2

    ran = gpus_lab.up(cluster, "gpu-first", "--quiet")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[:3] == [
        f"ddp-orch: ranks 0-2: node 0 (node0), GPUs 0,1,2 (free:3), 3x {H100}, as CPU processes",
        f"ddp-orch: ranks 3-4: node 1 (node1), GPUs 0,1 (all), 2x {A100}, as CPU processes",
        f"ddp-orch: started 5 processes on 2 node(s); logs in {gpus_lab.runs}/gpu-first"], lines
    assert ran.stdout.count("ddp-orch: ranks ") == 2
    cores = len(os.sched_getaffinity(0))  # the lab's hosts are this machine
    assert [n["env"]["OMP_NUM_THREADS"] for n in gpus_lab.plan("gpu-first")["nodes"]] == \
        [str(max(1, cores // 3)), str(max(1, cores // 2))]

    top = run_cli("top", "gpu-first", "--once", "--runs-dir", gpus_lab.runs, env=gpus_lab.env)
    assert top.returncode == 0, top.stdout + top.stderr
    assert re.search(r"^gang: [0-9.]+ steps/s, mean over the run$", top.stdout, re.M), top.stdout
    state = json.loads((gpus_lab.root / "runs" / "gpu-first" / "state.json").read_text())
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["ended"]))
    assert top.stdout.endswith(f"ended {when}: succeeded\n"), top.stdout
    frame = json.loads(run_cli("top", "gpu-first", "--once", "--json", "--runs-dir",
                               gpus_lab.runs, env=gpus_lab.env).stdout)
    assert (frame["rates"], frame["ended_at"], len(frame["ranks"])) == ("mean", state["ended"], 5)
    assert all(r["steps_per_s"] > 0 and r["step"] > 0 for r in frame["ranks"]), frame


def test_gpus_held_on_two_nodes_are_refused_naming_both_and_a_wait_says_each_briefly(gpus_lab):
    """Issue #45: a refusal for GPUs held on two nodes named only the first;
    a wait printed about 600 characters a node every 30 s and nothing when
    it ended. Now each node is named once, at its line, one hint says what
    to do about both, a wait says in one short line per node what it waits
    for and who holds it, and its end is said."""
    gpus_lab.set(idle(2), idle(1))
    holder = gpus_lab.cluster("holder", ["{host: node0, gpus: 'free:1'}",
                                         "{host: node1, gpus: 'free:1'}"], SLEEPER)
    both = gpus_lab.cluster("both", ["{host: node0, gpus: all}", "{host: node1, gpus: '0'}"])
    hold = gpus_lab.start(holder, "gpu-h")
    waiter = None
    try:
        wait_for_lines(hold, "training", 2)
        refused = gpus_lab.up(both, "gpu-both", timeout=120)
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        err = refused.stderr.splitlines()
        assert err[0].startswith(f"ddp-orch: error: {both}:6: nodes[0].gpus: node 0 (node0): "
                                 f"GPU 0 ({H100}) is held by run gpu-h of root since "), err
        assert err[0].endswith("; free now: 1"), err
        assert err[1].startswith(f"  {both}:7: nodes[1].gpus: node 1 (node1): GPU 0 ({H100}) "
                                 "is held by run gpu-h of root since "), err
        assert err[1].endswith("; none free now"), err
        assert err[2:] == ['  hint: launch on those now (node 0: gpus: "1") or wait for them '
                           "(--wait-gpus SECONDS)"], err
        assert wait_gone("gpu-both", 15, labs=[gpus_lab.lab]) == set()

        waiter = gpus_lab.start(both, "gpu-both2", "--wait-gpus", "90")
        said = wait_for_lines(waiter, "waiting for", 2).splitlines()
        waits = sorted(line for line in said if "waiting for" in line)
        assert waits == [
            "ddp-orch: node 0 (node0): waiting for all (free now: 1): GPU 0 held by run gpu-h "
            "of root; up to 1m30s more",
            "ddp-orch: node 1 (node1): waiting for GPU 0 (none free): GPU 0 held by run gpu-h "
            "of root; up to 1m30s more"], said
        assert all(len(line) < 120 for line in waits)
        stop(hold)
        out = waiter.communicate(timeout=120)[0]
        assert waiter.returncode == 0, out
        assert re.search(r"^ddp-orch: GPUs free after \d+s on node 0 \(node0\), \d+s on node 1 "
                         r"\(node1\): starting$", out, re.M), out
    finally:
        for proc in (hold, waiter):
            if proc is not None:
                stop(proc)
    for run in ("gpu-h", "gpu-both", "gpu-both2"):
        assert wait_gone(run, 20, labs=[gpus_lab.lab]) == set()


# -- 2. a busy listed GPU ------------------------------------------------------

def test_a_busy_listed_gpu_is_refused_and_allow_busy_goes(gpus_lab, busy_pids):
    """Node 1's GPU 1 runs someone's process: refused before any rank starts,
    at node 1's line, naming the GPU, the pid and its user and what is free;
    node 0's GPUs, held while node 1 answered, are let go with the launch.
    ``--allow-busy-gpus`` then launches on them, and says so."""
    [pid] = busy_pids(1)
    written = gpus_lab.set(idle(2), idle(1) + [{"name": H100, "memory_used": 3000, "processes": [
        {"pid": pid, "used_mib": 3000, "name": "/usr/bin/python3"}]}] + idle(1))
    keys = gpus_lab.uuids(written, 0) + gpus_lab.uuids(written, 1)
    cluster = gpus_lab.cluster("busy", ["{host: node0, gpus: '0,1'}",
                                        "{host: node1, gpus: [0, 1]}"])
    refused = gpus_lab.up(cluster, "gpu-busy", timeout=120)
    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    err = refused.stderr
    assert ":7: nodes[1].gpus: node 1 (node1): GPU 1 (" in err, err
    assert f"is busy: pid {pid} /usr/bin/python3 (root, 3000 MiB)" in err, err
    assert "free now: 0,2" in err and 'launch on those now (gpus: "0,2")' in err, err
    assert "--allow-busy-gpus" in err and "Traceback" not in err
    assert "started" not in refused.stdout
    assert wait_gone("gpu-busy", 15, labs=[gpus_lab.lab]) == set()
    assert wait_free(keys, 10) == {}
    remote = gpus_lab.root / "remote" / "runs" / "gpu-busy"
    assert not remote.exists() or list(remote.iterdir()) == []

    went = gpus_lab.up(cluster, "gpu-busy2", "--allow-busy-gpus")
    out = went.stdout + went.stderr
    assert went.returncode == 0, out
    assert f"node 1 (node1): GPU 1 ({H100}) is busy, taken anyway: pid {pid}" in out
    assert "mixed GPU models" not in out  # one model in the gang
    assert [n["gpus"] for n in gpus_lab.plan("gpu-busy2")["nodes"]] == [[0, 1], [0, 1]]
    assert wait_free(keys, 15) == {}


# -- 3. runs side by side on one host -------------------------------------------

def test_two_runs_share_a_host_a_third_is_refused_then_waits(gpus_lab):
    """Node 0 has 3 idle GPUs with a little memory used on some: run A
    (free:2) takes the two least used, 1 and 2 (not the lowest indices);
    run B (free:1) the other one; run C (free:1) is refused, naming the
    holders, and so is GPU 1 listed with --allow-busy-gpus (held is not
    busy); C with --wait-gpus waits, saying so, and starts once A ends, on
    A's least used GPU; once every run is over no lock is held. (B held two
    of four GPUs before: one rank fewer, and two runs still share the host.)"""
    written = gpus_lab.set([{"memory_used": 600}, {"memory_used": 0},
                            {"memory_used": 10, "utilization": 5}])
    keys = gpus_lab.uuids(written, 0)
    pair = gpus_lab.cluster("pair", ["{host: node0, gpus: 'free:2'}"], SLEEPER)
    single = gpus_lab.cluster("single", ["{host: node0, gpus: 'free:1'}"], SLEEPER)
    one = gpus_lab.cluster("one", ["{host: node0, gpus: 'free:1'}"])
    a = gpus_lab.start(pair, "gpu-a")
    b = waiter = None
    try:
        wait_for_lines(a, "training", 2)
        assert gpus_lab.plan("gpu-a")["nodes"][0]["gpus"] == [1, 2]
        held = gpulocks.holders(keys)
        assert held[keys[1]]["run_id"] == held[keys[2]]["run_id"] == "gpu-a"
        assert held[keys[0]] is None
        seen = {rank: environ_of(pid) for rank, pid in workers("gpu-a", 0).items()}
        assert sorted(seen) == [0, 1]
        for env in seen.values():
            assert env["CUDA_VISIBLE_DEVICES"] == "1,2"
            assert env["DDP_ORCH_GPU_UUIDS"] == f"{keys[1]},{keys[2]}"
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"

        b = gpus_lab.start(single, "gpu-b")
        wait_for_lines(b, "training")
        assert gpus_lab.plan("gpu-b")["nodes"][0]["gpus"] == [0]
        assert {who["run_id"] for who in gpulocks.holders(keys).values()} == {"gpu-a", "gpu-b"}

        refused = gpus_lab.up(one, "gpu-c", timeout=120)
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        assert "nodes[0].gpus: node 0 (node0): free:1 asks for 1 free GPU; 0 are free" \
            in refused.stderr, refused.stderr
        assert f"GPU 1 ({H100}) is held by run gpu-a of root since " in refused.stderr
        assert f"GPU 0 ({H100}) is held by run gpu-b of root since " in refused.stderr
        assert "none free now" in refused.stderr and "--wait-gpus" in refused.stderr

        # --allow-busy-gpus goes on someone's process, never on another run's hold
        listed = gpus_lab.cluster("listed", ["{host: node0, gpus: '1'}"])
        forced = gpus_lab.up(listed, "gpu-c1", "--allow-busy-gpus", timeout=120)
        assert forced.returncode == EXIT_REFUSED, forced.stdout + forced.stderr
        assert f"GPU 1 ({H100}) is held by run gpu-a of root" in forced.stderr, forced.stderr

        waiter = gpus_lab.start(one, "gpu-c2", "--wait-gpus", "60")
        said = wait_for_lines(waiter, "waiting for")
        # issue #45: one short line, each holder once (it was ~600 characters, the
        # holder's whole record for every GPU)
        assert "ddp-orch: node 0 (node0): waiting for free:1 (none free): GPU 0 held by run " \
               "gpu-b of root; GPUs 1,2 held by run gpu-a of root; up to 1m00s more\n" in said, said
        time.sleep(3)  # it looks again, and still waits
        assert waiter.poll() is None and not (gpus_lab.root / "runs" / "gpu-c2" /
                                              "result.json").exists()
        stopped_at = time.time()
        stop(a)
        out = waiter.communicate(timeout=120)[0]
        assert waiter.returncode == 0, out
        # the end of the wait is said (issue #45: nothing said when it ended)
        assert re.search(r"^ddp-orch: GPUs free after \d+s on node 0 \(node0\): starting$", out,
                         re.M), out
        assert out.index("GPUs free after") < out.index("started 1 processes")
        assert gpus_lab.plan("gpu-c2")["nodes"][0]["gpus"] == [1]
        # ps: the wait apart from the run's own time, the two adding up to its end
        state = json.loads((gpus_lab.root / "runs" / "gpu-c2" / "state.json").read_text())
        assert stopped_at - state["started"] < state["waited_s"] < time.time() - state["started"]
        assert state["started"] + state["waited_s"] + state["wall_s"] == \
            pytest.approx(state["ended"], abs=3)
        listed_ps = run_cli("ps", "--runs-dir", gpus_lab.runs, env=gpus_lab.env)
        head, row = (line.split() for line in listed_ps.stdout.splitlines()
                     if line.startswith(("RUN ", "gpu-c2 ")))
        assert head[3:7] == ["STARTED", "WAITED", "DURATION", "NODES"], listed_ps.stdout
        assert (row[5], row[6]) == (f"{state['waited_s']:.1f}s", f"{state['wall_s']:.1f}s")
        assert gpulocks.holders([keys[1], keys[2]]) == {keys[1]: None, keys[2]: None}
        assert gpulocks.holders([keys[0]])[keys[0]]["run_id"] == "gpu-b"
    finally:
        for proc in (a, b, waiter):
            if proc is not None:
                stop(proc)
    for run in ("gpu-a", "gpu-b", "gpu-c", "gpu-c1", "gpu-c2"):
        assert wait_gone(run, 20, labs=[gpus_lab.lab]) == set()
    assert wait_free(keys, 10) == {}


def test_a_killed_supervisor_lets_go_of_its_gpus_once_its_run_is_gone(gpus_lab):
    """SIGKILL to node 0's supervisor: its guardian (which holds the locks
    too) ends the ranks, and the GPUs are free again within the bound, never
    while a rank of the run still lives (they ignore SIGTERM, so they live
    on for the grace period)."""
    written = gpus_lab.set(idle(2))
    keys = gpus_lab.uuids(written, 0)
    # stubborn ranks ignore SIGTERM: they outlive the kill by the grace period
    cluster = gpus_lab.cluster("kill", ["{host: node0, gpus: 'free:2'}"],
                               "workload: {script: sleeper.py, args: [--stubborn]}\n")
    proc = gpus_lab.start(cluster, "gpu-kill")
    try:
        wait_for_lines(proc, "training", 2)
        assert {who["run_id"] for who in gpulocks.holders(keys).values()} == {"gpu-kill"}
        state = gpus_lab.root / "remote" / "runs" / "gpu-kill" / "node-0" / "supervisor.json"
        os.kill(json.loads(state.read_text())["supervisor_pid"], signal.SIGKILL)
        killed = time.monotonic()
        while True:
            free = all(who is None for who in gpulocks.holders(keys).values())
            alive = workers("gpu-kill", 0)  # looked at after the locks
            assert not (free and alive), f"GPUs free while ranks {alive} still run"
            if free or time.monotonic() - killed > 30:
                break
            time.sleep(0.1)
        assert free, gpulocks.holders(keys)
        print(f"GPUs free {time.monotonic() - killed:.1f}s after the supervisor's SIGKILL")
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 1, out
    finally:
        stop(proc)
    assert wait_gone("gpu-kill", 20, labs=[gpus_lab.lab]) == set()


# -- 7. check's GPU table while a run holds a GPU --------------------------------

def test_check_shows_who_holds_and_uses_each_gpu(gpus_lab, busy_pids):
    """GPU 0 runs someone's process, GPU 1 is held by a running ddp-orch
    run: ``check`` says GPU 2 is what free:1 gets now, and its table names
    the process and the holding run, GPU by GPU."""
    [pid] = busy_pids(1)
    written = gpus_lab.set([{"memory_used": 2048, "processes": [{"pid": pid, "used_mib": 2048}]},
                            {}, {"memory_used": 100}])
    keys = gpus_lab.uuids(written, 0)
    holding = gpus_lab.start(gpus_lab.cluster("hold", ["{host: node0, gpus: 'free:1'}"], SLEEPER),
                             "gpu-hold")
    try:
        wait_for_lines(holding, "training")
        assert gpulocks.holders(keys)[keys[1]]["run_id"] == "gpu-hold"
        cluster = gpus_lab.cluster("look", ["{host: node0, gpus: 'free:1'}"])
        check = run_cli("check", cluster, env=gpus_lab.env, timeout=120)
        out = check.stdout + check.stderr
        assert check.returncode == 0 and "Traceback" not in out, out
        row = next(line for line in check.stdout.splitlines() if " gpus " in line)
        assert row.split()[2:4] == ["gpus", "ok"] and row.endswith("GPUs 2 (free:1) free now"), row
        lines = check.stdout.splitlines()
        head = next(k for k, line in enumerate(lines) if "HELD BY" in line and "STATE" in line)
        assert "node 0 (node0) GPUs" in lines[head - 1], out
        table = {line.split()[0]: line for line in lines[head + 1:head + 4]}
        assert sorted(table) == ["0", "1", "2"], out
        assert f"{pid} python (root, 2048 MiB)" in table["0"], out
        assert table["0"].rstrip().endswith("busy"), out
        assert "run gpu-hold of root since " in table["1"], out
        assert table["1"].rstrip().endswith("held"), out
        assert table["2"].rstrip().endswith("the run's"), out
        assert gpulocks.holders([keys[2]]) == {keys[2]: None}  # check held nothing
    finally:
        stop(holding)
    assert wait_gone("gpu-hold", 20, labs=[gpus_lab.lab]) == set()
    assert wait_free(keys, 10) == {}


# -- 5. a failing or missing nvidia-smi ------------------------------------------

def test_a_failing_nvidia_smi_is_named_with_what_it_said(gpus_lab):
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    written = gpus_lab.set(idle(2), {"gpus": idle(2), "fail": {"code": 9, "message": message}})
    cluster = gpus_lab.cluster("smifail", ["{host: node0, gpus: '0,1'}",
                                           "{host: node1, gpus: '0,1'}"])
    ran = gpus_lab.up(cluster, "gpu-smifail", timeout=120)
    assert ran.returncode == EXIT_REFUSED, ran.stdout + ran.stderr
    assert f"nodes[1].gpus: node 1 (node1): nvidia-smi failed: nvidia-smi --query-gpu: {message}" \
           f" (exit 9)" in ran.stderr, ran.stderr
    assert "run nvidia-smi on that node" in ran.stderr and "Traceback" not in ran.stderr
    assert wait_gone("gpu-smifail", 15, labs=[gpus_lab.lab]) == set()
    assert wait_free(gpus_lab.uuids(written, 0), 10) == {}


def test_without_nvidia_smi_a_list_goes_and_free_is_refused(gpus_lab):
    gpus_lab.set(idle(2), idle(2))
    script = os.path.join(gpus_lab.smi, "nvidia-smi")
    os.rename(script, script + ".away")
    try:
        free = gpus_lab.cluster("nosmi", ["{host: node0, gpus: '0'}",
                                          "{host: node1, gpus: 'free:2'}"])
        ran = gpus_lab.up(free, "gpu-nosmi", timeout=120)
        assert ran.returncode == EXIT_REFUSED, ran.stdout + ran.stderr
        assert ("nodes[1].gpus: node 1 (node1): gpus: free:2 needs nvidia-smi to see which GPUs "
                "there are and which are free, and it is not on this node's PATH") in ran.stderr
        assert "list the GPUs by index" in ran.stderr
        listed = gpus_lab.cluster("nosmi2", ["{host: node0, gpus: '1'}",
                                             "{host: node1, gpus: [0, 1]}"])
        went = gpus_lab.up(listed, "gpu-nosmi2")
        assert went.returncode == 0, went.stdout + went.stderr
        table = gpus_lab.result("gpu-nosmi2")["rank_table"]
        assert sorted((r["rank"], r["cuda_visible_devices"]) for r in table) == \
            [(0, "1"), (1, "0,1"), (2, "0,1")]
    finally:
        os.rename(script + ".away", script)


# -- 6. device: auto on a torch without a GPU --------------------------------------

def test_device_auto_on_a_torch_that_sees_no_gpu_is_refused(gpus_lab):
    written = gpus_lab.set(idle(2), idle(2))
    keys = gpus_lab.uuids(written, 0) + gpus_lab.uuids(written, 1)
    cluster = gpus_lab.cluster("auto", ["{host: node0, gpus: 'free:1'}",
                                        "{host: node1, gpus: '1'}"], extra="")
    ran = gpus_lab.up(cluster, "gpu-auto", timeout=180)
    assert ran.returncode == EXIT_REFUSED, ran.stdout + ran.stderr
    assert "nodes[0].gpus: node 0 (node0): device auto, but its torch " in ran.stderr, ran.stderr
    assert ("is built without CUDA" in ran.stderr or "sees no GPU" in ran.stderr)
    assert "device: cpu" in ran.stderr and "Traceback" not in ran.stderr
    assert "started" not in ran.stdout
    assert wait_gone("gpu-auto", 15, labs=[gpus_lab.lab]) == set()
    assert wait_free(keys, 10) == {}


def test_device_auto_is_decided_after_a_wait_from_the_answer_that_ended_it(gpus_lab, busy_pids):
    """``--wait-gpus`` with ``device: auto``: node 0's GPU is busy at first,
    so the launch waits; the answer that ends the wait must carry the node
    torch's view as the first one did, and the CPU-only torch of the lab is
    then refused as without a wait. (Before, only the first ``gpus`` reply
    carried it: the run went on, its ranks on the CPU while it held the GPU.)"""
    [pid] = busy_pids(1)
    busy = [{"name": H100, "memory_used": 3000, "processes": [{"pid": pid, "used_mib": 3000}]}]
    written = gpus_lab.set(busy, [])
    keys = gpus_lab.uuids(written, 0)
    cluster = gpus_lab.cluster("waitauto", ["{host: node0, gpus: '0'}"], extra="")
    proc = gpus_lab.start(cluster, "gpu-waitauto", "--wait-gpus", "90")
    try:
        said = wait_for_lines(proc, "waiting for GPU 0")
        assert "node 0 (node0)" in said, said
        gpus_lab.set(idle(1), [])
        out = proc.communicate(timeout=120)[0]
    finally:
        stop(proc)
    assert proc.returncode == EXIT_REFUSED, out
    assert "nodes[0].gpus: node 0 (node0): device auto, but its torch " in out, out
    assert "started" not in out and "Traceback" not in out
    assert wait_gone("gpu-waitauto", 15, labs=[gpus_lab.lab]) == set()
    assert wait_free(keys, 10) == {}


# -- 8. health, and an nvidia-smi that answers in part ------------------------------

def test_an_unfit_gpu_is_never_chosen_and_a_partial_nvidia_smi_keeps_the_rest(gpus_lab):
    """Node 0: GPU 0 has uncorrected ECC errors and no memory in use (the
    first ``free:1`` would have taken), GPU 1 prints ``[GPU requires reset]``,
    GPU 3 is off the bus (nvidia-smi exits 15); node 1's infoROM is
    corrupted (exit 14, its table printed). ``free:1`` gets GPU 2 and ``all``
    both of node 1's, each nvidia-smi warning said before the start; GPU 0
    listed is refused with what is wrong and what to do; ``check`` shows each
    GPU's health and where the locks live."""
    written = gpus_lab.set([{"name": H100, "ecc_errors": 2}, {"name": H100, "fault": "reset"},
                            {"name": H100, "memory_used": 200}, {"name": H100, "off_bus": True}],
                           [{"name": H100}, {"name": H100, "inforom": True}])
    keys = gpus_lab.uuids(written, 0) + gpus_lab.uuids(written, 1)
    cluster = gpus_lab.cluster("health", ["{host: node0, gpus: 'free:1'}",
                                          "{host: node1, gpus: all}"])
    ran = gpus_lab.up(cluster, "gpu-health")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    assert [n["gpus"] for n in gpus_lab.plan("gpu-health")["nodes"]] == [[2], [0, 1]]
    start = out.index("started 3 processes")
    off_bus = out.index("node 0 (node0): nvidia-smi: Unable to determine the device handle for "
                        "GPU00000000:1B:00.0: Unknown Error")
    inforom = out.index("node 1 (node1): nvidia-smi: WARNING: infoROM is corrupted at gpu "
                        "00000000:19:00.0")
    assert off_bus < start and inforom < start, out
    assert wait_free(keys, 15) == {}

    listed = gpus_lab.cluster("unfit", ["{host: node0, gpus: '0,2'}"])
    refused = gpus_lab.up(listed, "gpu-unfit", timeout=120)
    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    err = refused.stderr
    assert (f"nodes[0].gpus: node 0 (node0): GPU 0 ({H100}) is unfit: 2 uncorrected ECC errors "
            "since the driver loaded; free now: 2") in err, err
    assert "GPU 0: reset it once nothing runs on it (`sudo nvidia-smi -r -i 0`)" in err, err
    assert "gpu_policy: {ignore: [ecc]} takes such GPUs anyway" in err and "Traceback" not in err
    relaxed = gpus_lab.cluster("relaxed", ["{host: node0, gpus: '0,2'}"],
                               extra=CPU + "gpu_policy: {ignore: [ecc]}\n")
    went = gpus_lab.up(relaxed, "gpu-relaxed")
    assert went.returncode == 0, went.stdout + went.stderr
    assert wait_free(keys, 15) == {}

    check = run_cli("check", cluster, env=gpus_lab.env, timeout=120)
    print(check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith("node 0 (node0) GPUs"))
    assert lines[head].endswith(f"; locks in {gpulocks.lock_dir()}")
    assert lines[head + 1].split()[:5] == ["GPU", "MODEL", "MEMORY", "UTIL", "HEALTH"]
    rows = {line.split()[0]: line for line in lines[head + 2:head + 5]}
    assert "2 ECC errors" in rows["0"] and rows["0"].endswith("unfit")
    assert "needs reset" in rows["1"] and rows["1"].endswith("unfit")
    assert rows["2"].endswith("the run's")
    assert "  nvidia-smi: Unable to determine the device handle for GPU00000000:1B:00.0: " \
           "Unknown Error" in lines[head + 5:head + 8]
    for run in ("gpu-health", "gpu-unfit", "gpu-relaxed"):
        assert wait_gone(run, 20, labs=[gpus_lab.lab]) == set()


# -- 9. two Unix users' runs meet in the lock directory -------------------------------

def test_two_unix_users_runs_meet_in_the_lock_directory(gpus_lab, tmp_path_factory):
    """Root's run holds GPU 0 of this host; a run of another Unix user
    (``nobody``, started with setpriv) is refused it, naming root's run, and
    gets GPU 1 with ``free``; once root's run is over, ``nobody`` takes GPU 0.
    Both find the same lock directory by default (``/run/lock`` where it is
    world-writable and sticky), and a lock file root made is locked by nobody.
    (``nobody`` keeps CAP_DAC_READ_SEARCH, to read the suite's interpreter
    under root's home: reading only; every file it makes or locks is as uid
    65534.)"""
    import pwd
    import tempfile

    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a second Unix user")
    nobody = pwd.getpwnam("nobody")
    shared = tempfile.mkdtemp(prefix="ddp-orch-users-")  # every user reads it
    os.chmod(shared, 0o755)
    smi = fake_nvidia_smi(os.path.join(shared, "smi"), [])
    written = set_state(smi, [{"name": H100}, {"name": H100}])
    keys = [g["uuid"] for g in written["hosts"]["local"]["gpus"]]
    home = os.path.join(shared, "nobody")
    os.mkdir(home)
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    shutil.copy(os.path.join(PROGRAMS, "sleeper.py"), shared)
    path = {"PATH": smi + os.pathsep + os.environ["PATH"]}

    def as_nobody(run_id: str, gpus: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
             *READ_ANYWHERE, "env", f"HOME={home}", f"PATH={path['PATH']}", f"PYTHONPATH={ROOT}",
             "XDG_DATA_HOME=" + os.path.join(home, "xdg"), sys.executable, "-m", "orchestrator",
             "up", "--local", "--gpus", gpus, "--device", "cpu", "--workload", "noop",
             "--run-id", run_id, "--runs-dir", os.path.join(home, "runs"), "--grace", "3"],
            cwd=ROOT, capture_output=True, text=True, timeout=180)

    mine = os.path.join(shared, "root.yaml")
    with open(mine, "w", encoding="utf-8") as fh:
        fh.write("device: cpu\nnodes: [{host: localhost, gpus: '0'}]\n"
                 "workload: {script: sleeper.py}\n")
    root_run = start_cli("up", mine, "--run-id", "gpu-users-root", "--runs-dir",
                         str(gpus_lab.root / "runs"), "--grace", "3", env=path)
    try:
        wait_for_lines(root_run, "training")
        assert gpulocks.holders([keys[0]])[keys[0]]["user"] == "root"
        refused = as_nobody("gpu-users-nobody", "0")
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        assert f"GPU 0 ({H100}) is held by run gpu-users-root of root since" in refused.stderr
        beside = as_nobody("gpu-users-nobody2", "free")
        assert beside.returncode == 0, beside.stdout + beside.stderr
        assert "GPUs 1 (free)" in beside.stdout, beside.stdout
    finally:
        stop(root_run)
    after = as_nobody("gpu-users-nobody3", "0")
    assert after.returncode == 0, after.stdout + after.stderr
    lock = os.path.join(gpulocks.lock_dir(), gpulocks.safe_name(keys[0]))
    assert os.stat(lock).st_uid == 0  # root's file, locked by nobody in turn
    assert wait_free(keys, 10) == {}
    for run in ("gpu-users-root", "gpu-users-nobody", "gpu-users-nobody2", "gpu-users-nobody3"):
        assert wait_gone(run, 20) == set()
    shutil.rmtree(shared, ignore_errors=True)


# -- 10. the launch checks what check checks: the node's driver and its GPUs' kernels ----

def test_the_launch_refuses_a_driver_that_does_not_start_and_a_gpu_without_kernels(
        tmp_path_factory):
    """A lab host whose CUDA driver is a stand-in (``tests/labs/fakecuda.py``,
    the node agent's LD_LIBRARY_PATH): cuInit answers 999 (nvidia-uvm not
    loaded) and ``device: auto`` is refused with that fix, not "install a
    CUDA build of torch"; then a GPU of compute capability 6.1, for which
    the lab's torch has no kernel, is refused at launch from the same probe
    (no round trip more), and ``check`` fails its gpu-arch row."""
    from fakecuda import fake_libcuda

    _require_sshd()
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    root = tmp_path_factory.mktemp("driver")
    smi = fake_nvidia_smi(root.parent / f"{root.name}-smi", [{"name": H100}])
    cuda = fake_libcuda(root.parent / f"{root.name}-cuda", init=999)
    line = f"SetEnv PATH={smi}:/usr/local/bin:/usr/bin:/bin LD_LIBRARY_PATH={cuda}"
    with SshLab(1, extra_sshd=[line]) as lab:
        env = lab_home(lab, root)
        cluster = lab_cluster(lab, root, ["{host: node0, gpus: '0'}"], NOOP, name="driver")
        ran = run_cli("up", cluster, "--run-id", "gpu-driver", "--runs-dir", str(root / "runs"),
                      env=env, timeout=180)
        assert ran.returncode == EXIT_REFUSED, ran.stdout + ran.stderr
        assert ("node 0 (node0): device auto, but its torch 2.14.1+cu130 (CUDA 13.0) sees no GPU: "
                "its CUDA driver fails cuInit with 999 (CUDA_ERROR_UNKNOWN)") in ran.stderr, \
            ran.stderr
        assert "sudo modprobe nvidia-uvm" in ran.stderr
        assert "install a CUDA build of torch" not in ran.stderr

        fake_libcuda(cuda, caps=("6.1",), driver=13000)
        ran = run_cli("up", cluster, "--run-id", "gpu-arch", "--runs-dir", str(root / "runs"),
                      env=env, timeout=180)
        assert ran.returncode == EXIT_REFUSED, ran.stdout + ran.stderr
        assert "nodes[0].gpus: node 0 (node0): GPU 0's compute capability 6.1 has no kernel in " \
               "its torch (built for sm_75 " in ran.stderr, ran.stderr
        assert "install a torch built for sm_61 on node0" in ran.stderr
        assert "started" not in ran.stdout

        check = run_cli("check", cluster, env=env, timeout=120)
        print(check.stdout)
        assert check.returncode == 1, check.stdout + check.stderr
        row = next(line for line in check.stdout.splitlines() if " gpu-arch " in line)
        assert row.split()[2:4] == ["gpu-arch", "FAIL"], row
        for run in ("gpu-driver", "gpu-arch"):
            assert wait_gone(run, 20, labs=[lab]) == set()
