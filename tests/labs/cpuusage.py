"""Where the suite's CPU goes: each test's CPU time, its processes' included.

The suite is CPU-bound on 2 cores (two xdist workers keep both busy), so
its wall time falls only when its CPU work does, and a test's duration
under ``-n 2`` says little about its cost (a test that waits takes long
and costs nothing). With ``DDP_ORCH_TEST_CPU=FILE`` set, each xdist worker
(or the lone pytest process) moves itself into a cgroup of its own
(cgroup v1 ``cpuacct``, or v2), and every test appends one JSON line to
FILE: ``{"test", "cpu_s", "wall_s"}``. A cgroup holds every descendant,
daemonised or not: torchrun, its ranks, the agents and keepers the test
starts, and the sshd sessions and Slurm steps of labs the worker started.
A module's fixtures count toward the test that set them up.

    DDP_ORCH_TEST_CPU=/tmp/cpu.jsonl .venv/bin/python -m pytest -n 2
    .venv/bin/python tests/labs/cpuusage.py /tmp/cpu.jsonl    # the summary
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

ENV = "DDP_ORCH_TEST_CPU"
_V1 = "/sys/fs/cgroup/cpuacct"
_V2 = "/sys/fs/cgroup/unified"


class CpuMeter:
    """This process's own cgroup and its CPU counter."""

    def __init__(self, name: str) -> None:
        if os.path.isfile(os.path.join(_V1, "cpuacct.usage")):
            self.path = os.path.join(_V1, name)
            os.makedirs(self.path, exist_ok=True)
            self._read = lambda: int(_text(os.path.join(self.path, "cpuacct.usage"))) / 1e9
        else:
            root = _V2 if os.path.isdir(_V2) else "/sys/fs/cgroup"
            self.path = os.path.join(root, name)
            os.makedirs(self.path, exist_ok=True)
            self._read = lambda: _usage_v2(os.path.join(self.path, "cpu.stat"))
        with open(os.path.join(self.path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))

    def cpu_s(self) -> float:
        return self._read()


def _text(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read().strip()


def _usage_v2(path: str) -> float:
    for line in _text(path).splitlines():
        key, value = line.split()
        if key == "usage_usec":
            return int(value) / 1e6
    raise RuntimeError(f"no usage_usec in {path}")


class CpuPlugin:
    """Appends each test's CPU and wall time to the file ``ENV`` names."""

    def __init__(self, out: str, worker: str) -> None:
        self.out = out
        self.meter = CpuMeter(f"ddp-orch-tests-{worker}-{os.getpid()}")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ANN001 (pytest's hook)
        cpu, wall = self.meter.cpu_s(), time.monotonic()
        yield
        line = {"test": item.nodeid, "cpu_s": round(self.meter.cpu_s() - cpu, 3),
                "wall_s": round(time.monotonic() - wall, 3)}
        with open(self.out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def register(config) -> None:  # noqa: ANN001 (pytest's Config)
    """From ``pytest_configure``: meter the tests of this process, if asked
    (``ENV``) and if it runs tests (an xdist worker, or pytest without -n)."""
    out = os.environ.get(ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if out and (worker or not getattr(config.option, "numprocesses", None)):
        config.pluginmanager.register(CpuPlugin(out, worker or "main"), "ddp-orch-cpu")


def summary(path: str, top: int = 40) -> str:
    """Total CPU, by module and the costliest tests."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    total = sum(r["cpu_s"] for r in rows)
    by_module: dict[str, float] = {}
    for r in rows:
        module = r["test"].split("::")[0]
        by_module[module] = by_module.get(module, 0.0) + r["cpu_s"]
    out = [f"{len(rows)} tests, {total:.0f} CPU-s in all"]
    out.append("by module:")
    for module, cpu in sorted(by_module.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"  {cpu:8.1f}  {100 * cpu / total:5.1f}%  {module}")
    out.append("costliest tests:")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        out.append(f"  {r['cpu_s']:8.1f}  {r['wall_s']:7.1f}s  {r['test']}")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
