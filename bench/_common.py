"""Small helpers shared by the bench/ scripts (not a test module).

* ``compare``: alternate the variants rep after rep (the order rotates every
  rep, so drift and warm caches hit each variant alike) and collect times;
* ``summary`` / ``print_table`` / ``result_line``: medians, min/max, the
  ratio of medians and the final ``RESULT`` line;
* ``lab``: a running ``SshLab`` plus a fake $HOME whose ~/.ssh/config points
  at it (``tests/labs/sshlab.py`` and ``tests/labs/labhome.py``).

No timed assertion anywhere: a missed target prints MISS, the exit code is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
BENCH = os.path.join(REPO, "bench")
sys.stdout.reconfigure(line_buffering=True)
for _p in (REPO, TESTS, os.path.join(TESTS, "labs")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

VENV_BIN = os.path.join(REPO, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python") if os.path.exists(os.path.join(VENV_BIN, "python")) \
    else sys.executable
DDP_ORCH = os.path.join(VENV_BIN, "ddp-orch")

# Every subprocess gets BASE_ENV. This session's shell exports
# PYTHONDONTWRITEBYTECODE=1 and PYTHONUNBUFFERED=1, which no user has: with
# the first, every import of a module edited since its .pyc was written
# recompiles it on every run; the second changes the workloads' buffering.
# Byte code goes to a cache of our own under /tmp instead of the tree's
# __pycache__ dirs (the benches write nothing outside bench/ and /tmp); it is
# filled by the warm-up round, as an installed package has its .pyc files.
PYCACHE = "/tmp/ddp-orch-bench-pycache"
BASE_ENV = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONPATH",
                         "PYTHONPROFILEIMPORTTIME")}
BASE_ENV["PYTHONPYCACHEPREFIX"] = PYCACHE

# To try a candidate fix without touching the tree: BENCH_ORCHESTRATOR=/path/to/dir
# holding a patched copy of the ``orchestrator`` package; every ddp-orch side of
# every bench then imports it from there (PYTHONPATH wins over the editable install).
ORCH_PATH = os.environ.get("BENCH_ORCHESTRATOR", "")
ORCH_ENV = {"PYTHONPATH": ORCH_PATH} if ORCH_PATH else {}


# -- arguments ---------------------------------------------------------------

def parser(description: str, reps: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--reps", type=int, default=reps,
                   help=f"measured repetitions of each variant (default {reps})")
    p.add_argument("--warmup", type=int, default=1,
                   help="unmeasured rounds of every variant first (default 1)")
    p.add_argument("--keep", action="store_true", help="keep temp dirs (prints where)")
    return p


# -- running and timing -------------------------------------------------------

class BenchError(RuntimeError):
    """A variant did not do its job (bad exit code, lost lines): no figure is printed."""


LAST = {"cpu": 0.0}  # CPU seconds (user+sys) of the last ``run``, its whole process tree


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
        stdout=subprocess.DEVNULL, timeout: float = 600, check: bool = True) -> float:
    """Run ``argv`` to completion; return its wall time in seconds.

    ``LAST["cpu"]`` gets the CPU time of it and every descendant it waited
    for (not of processes started through sshd: those are sshd's children).
    """
    full_env = dict(BASE_ENV)
    if argv[0] == DDP_ORCH:
        full_env.update(ORCH_ENV)
    full_env.update(env or {})
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=stdout, stderr=subprocess.STDOUT if stdout is not
                          subprocess.DEVNULL else subprocess.PIPE, timeout=timeout)
    wall = time.perf_counter() - t0
    LAST["cpu"] = _children_cpu() - cpu0
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-3000:] if proc.stderr else ""
        raise BenchError(f"`{' '.join(argv)[:300]}` exited {proc.returncode}\n{err}")
    return wall


@dataclass
class Samples:
    name: str
    values: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # name -> list of per-rep side figures

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)


def compare(variants: Mapping[str, Callable[[], float]], reps: int, warmup: int = 1,
            log: Callable[[str], None] = print) -> dict[str, Samples]:
    """Alternate the variants: rep i runs them in an order rotated by i.

    Each callable returns the seconds to record (usually its own wall time).
    """
    names = list(variants)
    out = {n: Samples(n) for n in names}
    for w in range(warmup):
        for n in names:
            variants[n]()
        log(f"  warm-up {w + 1}/{warmup} done")
    for i in range(reps):
        order = names[i % len(names):] + names[:i % len(names)]
        figures = []
        for n in order:
            value = variants[n]()
            out[n].values.append(value)
            figures.append(f"{n}={fmt_s(value)}")
        log(f"  rep {i + 1}/{reps}: " + "  ".join(figures))
    return out


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.1f}ms" if seconds < 1 else f"{seconds:.3f}s"


def print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def median_columns(phases: Mapping[str, Sequence[Sequence[float | None]]],
                   columns: int) -> list[tuple[str, ...]]:
    """One row per variant: the median of each timeline column over its runs,
    ``-`` where a variant has no such phase (None in every run)."""
    rows = []
    for name, runs in phases.items():
        cells = []
        for i in range(columns):
            values = [run[i] for run in runs if run[i] is not None]
            cells.append(fmt_s(statistics.median(values)) if values else "-")
        rows.append((name, *cells))
    return rows


def samples_table(samples: Sequence[Samples], baseline: Samples | None = None) -> None:
    """One row per variant: median, min, max, and median/baseline-median."""
    rows = [("VARIANT", "N", "MEDIAN", "MIN", "MAX", "RATIO")]
    for s in samples:
        ratio = f"{s.median / baseline.median:.3f}" if baseline else ""
        rows.append((s.name, str(len(s.values)), fmt_s(s.median), fmt_s(s.lo), fmt_s(s.hi), ratio))
    print_table(rows)


def ratio_range(a: Samples, b: Samples) -> str:
    """The ratio of medians, with the ratio of the minima and of the maxima, and
    the ratios of each rep's two runs (``compare`` runs them back to back):
    their median and middle half show how far this machine's drift alone moves
    one rep's ratio, which the ratio of medians does not."""
    out = (f"ratio of medians {a.median / b.median:.3f} "
           f"(min/min {a.lo / b.lo:.3f}, max/max {a.hi / b.hi:.3f})")
    if len(a.values) == len(b.values) >= 4:
        paired = sorted(x / y for x, y in zip(a.values, b.values))
        q1, _, q3 = statistics.quantiles(paired, n=4)
        out += (f"; per-rep ratios: median {statistics.median(paired):.3f}, "
                f"middle half {q1:.3f}-{q3:.3f}")
    return out


def result_line(name: str, ratio: float, target: float, note: str = "") -> bool:
    ok = ratio <= target
    print(f"RESULT {name}: ratio={ratio:.2f} (target <= {target:g}) {'PASS' if ok else 'MISS'}"
          + (f"  {note}" if note else ""))
    return ok


# -- environment ---------------------------------------------------------------

def machine() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")), "?")
    except OSError:
        pass
    try:
        torch_v = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                 capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        torch_v = "?"
    return (f"{os.cpu_count()} cores, {model}, kernel {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch_v or '?'}")


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def header(title: str, args: argparse.Namespace) -> None:
    print(f"== {title}")
    if ORCH_PATH:
        print(f"   !! ddp-orch imported from BENCH_ORCHESTRATOR={ORCH_PATH}, not the tree")
    print(f"   {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; reps={args.reps} warmup={args.warmup}; "
          f"load average {loadavg()}")
    print(f"   {machine()}", flush=True)


def footer() -> None:
    print(f"   load average at the end: {loadavg()} (other jobs on this box add noise; "
          "the variants alternate so that it hits them alike)")


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tempdir(prefix: str, keep: bool = False) -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if keep:
            print(f"(kept {path})")
        else:
            subprocess.run(["rm", "-rf", str(path)])


@dataclass
class Lab:
    lab: object        # sshlab.SshLab
    root: pathlib.Path
    env: dict          # {"HOME": fake home} for the ddp-orch subprocess
    ssh_config: str    # the lab's own ssh_config (for the system ssh / pdsh)

    @property
    def aliases(self) -> list[str]:
        return [h.alias for h in self.lab.hosts]


@contextlib.contextmanager
def lab(n_hosts: int, root: pathlib.Path, extra_sshd: tuple[str, ...] = ()) -> Iterator[Lab]:
    """``n_hosts`` real sshds on 127.0.55.x and a fake $HOME pointing at them;
    ``extra_sshd``: more sshd_config lines for every host."""
    from labhome import lab_home
    from sshlab import SshLab

    t0 = time.perf_counter()
    with SshLab(n_hosts, startup_timeout=60, extra_sshd=extra_sshd) as ssh_lab:
        env = lab_home(ssh_lab, root)
        print(f"   (lab of {n_hosts} sshd host(s) up in {time.perf_counter() - t0:.1f}s)")
        yield Lab(ssh_lab, root, env, ssh_lab.ssh_config)
