#!/usr/bin/env python3
"""CLI start-up latency: the commands that start nothing, against `python -c pass`.

`ddp-orch --help`, `ps`, `status RUN` (a finished run: its records only)
and `up cluster.yaml.example --dry-run`, each timed beside `python -c pass`
on the same interpreter (the venv's): the difference is what the controller
costs on top of a bare Python start (imports; for the dry-run, loading and
validating the YAML, building and rendering the plan). Also checks, with
``-X importtime`` (PYTHONPROFILEIMPORTTIME), that the controller never
imports torch (nor paramiko, on a dry run) and shows the costliest imports.

    .venv/bin/python bench/cli_latency.py [--reps 20]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (BASE_ENV, DDP_ORCH, ORCH_ENV, PYTHON, REPO, compare, fmt_s,  # noqa: E402
                     footer, header, parser, ratio_range, result_line, run, samples_table)

# Issue #31: each of these commands takes at most 4x a bare interpreter's
# start (`python -c pass`); click and yaml alone cost about 2.5x of it, so
# ddp-orch's own modules and work get what is left. Importing torch is a
# MISS whatever the time.
TARGET = 4.0
EXAMPLE = os.path.join(REPO, "cluster.yaml.example")
RUN_ID = "bench-status"


def import_profile() -> tuple[list[tuple[int, int, str]], str]:
    """(self_us, cumulative_us, module) for every import of one dry run."""
    env = dict(BASE_ENV, **ORCH_ENV, PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run([DDP_ORCH, "up", EXAMPLE, "--dry-run"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)))
    return [(s, c, ind + name) for s, c, ind, name in rows], proc.stdout


def recorded_run(runs_dir: str) -> None:
    """One finished run for `ps` and `status` to read: a 1-process noop here."""
    run([DDP_ORCH, "up", "--local", "--workload", "noop", "--procs", "1", "--device", "cpu",
         "--run-id", RUN_ID, "--runs-dir", runs_dir, "--quiet"], cwd=REPO)


def main() -> None:
    args = parser(__doc__.splitlines()[0], reps=20).parse_args()
    header("cli_latency: ddp-orch --help, ps, status, up --dry-run  vs  python -c pass", args)
    print(f"   interpreter: {PYTHON}")
    runs_dir = tempfile.mkdtemp(prefix="ddp-orch-bench-runs-")
    recorded_run(runs_dir)
    at = ["--runs-dir", runs_dir]
    commands = {
        "ddp-orch --help": [DDP_ORCH, "--help"],
        "ddp-orch ps": [DDP_ORCH, "ps", *at],
        "ddp-orch status": [DDP_ORCH, "status", RUN_ID, *at],
        "ddp-orch --dry-run": [DDP_ORCH, "up", EXAMPLE, "--dry-run"],
    }
    variants = {name: (lambda argv=argv: run(argv, cwd=REPO)) for name, argv in commands.items()}
    variants["python -c pass"] = lambda: run([PYTHON, "-c", "pass"], cwd=REPO)
    # not part of the ratio: how much of the cost its two dependencies alone have
    variants["import click,yaml"] = lambda: run([PYTHON, "-c", "import click, yaml"], cwd=REPO)
    res = compare(variants, args.reps, args.warmup)
    bare, deps = res["python -c pass"], res["import click,yaml"]
    print()
    samples_table([bare, deps, *(res[name] for name in commands)], baseline=bare)
    dry = res["ddp-orch --dry-run"]
    print(f"dry-run cost over a bare interpreter: {fmt_s(dry.median - bare.median)} (median "
          f"difference); of which importing click+yaml: {fmt_s(deps.median - bare.median)}, "
          f"ddp-orch's own modules and work: {fmt_s(dry.median - deps.median)}")
    for name in commands:
        print(f"{name}: {ratio_range(res[name], bare)}")

    rows, _ = import_profile()
    top = [r for r in rows if r[2].strip()]
    modules = {name.strip() for _, _, name in top}
    torch_mods = sorted(m for m in modules if m == "torch" or m.startswith("torch."))
    heavy = sorted(m for m in modules if m.split(".")[0] in ("paramiko", "cryptography", "numpy"))
    print()
    print(f"modules imported by the dry run: {len(modules)}; total import time "
          f"{sum(s for s, _, _ in top) / 1000:.1f}ms (self times, one cold-ish run)")
    print(f"torch imported by the controller: {'YES: ' + ', '.join(torch_mods[:5]) if torch_mods else 'no'}")
    print(f"paramiko/cryptography/numpy imported on a dry run: "
          f"{'YES: ' + ', '.join(heavy[:5]) if heavy else 'no'}")
    print("imports costing >= 4ms cumulative, as a tree (-X importtime, one run):")
    for s, cum, name in rows:
        depth = (len(name) - len(name.lstrip())) // 2
        if cum >= 4000 and depth <= 3:
            print(f"   {cum / 1000:7.1f}ms  {name}")
    print("costliest single modules (self time):")
    for s, _, name in sorted(top, reverse=True)[:8]:
        print(f"   {s / 1000:7.1f}ms  {name.strip()}")
    print()
    footer()
    worst = max(commands, key=lambda name: res[name].median)
    ratio = res[worst].median / bare.median if not torch_mods else float("inf")
    result_line("cli_latency", ratio, TARGET,
                "; ".join(f"{name.removeprefix('ddp-orch ')} {res[name].median / bare.median:.2f}x"
                          for name in commands)
                + f" (bare python {fmt_s(bare.median)}); torch imported: "
                  f"{'YES' if torch_mods else 'no'}")


if __name__ == "__main__":
    main()
