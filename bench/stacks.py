#!/usr/bin/env python3
"""How long `ddp-orch stacks` takes: 3 ranks on 2 hosts, and 16 ranks on 4 hosts.

A run of ``tests/programs/sleeper.py`` (every rank initialises gloo, prints
"training" and sleeps) is started with ``ddp-orch up`` on an SSH lab
(``tests/labs/sshlab.py``); once every rank is up, ``ddp-orch stacks RUN`` is
timed ``--reps`` times: one agent per host, every rank dumped at once
through the worker shim's faulthandler (py-spy is not installed here),
grouped and printed, and the dumps kept in the run directory.

The issue gives no ratio, only "within a few seconds"; the line printed per
layout is the median wall time of the whole command. No assertion.

    .venv/bin/python bench/stacks.py [--reps 5] [--layouts 2x3,4x16]
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (BASE_ENV, DDP_ORCH, PYTHON, REPO, BenchError, footer, header, lab,  # noqa: E402
                     parser, run, tempdir)

TARGET_S = 5.0


def layout(text: str) -> tuple[int, int]:
    hosts, ranks = text.split("x")
    return int(hosts), int(ranks)


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=5)
    p.add_argument("--layouts", default="2x3,4x16",
                   help="HOSTSxRANKS, comma separated (default 2x3,4x16)")
    args = p.parse_args()
    header("stacks: ddp-orch stacks of a live run over an SSH lab", args)
    for hosts, ranks in map(layout, args.layouts.split(",")):
        with tempdir("bench-stacks-", args.keep) as tmp, lab(hosts, tmp) as the_lab:
            shutil.copy(os.path.join(REPO, "tests", "programs", "sleeper.py"), tmp)
            counts = [ranks // hosts + (1 if k < ranks % hosts else 0) for k in range(hosts)]
            nodes = ", ".join(f"{{host: {alias}, procs: {n}}}"
                              for alias, n in zip(the_lab.aliases, counts))
            (tmp / "c.yaml").write_text(f"python: {PYTHON}\nworkdir: {tmp}/remote\n"
                                        f"nodes: [{nodes}]\n"
                                        "workload: {script: sleeper.py}\n")
            env = {**BASE_ENV, **the_lab.env}
            runs = str(tmp / "runs")
            proc = subprocess.Popen([DDP_ORCH, "up", str(tmp / "c.yaml"), "--run-id", "stk",
                                     "--runs-dir", runs, "--grace", "3"], cwd=str(tmp), env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                seen, started, out = 0, time.monotonic(), ""
                while seen < ranks:
                    line = proc.stdout.readline()
                    if not line:
                        raise BenchError(f"the run ended before every rank started ({seen}): "
                                         + proc.communicate()[0][-2000:])
                    seen += "training" in line
                print(f"   {hosts} hosts, {ranks} ranks up in {time.monotonic() - started:.1f}s")
                times = []
                for _ in range(args.warmup + args.reps):
                    times.append(run([DDP_ORCH, "stacks", "stk", "--runs-dir", runs],
                                     cwd=str(tmp), env=env))
                times = times[args.warmup:]
                listed = subprocess.run([DDP_ORCH, "stacks", "stk", "--runs-dir", runs, "--json"],
                                        cwd=str(tmp), env=env, capture_output=True, text=True)
                if listed.stdout.count('"rank":') != ranks:
                    raise BenchError(f"stacks did not list all {ranks} ranks")
            finally:
                os.killpg(proc.pid, signal.SIGINT)
                proc.communicate(timeout=120)
            median = statistics.median(times)
            print(f"   stacks, {ranks} ranks on {hosts} hosts: median {median:.2f}s "
                  f"(min {min(times):.2f}s, max {max(times):.2f}s, {len(times)} reps)")
            print(f"RESULT stacks_{hosts}x{ranks}: {median:.2f}s (target <= {TARGET_S:g}s) "
                  + ("PASS" if median <= TARGET_S else "MISS"))
    footer()


if __name__ == "__main__":
    main()
