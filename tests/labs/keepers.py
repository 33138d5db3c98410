"""Keepers for tests: a gang's specs and plan, run with plain Python commands
(shared by tests/live/test_keeper.py, test_masking.py and the unit tests)."""

from __future__ import annotations

import os
import secrets
import sys
import time



PROGRAM = """
import os, subprocess, sys, time
SURVIVOR = ("# unkillable-rank\\nimport os, signal, sys, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN)\\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\\n"
            "open(sys.argv[2], 'w').write(repr(time.time()))")
k, attempt = sys.argv[1], os.environ["DDP_ORCH_RESTART_COUNT"]
print(f"node {k} attempt {attempt} port {sys.argv[3]} secret {os.environ.get('TOKEN')} "
      f"at {time.time()}", flush=True)
if f"{k}:{attempt}" not in os.environ.get("NO_WORKERS", "").split(","):
    subprocess.Popen(["sleep", "3600"])
if f"{k}:{attempt}" in os.environ.get("UNKILLABLE", "").split(","):
    subprocess.Popen([sys.executable, "-c", SURVIVOR, os.environ["RELEASE_FILE"],
                      os.environ["GONE_FILE"]])
codes = dict((c.rsplit(":", 1)[0], int(c.rsplit(":", 1)[1]))
             for c in os.environ.get("CODES", "").split(",") if c)
if f"{k}:{attempt}" in codes:
    time.sleep(0.5)
    print(f"node {k} attempt {attempt} exits {codes[f'{k}:{attempt}']} at {time.time()}",
          flush=True)
    sys.exit(codes[f"{k}:{attempt}"])
time.sleep(float(os.environ.get("SLEEP", "2")))
"""


def keeper_specs(tmp_path, nnodes: int, *, restarts: int = 0, env: dict | None = None,
                 token: str | None = None) -> list[dict]:
    token = token or secrets.token_hex(16)
    run_id = f"kt-{os.getpid()}-{time.monotonic_ns()}"
    out = []
    for k in range(nnodes):
        run_dir = str(tmp_path / f"node-{k}")
        node_env = {"DDP_ORCH_RUN_ID": run_id, "DDP_ORCH_NODE_RANK": str(k),
                    "DDP_ORCH_RESTART_COUNT": "0", **(env or {})}
        out.append({
            "nnodes": nnodes, "max_restarts": restarts, "start_timeout_s": 20,
            "gang": {"addr": "127.0.0.1", "port": 0, "token": token},
            "supervisor": {
                "run_id": run_id, "node_rank": k, "run_dir": run_dir, "first_rank": k,
                "nproc": 1, "master_port": 29500,
                "argv": [sys.executable, "-c", PROGRAM, str(k), "--master-port", "29500",
                         "--log-dir", f"{run_dir}/torchrun"],
                "env": node_env, "unset_env": [], "grace_s": 2, "heartbeat_s": 1,
                "owner": {"holder": "keepers", "detached": True},
                "secrets": [node_env["TOKEN"]] if "TOKEN" in node_env else []}})
    return out


def wait_until(ready, what: str, timeout: float = 20) -> None:
    """Poll ``ready()`` until it holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
        time.sleep(0.05)


def _plan(nnodes: int):
    from orchestrator.plan.model import Entrypoint, NodePlan, RunPlan

    nodes = tuple(NodePlan(k, f"h{k}", "python3", None, k, 1, f"/r/{k}", {}, ())
                  for k in range(nnodes))
    return RunPlan("r", "r", "ssh", nnodes, "h0", 29500, "cpu", "x", None,
                   Entrypoint(None, "x.py", ()), nodes, ())
