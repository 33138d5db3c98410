"""``up``: from a validated spec to a finished run, with its records kept.

This is the one function the CLI calls for a launch. It creates the run
directory, resolves the launch-time facts (node homes, the master port),
stores the resolved plan, launches, fetches rank 0's result and records
the final state, closing every connection on the way out.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Mapping

from . import ports
from .bundle import build_bundle
from .console import Console
from .launcher import Launch, RunOutcome, parallel
from .node import discard_standby, open_standby
from .plan import RunPlan, build_plan, resolve_plan
from .render import plan_to_dict, scrub, secret_values
from .runs import RunDir, new_run_id
from .spec import AUTO_PORT, ClusterSpec, with_default_master
from .transport import Transport, TransportError, transport_for
from .transport.base import ProcessHandle

TransportFactory = Callable[..., Transport]


def up(spec: ClusterSpec, *, runs_dir: str, console: Console, run_id: str | None = None,
       grace_s: float = 10.0, start_timeout_s: float = 300.0, make_transport: TransportFactory = transport_for) -> tuple[RunOutcome, RunDir]:
    spec = with_default_master(spec)
    run = RunDir.create(runs_dir, run_id or new_run_id(spec.name))
    run.write_text("cluster.yaml", _scrubbed_text(spec))
    plan = build_plan(spec, run_id=os.path.basename(run.path), local_run_dir=run.path)
    transports = {node.node_rank: make_transport(node) for node in plan.nodes}
    standbys: dict[int, ProcessHandle] = {}
    started = time.time()
    _record(run, plan, "starting", started)
    outcome = None
    final_state = "failed"
    try:
        plan = _resolve(plan, transports, standbys)
        run.write_json("plan.json", plan_to_dict(plan))
        _record(run, plan, "running", started)
        build_bundle(run.file("bundle.tar.gz"), plan.script)
        launch = Launch(plan, run, transports, console,
                        bundle_path=run.file("bundle.tar.gz"), grace_s=grace_s,
                        start_timeout_s=start_timeout_s, standbys=dict(standbys))
        standbys.clear()  # the launch owns them now, and their teardown
        outcome = launch.run()
        result = _fetch_result(plan, transports[0], run)
        _fetch_error_files(plan, transports, outcome, run)
        outcome = dataclasses.replace(outcome, result=result)
        final_state = outcome.state
        return outcome, run
    except KeyboardInterrupt:
        final_state = "interrupted"  # before the nodes started: nothing to tear down
        raise
    finally:
        _record(run, plan, final_state, started, outcome)
        for standby in standbys.values():  # what no launch took: resolve failed, or Ctrl-C
            discard_standby(standby)
        for transport in transports.values():
            transport.close()


def _scrubbed_text(spec: ClusterSpec) -> str:
    """The cluster file as given, but with secret env values masked."""
    secrets = set()
    for node in spec.nodes:
        secrets.update(secret_values(node.env))
    return scrub(spec.text.encode(), tuple(sorted(secrets, key=len, reverse=True))).decode()


def _resolve(plan: RunPlan, transports: Mapping[int, Transport],
             standbys: dict[int, ProcessHandle]) -> RunPlan:
    """Ask every node for its home directory and node 0 for the master port,
    and start every node's standby (the supervisor-to-be), all at once: over
    SSH each of these pays a remote command's start."""
    homes: dict[int, str] = {}
    found: list[int] = []

    def ask(job: tuple[str, int]) -> None:
        what, k = job
        if what == "home":
            homes[k] = transports[k].home()
        elif what == "standby":
            standbys[k] = open_standby(transports[k], plan.nodes[k].python)
        else:
            found.append(_master_port(plan, transports[0]))

    jobs = [(what, n.node_rank) for n in plan.nodes for what in ("home", "standby")] + \
        [("port", 0)]
    parallel(ask, jobs, "connecting to the nodes",
             lambda job: f"node {job[1]} ({plan.nodes[job[1]].host})")
    return resolve_plan(plan, master_port=found[0], homes=homes)


def _master_port(plan: RunPlan, node0: Transport) -> int:
    python = plan.nodes[0].python
    if plan.master_port == AUTO_PORT:
        return ports.pick_free_port(node0, python)
    ports.check_port_free(node0, python, int(plan.master_port))
    return int(plan.master_port)


def _fetch_result(plan: RunPlan, node0: Transport, run: RunDir) -> dict | None:
    if node0.get_file(plan.nodes[0].result_file, run.file("result.json")):
        return run.read_json("result.json")
    return None


def _fetch_error_files(plan: RunPlan, transports: Mapping[int, Transport], outcome: RunOutcome,
                      run: RunDir) -> None:
    """Copy torchrun's error files of failed nodes to errors/node-<k>/ (best effort)."""
    for node_outcome in outcome.nodes:
        node = plan.nodes[node_outcome.node_rank]
        for failure in node_outcome.failures:
            if not failure.get("error_file"):
                continue
            local = run.file(f"errors/node-{node.node_rank}/rank-"
                             f"{node.first_rank + failure['local_rank']}.json")
            try:
                transports[node.node_rank].get_file(f"{node.run_dir}/{failure['error_file']}", local)
            except (TransportError, OSError):
                pass


def _record(run: RunDir, plan: RunPlan, state: str, started: float,
            outcome: RunOutcome | None = None) -> None:
    """state.json: what `ddp-orch ps` reads; it survives a controller restart."""
    payload = {
        "run_id": plan.run_id, "state": state, "started": started,
        "controller_pid": os.getpid(), "ended": time.time() if outcome else None,
        "wall_s": outcome.wall_s if outcome else None,
        "nodes": [{"node_rank": n.node_rank, "host": n.host, "run_dir": n.run_dir}
                  for n in plan.nodes],
    }
    if outcome is not None:
        payload["outcomes"] = [o.__dict__ for o in outcome.nodes]
        payload["root_cause"] = outcome.root_cause.__dict__ if outcome.root_cause else None
    run.write_json("state.json", payload)
