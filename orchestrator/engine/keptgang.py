"""The controller's side of a kept run: start the keepers, follow them, judge.

A kept run (``up --detach``, ``up --max-restarts N``) is held together by
its nodes' keepers (``agent/kept/keeper.py``), not by the controller. Here the
controller:

* starts them: node 0's first (its reply is the gang's port), then the
  rest at once, each with the node's supervisor spec, exactly the
  dry-run's, and the run's random gang token;
* follows each node's stream (``agent.out``, through ``serve``'s
  ``follow``) with the same ``NodeHandle`` relay as an attached run, so the
  output, the logs and the progress look the same;
* returns when every node has started (``--detach``) or when every
  keeper has finished, and builds the outcome from node 0's record of
  every attempt.

``attach`` is the same gang without the start: it follows what runs.
Ctrl-C while attached with restarts stops the run (the attached rule);
Ctrl-C in ``attach`` only leaves it.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Mapping

from ..agent.kept.records import clean_attempts
from ..agent.node.spec import SupervisorSpec
from ..agent.wire.protocol import KeptRule
from ..errors import TransportError
from ..records.outcome import AttemptOutcome, NodeOutcome, NodeState, RunOutcome, RunState, \
    gang_outcome
from .fanout import on_all
from .gang import Gang, wait_all
from .nodehandle import exit_outcome, supervisor_spec

DETACHED, ATTACHED = KeptRule.DETACHED, KeptRule.ATTACHED  # the liveness rules of a kept run


def keeper_spec(sup: SupervisorSpec, *, nnodes: int, token: str, master_addr: str,
                gang_port: int, max_restarts: int, start_timeout_s: float, rule: str) -> dict:
    return {"supervisor": sup.to_dict(), "nnodes": nnodes, "max_restarts": max_restarts,
            "start_timeout_s": start_timeout_s, "rule": rule,
            "gang": {"addr": master_addr, "port": gang_port, "token": token}}


class KeptGang(Gang):
    """``run()``: start (unless attaching) and follow a kept run."""

    def __init__(self, *args, start: bool, detach: bool, rule: str, max_restarts: int = 0,
                 offset: int = 0, lines: int | None = None, **kwargs):
        super().__init__(*args, release_setup=False, **kwargs)  # the keepers' own barrier
        self.start, self.detach, self.rule = start, detach, rule
        self.max_restarts = max_restarts
        self.offset, self.lines = offset, lines  # where to follow from (attach)
        self.keepers_started: set[int] = set()
        self.lost_contact = ""  # why the controller left, when it was not asked to

    def run(self) -> RunOutcome:
        began = time.monotonic()
        by_rank = {h.node.node_rank: h for h in self.handles}
        try:
            self._begin(by_rank)
        except BaseException:
            if self.start:  # keepers that nobody follows must not run on: end them
                self._down_started(by_rank)
            for handle in self.handles:
                handle.agent.close(timeout_s=2.0)
            raise
        try:
            # The followers hear us (``ping``): an attached run's follower stops
            # its keeper after PEER_TIMEOUT_S of silence.
            threading.Thread(target=self._ping, daemon=True, name="kept-ping").start()
            self._watch()
        except KeyboardInterrupt:
            if self.start and not self.detach:  # the attached rule: Ctrl-C stops the run
                self.interrupted = True
                self.console.always("ddp-orch: interrupted; stopping every node "
                                    "(press Ctrl-C again to kill at once)")
                self._stop_all("interrupted")
                self._await_finish()
            else:
                self.left = True
        finally:
            self._over.set()
            for handle in self.handles:
                if self.left or handle.control is None:
                    handle.agent.close(timeout_s=2.0)  # the follower leaves; the run goes on
        return self._outcome(time.monotonic() - began)

    def _begin(self, by_rank: Mapping) -> None:
        """Start the keepers (unless attaching), then follow every node."""
        if self.start:
            self._start_keepers(by_rank)
        for handle in self.handles:  # from the start, the stream is the whole log
            handle.log_mode = "ab" if self.start or self.lines is not None else "wb"
        on_all(lambda k: by_rank[k].follow(
            run_dir=by_rank[k].node.run_dir, attached=self.rule == ATTACHED and not self.detach,
            **({"lines": self.lines} if self.lines is not None else {"offset": self.offset})),
            by_rank).values("following the nodes", self._label)

    def _down_started(self, by_rank: Mapping) -> None:
        """``down`` on every node whose keeper was started, over the channel
        that started it (still answering requests: no ``follow`` was sent)."""
        def down(k: int) -> None:
            node = by_rank[k].node
            by_rank[k].agent.call("down", run_id=self.plan.run_id, node_rank=k,
                                  run_dir=node.run_dir, grace_s=self.grace_s)

        done = on_all(down, sorted(self.keepers_started), timeout_s=self.grace_s + 45)
        for k, exc in done.failed.items():
            self.run_dir.note(k, f"could not end the keeper after a failed start: {exc}; "
                                 f"run `ddp-orch down {self.plan.run_id}`")

    def _start_keepers(self, by_rank: Mapping) -> None:
        token = secrets.token_hex(16)
        port = int(self.plan.master_port)
        specs = {k: supervisor_spec(h.launch, self.plan.run_id, port, self.grace_s)
                 for k, h in by_rank.items()}

        def start(k: int, gang_port: int) -> int:
            reply = by_rank[k].agent.call("detach", listen=k == 0, spec=keeper_spec(
                specs[k], nnodes=len(self.handles), token=token, master_addr=self.plan.master_addr,
                gang_port=gang_port, max_restarts=self.max_restarts,
                start_timeout_s=self.start_timeout_s, rule=DETACHED if self.detach else ATTACHED))
            if not reply.get("ok"):
                raise TransportError(by_rank[k].node.host, f"the keeper did not start: "
                                                           f"{reply.get('error')}")
            self.keepers_started.add(k)
            return int(reply.get("gang_port") or 0)

        gang_port = start(0, 0)
        on_all(lambda k: start(k, gang_port), [k for k in by_rank if k != 0]).values(
            "starting the keepers", self._label)
        what = "detached" if self.detach else f"up to {self.max_restarts} gang restart(s)"
        self.console.info(f"started {self.plan.world_size} processes on {len(self.handles)} "
                          f"node(s), kept by their agents ({what}); logs in {self.run_dir.path}")

    def _watch(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self._changed.clear()
            if all(h.control is not None for h in self.handles):
                return
            gone = [h for h in self.handles if h.control is None and h.poll() is not None]
            silent = [h for h in self.handles if h.silent]
            if gone or silent:
                names = ", ".join(self._label(h.node.node_rank) for h in gone + silent)
                for handle in gone + silent:
                    handle.partitioned = True
                if self.detach or not self.start:  # the nodes own the run: leave it to them
                    self.left = True
                    self.lost_contact = f"lost contact with {names}"
                    self.console.info(f"{self.lost_contact}; the run goes on there under "
                                      f"its keepers")
                    return
                # The attached rule: that node's follower stops its keeper; stop the rest.
                self._stop_all(f"lost contact with {names}")
                self._await_finish()
                return
            if self.detach and all(h.started for h in self.handles):
                self.left = True
                return
            if self._setup_pending():  # the start timeout counts once every setup is done
                deadline = time.monotonic() + self.start_timeout_s
            if self.start and not all(h.started for h in self.handles) and \
                    time.monotonic() > deadline and all(h.attempt == 0 for h in self.handles):
                self._give_up_start()
                self._await_finish()
                return
            self._report_progress()
            self._changed.wait(0.5)

    def _await_finish(self) -> None:
        """Until every keeper has finished (``poll`` gives the code of its
        ``finished`` event), bounded by the grace period."""
        wait_all(self.handles, self.grace_s + 30.0)

    def _outcome(self, wall_s: float) -> RunOutcome:
        """From node 0's record of every attempt (its ``finished`` event), or
        while the run goes on (detached, left), what is known so far."""
        for handle in self.handles:
            if handle._relay is not None and handle.control is not None:
                handle._relay.join(5.0)
        head = self.handles[0].control if self.handles else None
        if self.left:
            nodes = tuple(self._so_far(h) for h in self.handles)
            return RunOutcome(self.plan.run_id, RunState.RUNNING, wall_s, nodes, None, None)
        if head is None:  # node 0 is out of reach: what each node said, or lost
            return gang_outcome(self.plan.run_id, tuple(self._so_far(h) for h in self.handles),
                                wall_s, interrupted=self.interrupted)
        notes: list[str] = []
        attempts = attempt_outcomes(self.plan, head.get("attempts") or [], notes)
        for note in notes:  # node 0's record is checked, never trusted
            self.run_dir.note(0, note)
        last = attempts[-1][1] if attempts else tuple(self._so_far(h) for h in self.handles)
        outcome = gang_outcome(self.plan.run_id, last, wall_s,
                               interrupted=self.interrupted or head.get("state") == "interrupted")
        return RunOutcome(outcome.run_id, outcome.state, wall_s, outcome.nodes,
                          outcome.root_cause, None, tuple(a for a, _ in attempts))

    def _so_far(self, handle) -> NodeOutcome:
        if handle.exits and handle.control is not None:
            return exit_outcome(handle.node, handle.exits[-1], handle.stop_sent, handle.ended_at)
        if handle.partitioned:
            return NodeOutcome(handle.node.node_rank, handle.node.host, NodeState.LOST, None,
                               "lost contact with the node's follower (a dropped connection "
                               "or a silent partition); its keeper stops on its own", None)
        state = "started" if handle.started else "joined" if handle.joined else "starting"
        return NodeOutcome(handle.node.node_rank, handle.node.host, NodeState.NOT_STARTED
                           if not handle.supervising else NodeState.STOPPED, None,
                           f"running (attempt {handle.attempt}, {state})", None)


def attempt_outcomes(plan, recorded: object, notes: list[str] | None = None,
                     ) -> list[tuple[AttemptOutcome, tuple[NodeOutcome, ...]]]:
    """Node 0's record of each attempt as outcomes; each node's part is its
    supervisor's exit event, ``stop_asked`` when the head stopped it, or
    ``lost`` when its keeper could not be heard. The record is checked first
    (``agent/kept/records.py``): what is malformed is left out, with a line in
    ``notes``."""
    out = []
    for entry in clean_attempts(recorded, [] if notes is None else notes):
        nodes = []
        for node in plan.nodes:
            part = entry["nodes"].get(str(node.node_rank))
            if not isinstance(part, dict):
                part = {"lost": "no report"}
            if "lost" in part:
                nodes.append(NodeOutcome(node.node_rank, node.host, NodeState.LOST, None,
                                         f"its keeper could not be heard: {part['lost']}",
                                         None))
            else:
                nodes.append(exit_outcome(node, part, bool(part.get("stop_asked")),
                                          part.get("stopped_at")))
        ran = gang_outcome(plan.run_id, tuple(nodes), 0.0,
                           interrupted=entry.get("state") == "interrupted")
        note = "restarting" if entry.get("restart") else \
            f"no restart: {entry['no_restart']}" if entry.get("no_restart") else ""
        out.append((AttemptOutcome(int(entry.get("attempt", len(out))),
                                   int(entry.get("master_port", 0)), ran.state,
                                   ran.root_cause, note), tuple(nodes)))
    return out

