#!/usr/bin/env python3
"""Local launch overhead: `ddp-orch up --local --workload noop --procs 2` vs plain torchrun.

Both run the same script (``workloads.noop``: torch import, rendezvous, one
all_reduce, rank 0 writes its result) with 2 CPU processes on this machine:

* ddp-orch: ``ddp-orch up --local --workload noop --procs 2 --quiet --runs-dir TMP``
  (run dir, plan, port pick on the node, code bundle, supervisor, torchrun
  static rendezvous, relay, teardown, result fetch);
* plain:    ``python -m torch.distributed.run --standalone --nproc-per-node 2 -m workloads.noop``
  with PYTHONPATH=<repo>, DDP_ORCH_DEVICE=cpu, OMP_NUM_THREADS=1 and
  DDP_ORCH_RESULT_FILE=TMP/result.json (so rank 0 does the same work).

Target: ddp-orch/plain <= 1.05 (median wall time). Also checks, with
PYTHONPROFILEIMPORTTIME, that the controller process never imports torch.

    .venv/bin/python bench/local_launch.py [--reps 5]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (LAST, BASE_ENV, DDP_ORCH, ORCH_ENV, PYTHON, REPO, BenchError,  # noqa: E402
                     compare, fmt_s, footer, free_port, header, median_columns, parser, print_table,
                     ratio_range, result_line, run, samples_table, tempdir)

TARGET = 1.05


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=5)
    p.add_argument("--diagnose", action="store_true",
                   help="also time, alternating with the others, torchrun started by hand with "
                        "ddp-orch's exact argv and env (static rendezvous, --redirects 3, --log-dir, "
                        "line prefix): splits the overhead into torchrun flags vs ddp-orch itself")
    args = p.parse_args()
    header("local_launch: ddp-orch up --local noop x2  vs  torchrun --standalone noop x2", args)
    with tempdir("bench-local-", args.keep) as tmp:
        runs_dir = tmp / "runs"
        counter = iter(range(10**6))
        # Per rep, a timeline from file times: spawn -> torchrun started -> rank 0
        # wrote its result -> torchrun exited -> the command returned.
        phases: dict[str, list[tuple[float, ...]]] = {}
        cpu: dict[str, list[float]] = {}
        prelaunch: list[tuple[float, ...]] = []

        def ddp_orch() -> float:
            run_id = f"bench-local-{next(counter)}"
            t0 = time.time()
            wall = run([DDP_ORCH, "up", "--local", "--workload", "noop", "--procs", "2",
                        "--quiet", "--runs-dir", str(runs_dir), "--run-id", run_id], cwd=str(tmp))
            t_end = t0 + wall
            rd = runs_dir / run_id
            mt = lambda name: os.path.getmtime(rd / name)  # noqa: E731
            prelaunch.append((mt("cluster.yaml") - t0, mt("bundle.tar.gz") - mt("cluster.yaml"),
                              json.loads((rd / "node-0" / "supervisor.json").read_text())["started"]
                              - mt("bundle.tar.gz")))
            result = json.loads((rd / "result.json").read_text())
            if result.get("world_size") != 2:
                raise BenchError(f"ddp-orch run {run_id}: unexpected result {result}")
            sup = json.loads((rd / "node-0" / "supervisor.json").read_text())
            t_result = os.path.getmtime(rd / "node-0" / "result.json")
            t_tr_exit = os.path.getmtime(rd / "node-0" / "supervisor.json")
            cpu.setdefault("ddp-orch up --local", []).append(LAST["cpu"])
            phases.setdefault("ddp-orch up --local", []).append(
                (sup["started"] - t0, t_result - sup["started"], t_tr_exit - t_result,
                 t_end - t_tr_exit))
            return wall

        def plain() -> float:
            out = tmp / "plain-result.json"
            out.unlink(missing_ok=True)
            t0 = time.time()
            wall = run([PYTHON, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "workloads.noop"], cwd=str(tmp),
                       env={"PYTHONPATH": REPO, "DDP_ORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
                            "DDP_ORCH_RESULT_FILE": str(out)})
            if json.loads(out.read_text()).get("world_size") != 2:
                raise BenchError("plain torchrun: unexpected result")
            cpu.setdefault("plain torchrun", []).append(LAST["cpu"])
            phases.setdefault("plain torchrun", []).append(
                (0.0, os.path.getmtime(out) - t0, None, t0 + wall - os.path.getmtime(out)))
            return wall

        def same_argv() -> float:
            """torchrun by hand with the argv and env ddp-orch gives it (see plan.json)."""
            n = next(counter)
            out = tmp / "same-result.json"
            out.unlink(missing_ok=True)
            t0 = time.time()
            wall = run([PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
                        "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(free_port()), "--rdzv-backend", "static",
                        "--rdzv-id", f"same-{n}", "--max-restarts", "0",
                        "--log-dir", str(tmp / f"same-logs-{n}"), "--redirects", "3",
                        "-m", "workloads.noop"],
                       cwd=str(tmp),
                       env={"PYTHONPATH": REPO, "DDP_ORCH_DEVICE": "cpu", "DDP_ORCH_RESULT_FILE": str(out),
                            "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
                            "DDP_ORCH_RUN_ID": f"same-{n}", "DDP_ORCH_NODE_RANK": "0"})
            cpu.setdefault("torchrun, ddp-orch's argv", []).append(LAST["cpu"])
            phases.setdefault("torchrun, ddp-orch's argv", []).append(
                (0.0, os.path.getmtime(out) - t0, None, t0 + wall - os.path.getmtime(out)))
            return wall

        variants = {"ddp-orch up --local": ddp_orch, "plain torchrun": plain}
        if args.diagnose:
            variants["torchrun, ddp-orch's argv"] = same_argv
        res = compare(variants, args.reps, args.warmup)
        a, b = res["ddp-orch up --local"], res["plain torchrun"]
        print()
        samples_table([b] + [res[k] for k in variants if k not in (a.name, b.name)] + [a],
                      baseline=b)
        print(f"ddp-orch overhead: {fmt_s(a.median - b.median)} (median difference); "
              + ratio_range(a, b))
        print("\ntimeline, medians over the measured reps and the warm-up (from file times):")
        print_table([("VARIANT", "SPAWN->TORCHRUN", "->RESULT WRITTEN", "->TORCHRUN EXIT",
                      "->RETURNED"), *median_columns(phases, 4)])
        print("(plain variants: SPAWN->RESULT in the 2nd column, RESULT->RETURNED in the 4th)")
        print("ddp-orch before torchrun starts, medians: " + ", ".join(
            f"{label} {fmt_s(statistics.median(p[i] for p in prelaunch))}" for i, label in enumerate(
                ["controller start+imports+load (spawn->run dir)",
                 "code bundle (->bundle.tar.gz)",
                 "agent start, run dir, upload, port, supervisor, unpack (->torchrun spawned)"])))
        print("CPU time (user+sys) of the whole process tree, median: " + "; ".join(
            f"{k} {statistics.median(v):.2f}s" for k, v in cpu.items())
            + " (less sensitive to the other jobs on the box than wall time)")

        # The controller must not import torch (its children do, through torchrun).
        env = dict(BASE_ENV, **ORCH_ENV, PYTHONPROFILEIMPORTTIME="1")
        proc = subprocess.run([DDP_ORCH, "up", "--local", "--workload", "noop", "--procs", "2",
                               "--quiet", "--runs-dir", str(runs_dir), "--run-id", "bench-imports"],
                              cwd=str(tmp), env=env, capture_output=True, text=True, timeout=600)
        mods = [m.group(1) for m in re.finditer(r"^import time:.*\|\s+(\S+)$", proc.stderr, re.M)]
        torch_mods = [m for m in mods if m == "torch" or m.startswith("torch.")]
        print(f"controller (`up --local`) imported {len(mods)} modules; torch among them: "
              f"{'YES' if torch_mods else 'no'}; paramiko: "
              f"{'yes' if 'paramiko' in mods else 'no'} (exit {proc.returncode})")
        print()
        footer()
        result_line("local_launch", a.median / b.median, TARGET,
                    f"ddp-orch {fmt_s(a.median)} vs plain torchrun {fmt_s(b.median)}")


if __name__ == "__main__":
    main()
