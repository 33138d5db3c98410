#!/usr/bin/env python3
"""Parallel remote command fan-out: ddp-orch's SSH code path vs pdsh, on 2, 8 and 32 hosts.

Every host is a real sshd on 127.0.55.x (``tests/labs/sshlab.py``). Both sides
open a fresh SSH connection to every host, run ``true``, and wait for all:

* ddp-orch: ``bench/_fanout_worker.py`` in a process of its own (Python
  start and imports included, as for any ddp-orch command), which runs
  ``orchestrator.engine.fanout.on_all`` over
  ``SshTransport(host).run(["true"])``: the helper and
  the transport the launcher itself uses (paramiko, one thread per host,
  settings from ~/.ssh/config, strict host-key checking).
  Why not ``ddp-orch check``: it runs a Python probe that imports torch on
  every node, then a port check and a TCP test: seconds of torch import per
  node, no comparable pdsh command.
* pdsh: ``pdsh -S -R ssh -f 32 -w node[0-N] true``; the lab's ssh_config is passed
  with ``PDSH_SSH_ARGS_APPEND="-F <cfg>"`` and the host aliases resolve there
  (one OpenSSH client process per host).

Reports wall times per host count (they should stay nearly flat as hosts
grow), the ratio at each count, and the controller's peak RSS at 32 hosts
(``ru_maxrss`` of that process, through GNU time ``%M``, cross-checked with
its own /proc/self/status VmHWM). Target: ddp-orch/pdsh <= 1.5 at 32 hosts.

    .venv/bin/python bench/fanout.py [--reps 5] [--hosts 2,8,32]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (BASE_ENV, BENCH, ORCH_PATH, PYTHON, REPO, BenchError, compare, fmt_s,  # noqa: E402
                     footer, header, lab, parser, print_table, ratio_range, result_line,
                     samples_table, tempdir)

TARGET = 1.5
WORKER = os.path.join(BENCH, "_fanout_worker.py")


def main() -> None:
    p = parser(__doc__.splitlines()[0], reps=5)
    p.add_argument("--hosts", default="2,8,32", help="host counts (default 2,8,32)")
    args = p.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    header("fanout: `true` on N lab hosts, ddp-orch (paramiko, parallel())  vs  pdsh -R ssh", args)
    with tempdir("bench-fanout-", args.keep) as root, lab(max(counts), root) as L:
        details: dict[int, list[dict]] = {n: [] for n in counts}
        rss: dict[int, list[int]] = {n: [] for n in counts}
        pdsh_rss: dict[int, list[int]] = {n: [] for n in counts}
        cpu_s: dict[str, float] = {}  # client-side CPU of the last command, by argv[0]
        client_cpu: dict[str, list[float]] = {}
        env_orch = dict(BASE_ENV, **L.env, PYTHONPATH=ORCH_PATH or REPO)
        env_pdsh = dict(BASE_ENV, PDSH_SSH_ARGS_APPEND=f"-F {L.ssh_config}")

        def timed(argv: list[str], env: dict) -> tuple[float, str, int, int]:
            """Wall time, output, exit code and peak RSS (KiB) of ``argv``.

            The peak RSS comes from GNU time (``%M``, wait4's ru_maxrss), not from
            our own wait4: Linux carries the parent's RSS high-water mark across
            fork+exec into the child's ru_maxrss, so a child of this 50 MiB
            Python would report at least 50 MiB whatever it used. GNU time is a
            small process, so the figure is the command's own.
            """
            t0 = time.perf_counter()
            proc = subprocess.run(["/usr/bin/time", "-f", "BENCH_MAXRSS_KIB %M %U %S", *argv], env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, cwd=str(root))
            wall = time.perf_counter() - t0
            err = proc.stderr.decode(errors="replace")
            lines = err.splitlines()
            maxrss, cpu = -1, float("nan")
            if lines and lines[-1].startswith("BENCH_MAXRSS"):
                fields = lines[-1].split()
                maxrss, cpu = int(fields[1]), float(fields[2]) + float(fields[3])
            cpu_s[argv[0]] = cpu
            rest = "\n".join(l for l in lines if not l.startswith("BENCH_MAXRSS"))
            return wall, proc.stdout.decode(errors="replace") + rest, proc.returncode, maxrss

        def orch(n: int) -> float:
            wall, out, code, maxrss = timed([PYTHON, WORKER, *L.aliases[:n]], env_orch)
            if code != 0:
                raise BenchError(f"ddp-orch fan-out to {n} hosts exited {code}: {out[-2000:]}")
            info = json.loads(next(l for l in out.splitlines() if l.startswith("{")))
            if info["failures"]:
                raise BenchError(f"ddp-orch fan-out: {info['failures']}")
            details[n].append(info)
            client_cpu.setdefault(f"ddp-orch {n}", []).append(cpu_s[PYTHON])
            rss[n].append(maxrss)
            return wall

        def pdsh(n: int) -> float:
            # -S: exit with the largest remote exit code, so a failed node
            # fails the rep, as ddp-orch's side checks each node's code. Output
            # alone is not a failure: on some boxes the login shell prints
            # (e.g. `pyenv rehash` racing in 32 concurrent ~/.bashrc runs).
            wall, out, code, maxrss = timed(
                ["pdsh", "-S", "-R", "ssh", "-f", "32", "-w", f"node[0-{n - 1}]", "true"],
                env_pdsh)
            if code != 0:
                raise BenchError(f"pdsh to {n} hosts exited {code}: {out[-2000:]}")
            pdsh_rss[n].append(maxrss)
            client_cpu.setdefault(f"pdsh {n}", []).append(cpu_s["pdsh"])
            return wall

        variants = {}
        for n in counts:
            variants[f"ddp-orch {n}"] = lambda n=n: orch(n)
            variants[f"pdsh {n}"] = lambda n=n: pdsh(n)
        res = compare(variants, args.reps, args.warmup)

        print()
        samples_table([res[k] for k in variants])
        print()
        rows = [("HOSTS", "DDP-ORCH", "PDSH", "RATIO", "MIN/MIN", "MAX/MAX",
                 "ORCH: IMPORTS", "PARAMIKO IMPORT", "FAN-OUT ITSELF", "PEAK RSS")]
        for n in counts:
            a, b = res[f"ddp-orch {n}"], res[f"pdsh {n}"]
            d = details[n][args.warmup:] or details[n]
            med = lambda key: statistics.median(x[key] for x in d)  # noqa: E731
            rows.append((str(n), fmt_s(a.median), fmt_s(b.median), f"{a.median / b.median:.2f}",
                         f"{a.lo / b.lo:.2f}", f"{a.hi / b.hi:.2f}", fmt_s(med("import_s")),
                         fmt_s(med("paramiko_import_s")), fmt_s(med("fanout_s")),
                         f"{max(rss[n]) / 1024:.1f} MiB"))
        rows[0] = rows[0] + ("PDSH RSS",)
        for i, n in enumerate(counts, start=1):
            rows[i] = rows[i] + (f"{max(pdsh_rss[n]) / 1024:.1f} MiB",)
        print_table(rows)
        lo, hi = min(counts), max(counts)
        for who in ("ddp-orch", "pdsh"):
            growth = res[f"{who} {hi}"].median / res[f"{who} {lo}"].median
            print(f"{who}: wall at {hi} hosts / at {lo} hosts = {growth:.2f} "
                  f"(+{fmt_s((res[f'{who} {hi}'].median - res[f'{who} {lo}'].median) / (hi - lo))} "
                  "per extra host)")
        print("client-side CPU (user+sys of the command and its children; sshd's work not "
              "included), median: " + "; ".join(
                  f"{k} {statistics.median(v) * 1000:.0f}ms" for k, v in client_cpu.items()))
        print("   On one 2-core box the sshds' own handshake work shares the cores, so neither "
              "side can stay flat here; on real hosts that work is spread over the nodes, and "
              "the client's CPU per host (ddp-orch: one process, GIL-bound threads) is what "
              "bounds the fan-out.")
        hwm = [x["vm_hwm_kib"] for x in details[hi]]
        print(f"controller peak RSS during the {hi}-host fan-out: max ru_maxrss "
              f"{max(rss[hi]) / 1024:.1f} MiB (median {statistics.median(rss[hi]) / 1024:.1f} MiB; "
              f"its own VmHWM {max(hwm) / 1024:.1f} MiB); at {lo} hosts "
              f"{max(rss[lo]) / 1024:.1f} MiB. pdsh at {hi}: {max(pdsh_rss[hi]) / 1024:.1f} MiB "
              f"(its largest single process; pdsh runs {hi} ssh client processes of that order, "
              "so its total is many times more)")
        print()
        footer()
        for n in counts:
            a, b = res[f"ddp-orch {n}"], res[f"pdsh {n}"]
            if n != hi:
                print(f"   (at {n} hosts: ratio {a.median / b.median:.2f})")
        a, b = res[f"ddp-orch {hi}"], res[f"pdsh {hi}"]
        print(f"{hi} hosts: {ratio_range(a, b)}")
        result_line(f"fanout[{hi} hosts]", a.median / b.median, TARGET,
                    f"ddp-orch {fmt_s(a.median)} vs pdsh {fmt_s(b.median)}; "
                    f"controller peak RSS {max(rss[hi]) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
