#!/usr/bin/env python3
"""Log relay under load: 200,000 lines from 2 nodes through `ddp-orch up` vs plain torchrun.

The workload is a user script, ``bench/chatty.py``: every rank writes
``--lines`` lines (default 100,000 per rank, 2 ranks: 200,000 in all), each
carrying its rank and a sequence number, flushed one by one.

The 2 nodes are 2 ``localhost`` nodes of a cluster file (procs 1 each).
Why not 2 SSH lab hosts: the relay under test (supervisor -> pipe ->
``NodeHandle._relay_output`` -> node log + console) is the same code for
both transports, and the baseline asked for is plain torchrun writing to a
file, without SSH; localhost nodes compare exactly that and keep the SSH
launch cost (bench/multinode_launch.py) out of this figure. ``--via ssh``
runs the same job on 2 lab hosts instead, against the same plain torchrun
commands started with the system ``ssh`` and their output streamed to local
files (the OpenSSH client doing the relay), to show what paramiko adds.

* ddp-orch: ``ddp-orch up chatty.yaml`` (default view), stdout to a file.
  Every rep checks that every line arrived, in each rank's order, in both
  the node logs under the run dir and stdout.
* plain: the two nodes' torchrun commands (``--nnodes 2``, static
  rendezvous, no --tee/--log-dir), each node's output to its own file.
* with ``--diagnose`` also: torchrun relaying the workers itself with
  ``--tee 3 --log-dir ... --log-line-prefix-template``, to files, no
  ddp-orch. That is how ddp-orch ran torchrun before its supervisor followed
  the workers' files itself (``--redirects 3``); it shows what torchrun's own
  tailer costs and how often it cuts lines in two.

Target: ddp-orch/plain <= 1.1 (median wall time).

    .venv/bin/python bench/log_relay.py [--reps 5] [--lines 100000] [--via local|ssh]
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (BASE_ENV, BENCH, DDP_ORCH, LAST, PYTHON, BenchError, compare,  # noqa: E402
                     fmt_s, footer, free_port, header, lab, parser, print_table, ratio_range,
                     result_line,
                     run, samples_table, tempdir)

TARGET = 1.1
LINE = re.compile(rb"^(?:\[node(\d+) \S+\] )?(?:\[rank(\d+)\]: )?(.*)$", re.S)
BODY = re.compile(rb"chatty rank=(\d+) (?:seq=(\d+) (.*)|done)$", re.S)
INNER_PREFIX = re.compile(rb"\[rank\d+\]: ")
PAYLOAD = None  # filled from chatty.py


def check_lines(path: str, lines_per_rank: int, ranks: set[int], *, node: int | None = None,
                prefixed: bool = True) -> tuple[str, int]:
    """Every rank's lines 0..N-1 present once, in order; (summary, split lines) or raises.

    A "split" line is one that torchrun's --tee tailer cut in two (only the
    ``--tee`` variant of ``--diagnose`` runs it; ddp-orch must show none): it read the
    log file while the worker's write of that line was half done, and wrote
    the two halves with the rank prefix in front of each, on one output line
    (``... seq=031457 ste[rank1]: p metrics ...``). Such a line is repaired
    (the inner prefix removed), counted, and then must be intact like the rest.
    """
    last = collections.defaultdict(lambda: -1)
    counts = collections.Counter()
    done = set()
    split = 0
    with open(path, "rb") as fh:
        for raw in fh:
            node_s, prefix_rank, body = LINE.match(raw.rstrip(b"\n")).groups()
            repaired = INNER_PREFIX.sub(b"", body)
            if b"chatty rank=" not in repaired:
                continue  # ddp-orch's own lines, torchrun's banner and warnings
            if repaired != body:
                body = repaired
                split += 1
            m = BODY.match(body)
            if not m:
                raise BenchError(f"{path}: mangled line {raw[:200]!r}")
            rank = int(m.group(1))
            if prefixed and (prefix_rank is None or int(prefix_rank) != rank):
                raise BenchError(f"{path}: rank prefix {prefix_rank} on a line of rank {rank}")
            if node is None and node_s is not None and int(node_s) != rank:
                raise BenchError(f"{path}: rank {rank}'s line relayed as node {node_s}")
            if m.group(2) is None:
                done.add(rank)
                continue
            seq = int(m.group(2))
            if m.group(3) != PAYLOAD:
                raise BenchError(f"{path}: rank {rank} seq {seq}: payload altered: {raw[:200]!r}")
            if seq != last[rank] + 1:
                raise BenchError(f"{path}: rank {rank}: seq {seq} after {last[rank]} "
                                 "(lost, duplicated or reordered)")
            last[rank] = seq
            counts[rank] += 1
    for rank in ranks:
        if counts[rank] != lines_per_rank or rank not in done:
            raise BenchError(f"{path}: rank {rank}: {counts[rank]} of {lines_per_rank} lines, "
                             f"done line {'seen' if rank in done else 'missing'}")
    extra = set(counts) - ranks
    if extra:
        raise BenchError(f"{path}: lines from unexpected ranks {extra}")
    return (f"{sum(counts.values())} lines in order" + (f", {split} split" if split else ""),
            split)


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=5)
    p.add_argument("--lines", type=int, default=100_000, help="lines per rank (2 ranks)")
    p.add_argument("--via", choices=("local", "ssh"), default="local",
                   help="2 localhost nodes (default) or 2 SSH lab hosts")
    p.add_argument("--diagnose", action="store_true",
                   help="also time torchrun relaying the workers itself (--tee 3, --log-dir, prefix)")
    args = p.parse_args()
    n_lines = args.lines
    global PAYLOAD
    sys.path.insert(0, BENCH)
    import chatty
    PAYLOAD = chatty.PAYLOAD.encode()
    header(f"log_relay ({args.via}): chatty.py, 2 nodes x 1 rank x {n_lines} lines, "
           "ddp-orch up  vs  plain torchrun to files", args)
    with tempdir("bench-relay-", args.keep) as root:
        # The script's directory is uploaded to every node: it holds the script alone.
        job = root / "job"
        job.mkdir()
        shutil.copy(os.path.join(BENCH, "chatty.py"), job / "chatty.py")
        with (lab(2, root) if args.via == "ssh" else _nolab()) as L:
            hosts = ["node0", "node1"] if L else ["localhost", "localhost"]
            cluster = job / "chatty.yaml"
            times = root / "times"
            times.mkdir()
            cluster.write_text(
                f"name: chatty\ndevice: cpu\npython: {PYTHON}\n"
                + (f"workdir: {root / 'remote'}\n" if L else "")  # localhost: in the run dir
                + f"env: {{CHATTY_TIMES: {times}}}\n"
                "nodes:\n" + "".join(f"  - {{host: {h}, procs: 1}}\n" for h in hosts)
                + f"workload: {{script: chatty.py, args: {{lines: {n_lines}}}}}\n")
            env = dict(L.env) if L else {}
            master = L.lab.hosts[0].addr if L else "127.0.0.1"
            counter = iter(range(10**6))
            checks: list[str] = []
            cpu: dict[str, list[float]] = {}
            splits: dict[str, list[int]] = collections.defaultdict(list)
            timeline: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)

            def note_times(name: str, tag: str, t0: float, wall: float) -> None:
                """spawn -> first rank starts writing -> last rank done -> command returned."""
                marks = [json.loads((times / f"{tag}-{k}.json").read_text()) for k in (0, 1)]
                start = min(m["start"] for m in marks)
                end = max(m["end"] for m in marks)
                timeline[name].append((start - t0, end - start, t0 + wall - end))

            def ddp() -> float:
                run_id = f"relay-{next(counter)}"
                out = root / f"{run_id}.stdout"
                t0 = time.time()
                with open(out, "wb") as fh:
                    wall = run([DDP_ORCH, "up", str(cluster), "--runs-dir", str(root / "runs"),
                                "--run-id", run_id], cwd=str(root), stdout=fh,
                               env=env)  # chatty.py names its times file after the run id
                note_times("ddp-orch up", run_id, t0, wall)
                cpu.setdefault("ddp-orch up", []).append(LAST["cpu"])
                rd = root / "runs" / run_id
                c = [check_lines(str(rd / f"node-{k}.log"), n_lines, {k}, node=k) for k in (0, 1)]
                c.append(check_lines(str(out), n_lines, {0, 1}))
                checks.append(f"{run_id}: node-0.log {c[0][0]}; node-1.log {c[1][0]}; "
                              f"stdout {c[2][0]}")
                splits["ddp-orch up (node logs)"].append(c[0][1] + c[1][1])
                splits["ddp-orch up (stdout)"].append(c[2][1])
                for f in [out, *rd.glob("node-*.log")]:
                    f.unlink()
                return wall

            def by_hand(name: str, extra_flags) -> float:
                i = next(counter)
                port = str(free_port(master))
                tag = f"{name}-{i}"
                t_wall0 = time.time()
                t0 = time.perf_counter()
                procs, files = [], []
                for k in (0, 1):
                    flags = extra_flags(i, k)
                    argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                            str(k), "--nproc-per-node", "1", "--master-addr", master,
                            "--master-port", port, "--rdzv-backend", "static", "--rdzv-id",
                            f"h{i}", "--max-restarts", "0", *flags,
                            str(job / "chatty.py"), "--lines", str(n_lines)]
                    f = open(root / f"{name}-{k}.txt", "wb")
                    files.append(f)
                    if L:
                        cmd = "cd {} && exec env CHATTY_TIMES={} CHATTY_TAG={} {}".format(
                            root, times, tag, " ".join(shlex_quote(a) for a in argv))
                        argv = ["ssh", "-F", L.ssh_config, f"node{k}", cmd]
                    procs.append(subprocess.Popen(argv, cwd=str(root), env=dict(
                        BASE_ENV, CHATTY_TIMES=str(times), CHATTY_TAG=tag),
                                                  stdin=subprocess.DEVNULL, stdout=f,
                                                  stderr=subprocess.STDOUT))
                codes = [pr.wait() for pr in procs]
                wall = time.perf_counter() - t0
                for f in files:
                    f.close()
                if any(codes):
                    raise BenchError(f"{name}: exit codes {codes}")
                note_times(name, tag, t_wall0, wall)
                splits[name].append(sum(
                    check_lines(str(root / f"{name}-{k}.txt"), n_lines, {k},
                                prefixed=bool(extra_flags(i, k)))[1] for k in (0, 1)))
                return wall

            plain_name = "plain torchrun" + (" over ssh" if L else "")
            variants = {"ddp-orch up": ddp,
                        plain_name: lambda: by_hand("plain", lambda i, k: [])}
            if args.diagnose:
                variants["torchrun --tee 3"] = lambda: by_hand(
                    "same", lambda i, k: ["--log-dir", str(root / f"same-logs-{i}-{k}"),
                                          "--tee", "3", "--log-line-prefix-template",
                                          "[rank${rank}]: "])
            res = compare(variants, args.reps, args.warmup)
            a, b = res["ddp-orch up"], res[plain_name]
            print()
            samples_table([b] + [res[k] for k in variants if k not in (a.name, b.name)] + [a],
                          baseline=b)
            print(f"ddp-orch overhead: {fmt_s(a.median - b.median)}; {ratio_range(a, b)}")
            if not L:
                print(f"CPU time of ddp-orch's whole process tree (controller, supervisors, "
                      f"torchruns, workers), median: {statistics.median(cpu['ddp-orch up']):.2f}s")
            if timeline:
                print("timeline, medians over all runs (worker times from chatty.py itself):")
                rows = [("VARIANT", "SPAWN->FIRST RANK WRITES", "WRITING (ALL RANKS)",
                         "LAST LINE WRITTEN->RETURNED")]
                for name, ts in timeline.items():
                    rows.append((name, *(fmt_s(statistics.median(t[j] for t in ts))
                                         for j in range(3))))
                print_table(rows)
                print("(WRITING grows when the relay cannot keep up: the pipes fill and the "
                      "workers block in write)")
            print("delivery checks (every rep):")
            for c in checks[-3:]:
                print(f"   {c}")
            print(f"   ... {len(checks)} ddp-orch runs checked: all lines, every rank in order, "
                  "in the node logs and on stdout")
            print("lines split in two by torchrun's --tee tailer (repaired before the checks), "
                  "per run: " + "; ".join(f"{k}: {v}" for k, v in splits.items()))
            print()
            footer()
            result_line(f"log_relay[{args.via}]", a.median / b.median, TARGET,
                        f"ddp-orch {fmt_s(a.median)} vs {plain_name} {fmt_s(b.median)}; "
                        f"{2 * n_lines} lines")


def shlex_quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


class _nolab:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
