"""Helpers for the workload tests: running workloads as ddp-orch would.

Live tests start workloads the way ddp-orch does -- ``python -m
torch.distributed.run ... -m workloads.X`` with PYTHONPATH pointing at the
repo and the DDP_ORCH_* variables set -- in a fresh environment dict (a copy
of ours plus additions; os.environ itself is never changed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

REQUIRED_KEYS = ("workload", "config", "world_size", "data", "metrics", "timing",
                 "rank_table", "checksum", "checksums", "replicas_identical",
                 "versions", "loss_curve")
TIMEOUT_S = 180


@dataclass
class Run:
    """A finished workload process: exit status, output, parsed result (or None)."""

    returncode: int
    stdout: str
    stderr: str
    result: dict | None

    def check(self) -> dict:
        assert self.returncode == 0, f"rc={self.returncode}\n{self.stdout}\n{self.stderr[-4000:]}"
        assert self.result is not None, "no result.json written"
        return self.result


def workload_env(result_file: str | None, **extra: str) -> dict:
    """A copy of os.environ plus what ddp-orch sets; one thread per process."""
    env = dict(os.environ)
    env.pop("DDP_ORCH_RESULT_FILE", None)
    env.update({"PYTHONPATH": ROOT, "DDP_ORCH_DEVICE": "cpu", "OMP_NUM_THREADS": "1"})
    if result_file:
        env["DDP_ORCH_RESULT_FILE"] = result_file
    env.update(extra)
    return env


def _finish(proc: subprocess.CompletedProcess, result_file: str | None) -> Run:
    result = None
    if result_file and os.path.exists(result_file):
        with open(result_file, encoding="utf-8") as fh:
            result = json.load(fh)
    return Run(proc.returncode, proc.stdout, proc.stderr, result)


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` with a timeout that ends the command with SIGTERM
    before SIGKILL. torchrun stops its workers on SIGTERM; they sit in
    sessions of their own, so a SIGKILLed torchrun leaves them running (a
    hung test once left two ranks behind, for good)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, TIMEOUT_S, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_torchrun(tmp_path, module: str, *args: str, nproc: int = 2, name: str = "result",
                 env_extra: dict | None = None, launcher_args: tuple = ()) -> Run:
    """``torchrun --standalone --nproc-per-node N -m workloads.<module> args``."""
    result_file = str(tmp_path / f"{name}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), *launcher_args, "-m", f"workloads.{module}", *args]
    proc = _run(cmd, cwd=tmp_path, env=workload_env(result_file, **(env_extra or {})))
    return _finish(proc, result_file)


def run_alone(tmp_path, module: str, *args: str, name: str | None = "result",
              env_extra: dict | None = None) -> Run:
    """``python -m workloads.<module> args``: one process, no torchrun."""
    result_file = str(tmp_path / f"{name}.json") if name else None
    proc = _run([sys.executable, "-m", f"workloads.{module}", *args], cwd=tmp_path,
                env=workload_env(result_file, **(env_extra or {})))
    return _finish(proc, result_file)


NO_NUMPY = ("import sys\n"
            "sys.modules['numpy'] = None  # `import numpy` raises ImportError\n")


def no_numpy(tmp_path) -> dict:
    """``env_extra`` for a node with torch alone, as the README promises: a
    ``sitecustomize`` on every process's path blocks ``import numpy`` (torch
    then runs as it does without numpy: ``.numpy()`` and ``all_gather_object``
    raise "Numpy is not available")."""
    blocker = tmp_path / "no-numpy"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(NO_NUMPY)
    return {"PYTHONPATH": f"{blocker}:{ROOT}"}


def without_numpy(run: Run) -> dict:
    """``run``'s result, once it is clear that nothing in it missed numpy."""
    assert "Numpy is not available" not in run.stderr, run.stderr[-3000:]
    return run.check()


def check_complete(result: dict, workload: str, world_size: int) -> None:
    """The checks every live run gets: schema, world size, replica agreement."""
    missing = [k for k in REQUIRED_KEYS if k not in result]
    assert not missing, f"result lacks {missing}"
    assert result["workload"] == workload
    assert result["world_size"] == world_size
    assert [r["rank"] for r in result["rank_table"]] == list(range(world_size))
    assert len(result["checksums"]) == world_size
    assert len(set(result["checksums"])) == 1
    assert result["checksum"] == result["checksums"][0]
    assert result["replicas_identical"] is True
    assert result["versions"]["torch"]
    for key in ("total_s", "steps"):
        assert key in result["timing"]


