"""What the local and SSH backends share: nodes reached through a transport,
each running the node agent. A subclass says only how to reach a node
(``transport``) and how to show it (``where``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from workloads.contract import MAX_RESTARTS_ENV

from ..errors import ConfigError, TransportError
from ..plan.dryrun import ByHand, DryRun, NodeLaunch
from ..plan.torchrun import torchrun_argv
from .base import (CancelResult, LaunchBackend, PruneResult, Watch, in_local_run_dir,
                   recorded_dryrun)

# The engine (agents, the gang, fetching, preflight) is imported by the
# methods that start or reach nodes, not here: a dry-run, `ps` and `--help`
# load this module without it (bench/cli_latency.py).
if TYPE_CHECKING:
    from ..console import Console
    from ..engine.agentlink import AgentHandle
    from ..engine.checkresult import Preflight
    from ..engine.stacks import StacksResult
    from ..plan.model import NodePlan, RunPlan
    from ..records.outcome import RunDescription, RunOutcome
    from ..records.rundir import RunDir
    from ..records.store import NodeRecord, RunRecord
    from ..transport.base import Transport
    from .agentrun import AgentRun


class AgentBackend(LaunchBackend):
    """A backend whose nodes run ``orchestrator.agent`` through a ``Transport``."""

    @abstractmethod
    def transport(self, node_rank: int, host: str, connection: Mapping[str, Any]) -> Transport:
        """How to reach a node; ``connection`` is what ``connection()`` recorded."""

    @abstractmethod
    def where(self, node: NodePlan) -> str:
        """How the dry-run names the way a node is reached."""

    def connection(self, node_rank: int) -> dict[str, Any]:
        """What this backend needs to reach the node again later (``down``)."""
        return {}

    def reach(self, node: NodePlan) -> tuple[str, ...]:
        """The argv that runs a command on ``node``, for the shell dry-run; ()
        for this machine."""
        return ()

    # -- the interface -------------------------------------------------------

    def dryrun(self, plan: RunPlan) -> DryRun:
        restarts = {MAX_RESTARTS_ENV: str(self.options.max_restarts)} \
            if self.options.max_restarts else {}
        nodes = tuple(NodeLaunch(node=node, where=self.where(node),
                                 env=dict(sorted({**node.env, **restarts}.items())),
                                 unset_env=node.unset_env, argv=torchrun_argv(plan, node),
                                 connection=self.connection(node.node_rank), setup=plan.setup,
                                 setup_timeout_s=plan.setup_timeout_s,
                                 setup_when_changed=plan.setup_when_changed)
                      for node in plan.nodes)
        if plan.code is None:  # a built-in workload: no code directory to scan
            notes: tuple[str, ...] = ()
        else:
            from ..engine.bundle import code_notes

            notes = code_notes(plan, self.spec.source if self.spec else "")
        reach = {node.node_rank: self.reach(node) for node in plan.nodes}
        owner, words = self.owner()
        return DryRun(backend=self.name, plan=plan, nodes=nodes, notes=notes,
                      source=self.spec.source if self.spec else "",
                      owner=owner, owner_words=words,
                      max_restarts=self.options.max_restarts,
                      by_hand=ByHand(reach={k: argv for k, argv in reach.items() if argv}))

    def submit(self, info: DryRun, run: RunDir, console: Console) -> "AgentRun":
        """Open an agent on every node at once and resolve the dry-run with
        what they found; the supervisors start when the engine follows. A
        failure half-way closes every agent (nothing runs there yet)."""
        from ..engine import gpuplan
        from ..engine.agentlink import open_agents
        from ..engine.bundle import build_bundle, stand_ins
        from ..engine.fanout import on_all
        from ..engine.nodespec import BUNDLE_NAME
        from ..plan.build import resolve_plan
        from .agentrun import AgentRun

        plan = info.plan
        transports = {n.node_rank: self._node_transport(n) for n in plan.nodes}
        for warning in dict.fromkeys(w for t in transports.values() for w in t.warnings):
            console.info(f"warning: {warning}")
        agents: dict[int, AgentHandle] = {}
        handle = AgentRun(self, info, run, transports, agents)
        label = _labeller(plan)
        wait_s = self._wait_gpus_s()
        try:
            build_bundle(run.file(BUNDLE_NAME), plan.code, stand_ins(self.spec))
            with open(run.file(BUNDLE_NAME), "rb") as fh:
                bundle = fh.read()
            opened, started = open_agents(
                transports, {n.node_rank: n.python for n in plan.nodes},
                self.options.start_timeout_s + wait_s,
                first=lambda k, agent: self._prepare(plan, k, agent, bundle, wait_s, console.info),
                run_id=plan.run_id)
            agents.update(started)
            hung = [k for k, exc in opened.failed.items() if isinstance(exc, TimeoutError)]
            if not opened.ok:  # nothing starts: take back what was prepared where we can
                on_all(lambda k: agents[k].call("discard"), [k for k in agents if k not in hung],
                       timeout_s=30)
            if hung and len(hung) == len(opened.failed):
                handle.ended = self._not_joined(info, hung, console)
                return handle
            prepared = opened.values("connecting to the nodes", label)
            placed = {k: gpus for k, (_port, _ifname, gpus, _w) in prepared.items() if gpus}
            try:
                gpuplan.refuse(plan, self.spec, placed, wait_s)
                device = gpuplan.decide_device(plan, self.spec, placed)
                checked = gpuplan.gang_checks(plan, self.spec, placed)
            except ConfigError:  # nothing started: take back the run directories and holds
                on_all(lambda k: agents[k].call("discard"), list(agents), timeout_s=30)
                raise
            waited = {k: w for k, (_port, _ifname, _gpus, w) in prepared.items() if w is not None}
            if waited:
                console.info(gpuplan.wait_over(plan, waited))
            for note in gpuplan.notes(plan, placed) + checked:
                console.info(note)
            handle.resolved(self.dryrun(resolve_plan(
                plan, master_port=prepared[0][0], homes={k: a.home for k, a in agents.items()},
                interfaces={k: ifname for k, (_port, ifname, _gpus, _w) in prepared.items()},
                gpus=gpuplan.choices(placed), device=device,
                cores={k: a.cores for k, a in agents.items()})))
            return handle
        except BaseException:
            handle.close()
            raise

    def reconnect(self, record: RunRecord, *, lines: int | None = None) -> "AgentRun":
        """An agent on every node of a detached run, to follow its keepers."""
        from ..engine.agentlink import open_agents
        from .agentrun import AgentRun

        info = recorded_dryrun(record)
        transports = {n.node_rank: self.transport(n.node_rank, n.host, n.connection)
                      for n in record.nodes}
        agents: dict[int, AgentHandle] = {}
        handle = AgentRun(self, info, record.run, transports, agents, watching=True,
                          records=record.nodes, lines=lines)
        try:
            opened, started = open_agents(transports, {n.node_rank: n.python for n in record.nodes},
                                          self.options.start_timeout_s, run_id=record.run_id)
            agents.update(started)
            opened.values("connecting to the nodes", _labeller(info.plan))
            return handle
        except BaseException:
            handle.close()
            raise

    def cancel(self, record: RunRecord) -> list[CancelResult]:
        from ..engine.fanout import on_all

        def down(k: int) -> CancelResult:
            node = record.nodes[k]
            reply = self._ask(record.run_id, node, "down", run_id=record.run_id,
                              node_rank=node.node_rank, run_dir=node.run_dir,
                              grace_s=self.options.grace_s,
                              **({"why": self.options.stopped_by} if self.options.stopped_by
                                 else {}))
            return CancelResult(node.node_rank, node.host, tuple(reply.get("killed") or ()),
                                "" if reply["ok"] else str(reply.get("error")),
                                tuple(reply.get("survivors") or ()))

        done = on_all(down, range(len(record.nodes)), timeout_s=self.options.grace_s + 90)
        return [done.succeeded.get(k) or CancelResult(
            k, record.nodes[k].host, (), _message(done.failed[k]))
            for k in range(len(record.nodes))]

    def prune(self, record: RunRecord) -> list[PruneResult]:
        """Each node's run directory removed by its agent, which refuses a run
        alive there."""
        from ..engine.fanout import on_all

        remote = [n for n in record.nodes if not in_local_run_dir(record, n)]

        def prune(node: NodeRecord) -> PruneResult:
            reply = self._ask(record.run_id, node, "prune", run_dir=node.run_dir,
                              run_id=record.run_id,
                              node_rank=node.node_rank)
            return PruneResult(node.node_rank, node.host, int(reply.get("freed") or 0),
                               "" if reply.get("ok") else str(reply.get("error")),
                               bool(reply.get("live")))

        done = on_all(lambda k: prune(record.nodes[k]), [n.node_rank for n in remote],
                      timeout_s=self.options.check_timeout_s + 60)
        out = [PruneResult(n.node_rank, n.host, remote=False) for n in record.nodes
               if n not in remote]
        out += [done.succeeded.get(n.node_rank) or PruneResult(
            n.node_rank, n.host, error=_message(done.failed[n.node_rank])) for n in remote]
        return sorted(out, key=lambda r: r.node_rank)

    def describe(self, record: RunRecord) -> RunDescription:
        """A detached run's state, as its nodes' keepers say it."""
        if not record.owner.detached or not record.live:
            return super().describe(record)  # its records say it: no engine to import
        return self.kept_status(record, lambda node: self._ask(
            record.run_id, node, "keeper", run_dir=node.run_dir))

    def watch(self) -> Watch:
        return _KeeperWatch(self)

    def kept_status(self, record: RunRecord, ask: Callable[["NodeRecord"], dict]
                    ) -> RunDescription:
        """A detached run from each node's ``keeper`` reply (every node at once)."""
        from ..engine.fanout import on_all
        from ..engine.keptgang import kept_status

        info = recorded_dryrun(record)

        def checked(k: int) -> dict:
            reply = ask(record.nodes[k])
            if not reply.get("ok"):
                raise TransportError(record.nodes[k].host, str(reply.get("error")))
            return reply

        done = on_all(checked, range(len(record.nodes)), timeout_s=self.options.check_timeout_s)
        return kept_status(record, info.plan, done.succeeded,
                           {k: _message(exc) for k, exc in done.failed.items()})

    def stacks(self, record: RunRecord, native: bool = False) -> StacksResult:
        return self.stacks_of(record.run_id, record.nodes, native)

    def stacks_of(self, run_id: str, nodes: Sequence[NodeRecord],
                  native: bool = False) -> StacksResult:
        """One agent per host (a host may hold several nodes), all at once."""
        from ..engine.fanout import on_all
        from ..engine.stacks import STACKS_TIMEOUT_S, StacksResult, rank_stacks

        hosts: dict[str, list[int]] = {}  # one agent per way of reaching a host
        for node in nodes:
            key = f"{node.host} {json.dumps(dict(node.connection), sort_keys=True)}"
            hosts.setdefault(key, []).append(node.node_rank)

        def ask(host: str) -> list[dict]:
            first = nodes[hosts[host][0]]
            reply = self._ask(run_id, first, "stacks", run_id=run_id, native=native,
                              timeout=STACKS_TIMEOUT_S, max_reply=256 << 20,
                              run_dirs={k: nodes[k].run_dir for k in hosts[host]})
            if not reply.get("ok"):
                raise TransportError(first.host, str(reply.get("error")))
            return rank_stacks(json.loads(reply.get("data") or b"[]"), nodes)

        done = on_all(ask, list(hosts), timeout_s=STACKS_TIMEOUT_S + 60)
        ranks = [stack for found in done.succeeded.values() for stack in found]
        unreachable = [(k, nodes[k].host, _message(exc)) for host, exc in done.failed.items()
                       for k in hosts[host]]
        return StacksResult(tuple(sorted(ranks, key=lambda r: r.rank)), tuple(unreachable))

    def check(self, plan: RunPlan) -> Preflight:
        from ..engine.preflight import run_checks

        transports = {n.node_rank: self._node_transport(n) for n in plan.nodes}
        try:
            return run_checks(plan, transports, self.where, self.options.check_timeout_s,
                              self.spec)
        finally:
            for transport in transports.values():
                transport.close()

    # -- helpers ------------------------------------------------------------

    def _ask(self, run: str, node: NodeRecord, op: str, /, **fields: Any) -> dict:
        """One request to a recorded node over a fresh agent, which then exits."""
        transport = self.transport(node.node_rank, node.host, node.connection)
        try:
            return _call(transport, node.python, run, op, **fields)
        finally:
            transport.close()

    def _not_joined(self, info: DryRun, hung: list[int], console: Console) -> RunOutcome:
        """Nodes whose agent never answered within the start timeout fail the
        run as not joined."""
        from ..engine.nodestate import NodeFacts, NodePhase, node_outcome
        from ..records.outcome import EndReason, gang_outcome

        label = _labeller(info.plan)
        timeout = self.options.start_timeout_s
        console.info(f"the rendezvous did not complete within {timeout:g}s; not joined: "
                     + ", ".join(label(k) for k in hung) + "; stopping every node")
        no_answer = NodeFacts(ended_at=time.time(), found=EndReason.NO_ANSWER, words=(
            f"did not join the rendezvous before the start timeout (no answer from the node "
            f"within {timeout:g}s)"))
        nodes = tuple(node_outcome(n, no_answer if n.node_rank in hung else NodeFacts(),
                                   NodePhase.NEW) for n in info.plan.nodes)
        return gang_outcome(info.plan.run_id, nodes, timeout, interrupted=False)

    def _wait_gpus_s(self) -> float:
        """Seconds to wait for free GPUs: ``--wait-gpus``, else ``gpu_policy.wait``."""
        if self.options.wait_gpus_s is not None:
            return self.options.wait_gpus_s
        return self.spec.wait_gpus if self.spec else 0.0

    def _prepare(self, plan: RunPlan, k: int, agent: AgentHandle, bundle: bytes, wait_s: float,
                 say: Callable[[str], None]
                 ) -> tuple[int | None, str | None, dict | None, float | None]:
        """Everything a node needs before its supervisor starts, sent in one go
        behind the agent (no round trip waits on the node's shell); torch is
        asked first, so its import overlaps the rest. Returns the port (node
        0), the interface, the GPU answer and the GPU wait (None: none)."""
        from ..engine import gpuplan
        from ..engine.nodespec import BUNDLE_NAME
        from ..engine.netfacts import (bind_request, interface_from, master_port_from,
                                       route_request, slow_link)

        node = plan.nodes[k]
        gpus = gpuplan.gpu_request(plan, node, self.spec, self.options.allow_busy_gpus)
        probe_torch = gpus is not None and gpuplan.wants_torch(plan, node)
        if probe_torch:
            agent.send("torch")
        agent.send("mkrun", run_dir=node.run_dir, root=self._root(node))
        agent.send_put(bundle, f"{node.run_dir}/{BUNDLE_NAME}")
        if k == 0:
            agent.send("bind", **bind_request(plan, hold=True))
        route = route_request(plan, node)
        if route is not None:
            agent.send("route", **route)
        if gpus is not None:
            agent.send("gpus", **gpus)
        if probe_torch:
            agent.reply("torch")
        made = agent.reply("mkrun")
        if not made["ok"]:
            raise TransportError(agent.host, str(made.get("error")))
        agent.put_done(f"{node.run_dir}/{BUNDLE_NAME}")
        port = master_port_from(plan, agent.reply("bind")) if k == 0 else None
        routed = agent.reply("route") if route is not None else None
        ifname = interface_from(node, routed) if routed is not None else None
        slower = slow_link(node, routed) if routed is not None else None
        if slower:
            say(f"warning: {_labeller(plan)(k)}: {slower}")
        placed, waited = None, None
        if gpus is not None:
            def ask(reply: object) -> dict:
                return gpuplan.checked(reply, agent.host, torch=probe_torch)

            first = ask(agent.reply("gpus"))
            began = time.monotonic()
            placed = gpuplan.wait_for_gpus(first, lambda: ask(agent.call("gpus", **gpus)),
                                           wait_s, say, _labeller(plan)(k), gpus["want"])
            if placed.get("ok") and not first.get("ok"):
                waited = time.monotonic() - began
        return port, ifname, placed, waited

    def _root(self, node: NodePlan) -> str:
        """Where a node's run directory may be created."""
        return os.path.dirname(node.run_dir) if node.is_local else self.require_spec().workdir

    def _node_transport(self, node: NodePlan) -> Transport:
        return self.transport(node.node_rank, node.host, self.connection(node.node_rank))

    def sweep_lost(self, info: DryRun, transports: Mapping[int, Transport],
                   outcome: RunOutcome, run: RunDir, silent: set[int] = frozenset()) -> None:
        """A node whose agent vanished may still run the job: end what is left
        there over a fresh connection (its guardian should have). Not a node
        in ``silent``: a fresh connection would only wait out the connect
        timeout on the same dead path, and its supervisor tears the run down
        itself, at most ``PEER_TIMEOUT_S`` after our last ping."""
        from ..engine.fanout import on_all
        from ..engine.nodestate import describe_survivors
        from ..records.outcome import NodeState

        lost = [o.node_rank for o in outcome.nodes
                if o.state is NodeState.LOST and o.node_rank not in silent]
        for k in sorted(silent):
            run.note(k, f"node silent: its supervisor tears the run down by itself; run "
                        f"`ddp-orch down {info.plan.run_id}` once it is reachable to check")

        def sweep(k: int) -> None:
            node = info.plan.nodes[k]
            reply = _call(transports[k], node.python, info.plan.run_id, "down",
                          run_id=info.plan.run_id,
                          node_rank=k, run_dir=node.run_dir, grace_s=self.options.grace_s)
            killed = reply.get("killed") or []
            run.note(k, f"node lost; down ended {len(killed)} leftover process(es)"
                  + (f": {' '.join(map(str, killed))}" if killed else "")
                  + (f"; {describe_survivors(reply['survivors'])}" if reply.get("survivors")
                     else ""))

        for k, exc in on_all(sweep, lost, timeout_s=self.options.grace_s + 60).failed.items():
            run.note(k, f"node lost, and it cannot be reached to clean up: {_message(exc)}; "
                          f"run `ddp-orch down {info.plan.run_id}` once it is back")

    def fetch_results(self, info: DryRun, transports: Mapping[int, Transport],
                      outcome: RunOutcome, run: RunDir,
                      reusable: Mapping[int, AgentHandle],
                      unreachable: set[int] = frozenset()) -> dict | None:
        """Bring home ``results.wanted_files``, over the run's channel where
        still open, else a fresh agent. Best effort: a failure is a note in
        the node's log; nodes in ``unreachable`` are not tried."""
        from ..engine.agentlink import AgentHandle
        from ..engine.fanout import on_all
        from ..engine.results import fetch_outputs, store_fetched, wanted_files

        wanted = wanted_files(info, outcome)
        for k in sorted(unreachable & set(wanted)):
            files = ", ".join(f.remote for f in wanted.pop(k))
            run.note(k, f"not fetched: the node could not be reached at the end of the run; "
                        f"its files stay there ({files})")

        def fetch(k: int) -> None:
            agent = reusable.get(k) or AgentHandle(transports[k], info.plan.nodes[k].python,
                                                   run_id=info.plan.run_id)
            try:
                for file in wanted[k]:
                    try:
                        data = agent.get(file.remote, file.limit)
                    except TransportError as exc:
                        run.note(k, f"not fetched: {exc.message}")
                        continue
                    if data is not None:
                        store_fetched(run, info, k, file, data)
                if k == 0:  # the run's outputs: node 0's, under its code root
                    fetch_outputs(info, run, lambda **request: agent.call(
                        "outputs", **request), lambda path, limit: agent.get(
                        path, limit, root=info.plan.nodes[0].code_root))
            finally:
                if k not in reusable:
                    agent.close()

        # outputs: may be many and large (results.MAX_OUTPUTS_BYTES): more time
        for k, exc in on_all(fetch, wanted,
                             timeout_s=120 + (1200 if info.plan.outputs else 0)).failed.items():
            run.note(k, f"fetching results failed: {_message(exc)}")
        result = run.result()
        return result if isinstance(result, dict) else None


class _KeeperWatch(Watch):
    """A detached run's keepers asked again and again (``top``) through one
    agent per node, kept between looks: one SSH session, not one per
    refresh. A failed agent is reopened at the next look; a slow one is not
    asked again until it has answered."""

    def __init__(self, backend: AgentBackend):
        super().__init__(backend)
        self.backend: AgentBackend = backend
        self.agents: dict[int, AgentHandle] = {}
        self.busy: dict[int, threading.Lock] = {}

    def look(self, record: RunRecord) -> RunDescription:
        if not record.owner.detached or not record.live:
            return self.backend.describe(record)
        return self.backend.kept_status(record, lambda node: self._keeper(record, node))

    def _keeper(self, record: RunRecord, node: "NodeRecord") -> dict:
        from ..engine.agentlink import AgentHandle

        busy = self.busy.setdefault(node.node_rank, threading.Lock())
        if not busy.acquire(blocking=False):
            raise TransportError(node.host, "its agent has not answered the last look yet")
        try:
            agent = self.agents.get(node.node_rank)
            if agent is None:
                transport = self.backend.transport(node.node_rank, node.host, node.connection)
                try:
                    agent = AgentHandle(transport, node.python, run_id=record.run_id)
                except BaseException:
                    transport.close()
                    raise
                self.agents[node.node_rank] = agent
            try:
                return agent.call("keeper", run_dir=node.run_dir)
            except BaseException:
                self.agents.pop(node.node_rank, None)
                _close_agent(agent)
                raise
        finally:
            busy.release()

    def close(self) -> None:
        for agent in self.agents.values():
            _close_agent(agent)
        self.agents.clear()


def _close_agent(agent: "AgentHandle") -> None:
    try:
        agent.close()
    finally:
        agent.transport.close()


def _call(transport: Transport, python: str, run: str, op: str, /, **fields: Any) -> dict:
    """One request over a fresh agent (marked as run ``run``'s), which then exits."""
    from ..engine.agentlink import AgentHandle

    agent = AgentHandle(transport, python, run_id=run)
    try:
        return agent.call(op, **fields)
    finally:
        agent.close()


def _labeller(plan: RunPlan):
    return lambda k: f"node {k} ({plan.nodes[k].host})"


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__
