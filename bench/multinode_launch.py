#!/usr/bin/env python3
"""Multi-node launch overhead: `ddp-orch up` on 2 and 4 SSH lab hosts vs torchrun by hand.

``noop`` with one process per node, on real sshd hosts on 127.0.55.x (the
test lab, ``tests/labs/sshlab.py``), compared with "the floor": the very same
per-node torchrun command lines (taken from ``ddp-orch up FILE --dry-run
--format shell``: static rendezvous, same env, same flags) started by hand,
concurrently, with the system OpenSSH client, ``ssh -F <lab cfg> nodeK
'<line>'``, with a fresh free master port each rep (``MASTER_PORT``, which
the lines read). The code reaches the nodes once beforehand for the floor,
by the dry-run's own lines for this machine (``ddp-orch bundle``, then its
unpacking over ``ssh``), as someone launching by hand would have it;
ddp-orch uploads it on every run, which is part of its cost.

Target: ddp-orch/floor <= 1.05 at each host count (median wall time).
A third variant runs the same launch with ``network: {interface: off}``:
the difference is what choosing each node's interface costs (target:
<= 50 ms). A fourth asks every node for ``gpus: free:1`` (a CPU rehearsal)
with a ``printf`` stand-in ``nvidia-smi`` first on the hosts' PATH: the
difference, less the stand-in's own two runs, is what choosing and holding
GPUs costs ddp-orch (target: <= 50 ms).

    .venv/bin/python bench/multinode_launch.py [--reps 3] [--hosts 2,4]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (BASE_ENV, DDP_ORCH, ORCH_ENV, PYTHON, BenchError, compare, fmt_s,  # noqa: E402
                     footer, free_port, header, lab, median_columns, parser, print_table, ratio_range,
                     result_line, run, samples_table, tempdir)

TARGET = 1.05


# One idle, healthy GPU per host, each host's UUID its own (lab hosts share
# /tmp, where the GPU locks live): every field the agent asks for
# (``agent/node/gpus.GPU_FIELDS``, its health last), and nothing more; no
# processes, no remapped rows. ``tests/unit/orchestrator/test_bench_stand_ins.py``
# holds it to the agent's fields.
STAND_IN_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) set -- $SSH_CONNECTION
                 printf '0, GPU-bench-%s, 00000000:01:00.0, Stand-in GPU, 81559, 1, 0, Disabled, 550.54, 0, No, No, Default, 0x0000000000000000\\n' "$3";;
esac
"""


def stand_in_smi(root) -> str:
    """A directory whose ``nvidia-smi`` is the ``printf`` stand-in."""
    bin_dir = root / "smi"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(STAND_IN_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return str(bin_dir)


def cluster_file(root, n: int, interface: str = "auto", place: str = "procs: 1") -> str:
    nodes = "".join(f"  - {{host: node{k}, {place}}}\n" for k in range(n))
    path = root / f"noop{n}-{interface}-{place.split(':')[0]}.yaml"
    path.write_text(f"name: noop{n}\npython: {PYTHON}\nworkdir: {root / 'remote'}\n"
                    f"device: cpu\nnetwork: {{interface: {interface}}}\n"
                    f"nodes:\n{nodes}workload: {{name: noop}}\n")
    return str(path)


def floor_lines(cluster: str, env: dict, run_id: str, cwd) -> tuple[list[str], list[str]]:
    """ddp-orch's own shell lines for ``run_id`` (``--format shell``): those
    for this machine (the bundle, unpacked on every node) and each node's."""
    proc = subprocess.run([DDP_ORCH, "up", cluster, "--dry-run", "--format", "shell",
                           "--run-id", run_id], env=dict(BASE_ENV, **ORCH_ENV, **env), cwd=cwd,
                          capture_output=True, text=True, check=True)  # the tree's own plan
    here, nodes, current = [], [], None
    for line in proc.stdout.splitlines():
        if line.startswith("# node "):
            current = nodes
        elif line and not line.startswith("#"):
            (here if current is None else current).append(line)
    return here, nodes


def by_hand_env(root, ssh_config: str, env: dict) -> dict:
    """What the lines for this machine need of it: ``ddp-orch`` (this tree's)
    and an ``ssh`` that reads the lab's config, first on PATH."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {ssh_config} \"$@\"\n")
    (bin_dir / "ssh").chmod(0o755)
    path = f"{bin_dir}:{os.path.dirname(DDP_ORCH)}:{BASE_ENV['PATH']}"
    return dict(BASE_ENV, **ORCH_ENV, **env, PATH=path)


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=3)
    p.add_argument("--hosts", default="2,4", help="host counts (default 2,4)")
    args = p.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    header("multinode_launch: ddp-orch up (SSH lab, noop, 1 proc/node)  vs  "
           "torchrun by hand over ssh", args)
    with tempdir("bench-mn-", args.keep) as root, \
            lab(max(counts), root, (f"SetEnv PATH={stand_in_smi(root)}:/usr/bin:/bin",)) as L:
        counter = iter(range(10**6))
        timeline: dict[str, list[tuple]] = {}
        variants = {}
        for n in counts:
            cluster = cluster_file(root, n)
            floor_id = f"floor{n}"
            here, lines = floor_lines(cluster, L.env, floor_id, str(root))
            if len(lines) != n or len(here) != n + 1:
                raise BenchError(f"expected 1 + {n} lines for this machine and {n} node "
                                 f"lines, got {here} and {lines}")
            for line in here:  # the code, on the nodes once, as the lines put it there
                done = subprocess.run(["sh", "-c", line], cwd=str(root), capture_output=True,
                                      text=True, env=by_hand_env(root, L.ssh_config, L.env))
                if done.returncode != 0:
                    raise BenchError(f"`{line[:200]}` exited {done.returncode}: "
                                     f"{done.stderr[-500:]}")
            print(f"   floor line for node 0 of {n}: {lines[0][:160]}...")

            def ddp(n=n, cluster=cluster, label="ddp-orch") -> float:
                run_id = f"mn{n}-{next(counter)}"
                t0 = time.time()
                wall = run([DDP_ORCH, "up", cluster, "--runs-dir", str(root / "runs"),
                            "--run-id", run_id], env=L.env, cwd=str(root))
                result = json.loads((root / "runs" / run_id / "result.json").read_text())
                if result.get("world_size") != n:
                    raise BenchError(f"{run_id}: bad result {result}")
                remote = root / "remote" / "runs" / run_id
                sups = [json.loads((remote / f"node-{k}" / "supervisor.json").read_text())
                        for k in range(n)]
                t_started = max(s["started"] for s in sups)
                t_result = os.path.getmtime(remote / "node-0" / "result.json")
                t_exit = max(os.path.getmtime(remote / f"node-{k}" / "supervisor.json")
                             for k in range(n))
                timeline.setdefault(f"{label} {n} hosts", []).append(
                    (t_started - t0, t_result - t_started, t_exit - t_result, t0 + wall - t_exit))
                return wall

            def floor(n=n, lines=lines, floor_id=floor_id) -> float:
                i = next(counter)
                port = str(free_port(L.lab.hosts[0].addr))
                result = root / "remote" / "runs" / floor_id / "node-0" / "result.json"
                result.unlink(missing_ok=True)
                cmds = [f"export MASTER_PORT={port}; "
                        + line.replace(f"--rdzv-id {floor_id} ", f"--rdzv-id {floor_id}-{i} ")
                        for line in lines]
                t0 = time.time()
                tp = time.perf_counter()
                procs = [subprocess.Popen(["ssh", "-F", L.ssh_config, f"node{k}", cmd],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, env=BASE_ENV)
                         for k, cmd in enumerate(cmds)]
                errs = [p.communicate()[1] for p in procs]
                wall = time.perf_counter() - tp
                bad = [(k, p.returncode, e[-500:]) for k, (p, e) in enumerate(zip(procs, errs))
                       if p.returncode != 0]
                if bad:
                    raise BenchError(f"floor {n} hosts: {bad}")
                if json.loads(result.read_text()).get("world_size") != n:
                    raise BenchError("floor: bad result")
                t_result = os.path.getmtime(result)
                timeline.setdefault(f"floor {n} hosts", []).append(
                    (None, t_result - t0, None, t0 + wall - t_result))
                return wall

            variants[f"ddp-orch {n} hosts"] = ddp
            variants[f"floor {n} hosts"] = floor
            # The same launch with the per-node interface choice off (network:
            # {interface: off}): what the choice adds (target <= 50 ms).
            variants[f"no-ifname {n} hosts"] = lambda n=n: ddp(
                n, cluster_file(root, n, "off"), "no-ifname")
            # Every node's GPU chosen and held (gpus: free:1, the stand-in
            # nvidia-smi): what the choice adds (target <= 50 ms + the stand-in).
            variants[f"gpus {n} hosts"] = lambda n=n: ddp(
                n, cluster_file(root, n, place="gpus: 'free:1'"), "gpus")

        res = compare(variants, args.reps, args.warmup)
        print()
        samples_table([res[k] for k in variants])
        rows = [("VARIANT", "SPAWN->ALL TORCHRUNS", "->RESULT", "->ALL TORCHRUNS EXITED",
                 "->RETURNED"), *median_columns(timeline, 4)]
        print("\ntimeline, medians (file times; floor: spawn->result in column 3, "
              "result->returned in column 5):")
        print_table(rows)
        print()
        footer()
        for n in counts:
            a, b = res[f"ddp-orch {n} hosts"], res[f"floor {n} hosts"]
            print(f"{n} hosts: ddp-orch overhead {fmt_s(a.median - b.median)}; {ratio_range(a, b)}")
        from orchestrator.agent.node import netroute

        calls = []
        for _ in range(50):  # the node-side work itself, as a node agent does it
            t = time.perf_counter()
            netroute.route(L.lab.hosts[0].addr, 29500, remote_peers=True)
            calls.append(time.perf_counter() - t)
        print(f"the route op on a node: median {fmt_s(sorted(calls)[25])} of 50 calls "
              "(it rides the pipelined requests behind the agent's start)")
        for n in counts:
            a, b = res[f"ddp-orch {n} hosts"], res[f"no-ifname {n} hosts"]
            print(f"{n} hosts: the interface choice adds {fmt_s(a.median - b.median)} "
                  f"(target <= 50 ms); {ratio_range(a, b)}")
        smi = os.path.join(stand_in_smi(root), "nvidia-smi")
        runs = []
        for _ in range(50):  # the stand-in's own run: two queries per node, nodes at once
            t = time.perf_counter()
            subprocess.run([smi, "--query-gpu=index"], check=True, capture_output=True)
            subprocess.run([smi, "--query-compute-apps=pid"], check=True, capture_output=True)
            runs.append(time.perf_counter() - t)
        smi_s = sorted(runs)[25]
        from orchestrator.agent.node import gpuclaim
        from orchestrator.agent.node.holdings import Holdings

        claims = []
        os.environ["PATH"] = f"{os.path.dirname(smi)}:{os.environ['PATH']}"
        os.environ["SSH_CONNECTION"] = f"127.0.0.1 1 {L.lab.hosts[0].addr} 22"
        for i in range(50):  # the node-side work: look, choose, hold (then let go)
            t = time.perf_counter()
            held = Holdings()  # what a node's agent holds for its run
            answer = gpuclaim.claim("free:1", run_id=f"bench-claim-{i}", node_rank=0,
                                    busy_mib=1024, lock_dir=str(root / "locks"), holdings=held)
            claims.append(time.perf_counter() - t)
            held.release_gpus()
            if not answer["ok"]:
                raise BenchError(f"the gpus op on the stand-in: {answer}")
        claim_s = sorted(claims)[25]
        print(f"the gpus op on a node: median {fmt_s(claim_s)} of 50 calls, of which the "
              f"stand-in nvidia-smi's two runs {fmt_s(smi_s)}: ddp-orch's own "
              f"{fmt_s(claim_s - smi_s)} (target <= 50 ms; it rides the pipelined requests "
              "behind the agent's start)")
        for n in counts:
            a, b = res[f"gpus {n} hosts"], res[f"ddp-orch {n} hosts"]
            print(f"{n} hosts: choosing and holding GPUs adds {fmt_s(a.median - b.median)}, "
                  f"of which the stand-in nvidia-smi's own runs {fmt_s(smi_s)}: ddp-orch's "
                  f"own {fmt_s(a.median - b.median - smi_s)} (target <= 50 ms); "
                  f"{ratio_range(a, b)}")
        for n in counts:
            a, b = res[f"ddp-orch {n} hosts"], res[f"floor {n} hosts"]
            result_line(f"multinode_launch[{n} hosts]", a.median / b.median, TARGET,
                        f"ddp-orch {fmt_s(a.median)} vs floor {fmt_s(b.median)}")


if __name__ == "__main__":
    main()
