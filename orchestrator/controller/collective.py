"""The collective smoke test (``check --collective``, ``up --preflight collective``):
the run's own layout runs a tiny, bounded all-reduce between every pair of nodes,
then across the gang, so a pair that hangs is named."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from ..config.limits import COLLECTIVE_BOUND_S
from ..config.spec import ClusterSpec, WorkloadSpec
from ..engine.options import LaunchOptions
from ..engine.checkresult import CheckResult

DEFAULT_BOUND_S = COLLECTIVE_BOUND_S
NAME = "collective"
# NCCL says what it chose only at INFO, into a file per process the rank reads
# back (relative: each rank's working directory, the node's code root).
NCCL_DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
              "NCCL_DEBUG_FILE": "nccl-debug.%h.%p"}
CLUSTER = (-1, "*")


def smoke_spec(spec: ClusterSpec, bound_s: int = DEFAULT_BOUND_S) -> ClusterSpec:
    """``spec``'s layout, env and backend running ``collective``, and nothing else of it."""
    return dataclasses.replace(
        spec, name=f"{spec.name}-{NAME}"[:64],
        workload=WorkloadSpec(name=NAME, script=None, args={"bound": int(bound_s)}),
        env={**spec.env, **NCCL_DEBUG}, setup=(), setup_when_changed=(), outputs=(),
        max_restarts=0, hang_timeout=None)


def smoke_options(options: LaunchOptions, bound_s: int = DEFAULT_BOUND_S) -> LaunchOptions:
    """Attached, no restarts, and a hang timeout in case the program's own bounds fail."""
    return dataclasses.replace(options, detach=False, max_restarts=0,
                               hang_timeout_s=float(bound_s * 3 + 60))


def run_smoke(spec: ClusterSpec, launch: Callable[..., Any],
              bound_s: int = DEFAULT_BOUND_S) -> list[CheckResult]:
    from ..errors import OrchestratorError

    try:
        outcome, run = launch(smoke_spec(spec, bound_s))
    except OrchestratorError as exc:  # refused or unreachable: a row, beside the others
        return [CheckResult(*CLUSTER, NAME, False, f"the smoke run could not start: {exc}")]
    hosts = {k: node.host for k, node in enumerate(spec.nodes)}
    return smoke_rows(outcome.result if outcome.result else None, hosts, outcome, run.path)


def smoke_rows(result: Mapping[str, Any] | None, hosts: Mapping[int, str],
               outcome: Any = None, run_path: str = "") -> list[CheckResult]:
    """Rows for the smoke test's ``result``: one per pair of nodes and one for
    the gang; without a result, one row with the root cause and its hint."""
    if not isinstance(result, Mapping) or not isinstance(result.get("pairs"), list):
        return [CheckResult(*CLUSTER, NAME, False, _no_result(outcome, run_path))]
    backend = str(result.get("backend") or "?")
    bound = result.get("bound_s")
    rows = [_pair_row(pair, hosts, backend, bound) for pair in result["pairs"]
            if isinstance(pair, Mapping)]
    gang = result.get("gang") if isinstance(result.get("gang"), Mapping) else {}
    nodes = result.get("nodes") if isinstance(result.get("nodes"), list) else []
    world = result.get("world_size")
    where = f"the whole gang ({world} ranks on {len(nodes)} node(s), {backend})"
    if gang.get("ok") is None:
        rows.append(CheckResult(*CLUSTER, NAME, True, f"{where}: {gang.get('error')}",
                                warning=True))
    elif gang.get("ok"):
        rows.append(CheckResult(*CLUSTER, NAME, True, f"{where}: all-reduce in "
                                                      f"{_measured(gang, gang.get('transports'))}"))
    else:
        rows.append(CheckResult(*CLUSTER, NAME, False, f"{where}: {gang.get('error')}; "
                                                       f"{_gang_cause(backend, len(nodes))}"))
    return rows


def _pair_row(pair: Mapping[str, Any], hosts: Mapping[int, str], backend: str,
              bound: object) -> CheckResult:
    a, b = (int(k) for k in pair.get("nodes") or (0, 0))
    label = f"node {a} ({hosts.get(a, '?')}) <-> node {b} ({hosts.get(b, '?')})"
    if pair.get("ok"):
        return CheckResult(a, hosts.get(a, "?"), NAME, True,
                           f"{label}: all-reduce in {_measured(pair, None)}")
    said = str(pair.get("error") or "failed")
    hang = " (a hang)" if pair.get("hang") else ""
    return CheckResult(a, hosts.get(a, "?"), NAME, False,
                       f"{label}: {said}{hang}; {_pair_cause(backend, bound)}")


def _measured(said: Mapping[str, Any], transports: object) -> str:
    """``0.012s, bus 1.25 GB/s (socket)``."""
    seconds = said.get("seconds")
    took = f"{seconds:.3f}s" if isinstance(seconds, (int, float)) else "?"
    busbw = said.get("busbw_gbps")
    rate = f", bus {busbw:.2f} GB/s" if isinstance(busbw, (int, float)) and busbw > 0 else ""
    via = f" ({', '.join(map(str, transports))})" if isinstance(transports, list) and \
        transports else ""
    return f"{took}{rate}{via}"


def _pair_cause(backend: str, bound: object) -> str:
    which = "NCCL's" if backend == "nccl" else "Gloo's"
    return (f"likely a firewall between these two hosts: {which} connections use ports of "
            "their own, not SSH's or the master port; allow TCP between the two nodes' "
            "addresses; or the interface (`ddp-orch check`'s data-path row tests it, "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME choose it)"
            + ("; on InfiniBand, `ibstat` on both (NCCL_IB_DISABLE=1 as a test)"
               if backend == "nccl" else ""))


def _gang_cause(backend: str, nodes: int) -> str:
    """The likely cause of a gang whose pairs passed but whose all-reduce failed."""
    if backend != "nccl":
        return "every pair of nodes passed: see the run's logs for the rank that failed"
    return ("every pair of nodes passed, so it is within a node: GPU peer-to-peer "
            "(NCCL_P2P_DISABLE=1 in `env:` as a test), a small /dev/shm (NCCL_SHM_DISABLE=1 as "
            "a test; docker --shm-size=1g), or a GPU in exclusive compute mode")


def _no_result(outcome: Any, run_path: str) -> str:
    """Why the smoke run said nothing: its root cause and hint."""
    from ..records.hints import failure_hint

    root = getattr(outcome, "root_cause", None)
    where = f" (its run: {run_path})" if run_path else ""
    if root is None:
        state = getattr(outcome, "state", None)
        return f"the smoke run ended {getattr(state, 'value', state)} with no result{where}"
    hint = failure_hint(root, getattr(outcome, "nodes", ()))
    return (f"the smoke run failed: node {root.node_rank} ({root.host}): {root.reason}"
            + (f"; {hint}" if hint else "") + where)
