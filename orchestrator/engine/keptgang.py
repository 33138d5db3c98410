"""The controller's side of a kept run: start the keepers, judge from node 0's record.

A kept run (``up --detach``, ``--max-restarts N``) is held together by its
nodes' keepers, not by the controller, which starts them (node 0's first:
its reply is the gang's port), follows each node's stream with the same
``NodeHandle`` relay as an attached run, and builds the outcome from the
record node 0 keeps of every attempt. The keepers judge each attempt with
the controller's rule (``agent/gangrule.py``), the hang rule included.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from ..agent.kept.records import clean_attempts, clean_keeper_state
from ..agent.kept.spec import GangPort, KeeperSpec
from ..agent.node.spec import SupervisorSpec
from ..agent.wire.protocol import PEER_TIMEOUT_S, is_time
from ..errors import TransportError
from ..records.outcome import AttemptOutcome, EndReason, NodeOutcome, RunDescription, \
    RunOutcome, RunState, gang_outcome
from .fanout import on_all
from .nodespec import supervisor_spec
from .nodestate import Ask, NodeFacts, NodePlace, node_outcome

if TYPE_CHECKING:
    from ..records.store import RunRecord


def keeper_spec(sup: SupervisorSpec, *, nnodes: int, token: str, master_addr: str,
                gang_port: int, max_restarts: int, start_timeout_s: float,
                hang_timeout_s: float | None = None) -> KeeperSpec:
    """A node's keeper's spec: its supervisor's and the gang's."""
    return KeeperSpec(sup, nnodes, start_timeout_s, GangPort(master_addr, gang_port, token),
                      max_restarts, hang_timeout_s)


@dataclass(frozen=True)
class Keepers:
    """A kept run to start: its restarts (``--max-restarts``)."""

    max_restarts: int = 0


def begin_kept(gang, by_rank: Mapping) -> None:
    """Start the keepers (unless attaching), then follow every node. On any
    failure, keepers nobody would follow are ended and the channels closed."""
    try:
        if gang.keepers is not None:
            _start_keepers(gang, by_rank)
        for handle in gang.handles:  # from the start, the stream is the whole log
            handle.log_mode = "ab" if gang.keepers is not None or gang.lines is not None \
                else "wb"
        # the run ends with this controller: it started the keepers, attached
        attached = gang.keepers is not None and gang.owner.ends_with_controller
        on_all(lambda k: by_rank[k].follow(
            run_dir=by_rank[k].node.run_dir, attached=attached,
            **({"lines": gang.lines} if gang.lines is not None else {"offset": 0})),
            by_rank).values("following the nodes", gang.label)
    except BaseException:
        if gang.keepers is not None:  # keepers that nobody follows must not run on: end them
            _down_started(gang, by_rank)
        for handle in gang.handles:
            handle.agent.close(timeout_s=2.0)
        raise


def _down_started(gang, by_rank: Mapping) -> None:
    """``down`` on every node whose keeper was started, over the channel
    that started it (no ``follow`` sent yet, so it still answers)."""
    def down(k: int) -> None:
        node = by_rank[k].node
        by_rank[k].agent.call("down", run_id=gang.plan.run_id, node_rank=k,
                              run_dir=node.run_dir, grace_s=gang.grace_s)

    done = on_all(down, sorted(gang.keepers_started), timeout_s=gang.grace_s + 45)
    for k, exc in done.failed.items():
        gang.run_dir.note(k, f"could not end the keeper after a failed start: {exc}; "
                             f"run `ddp-orch down {gang.plan.run_id}`")


def _start_keepers(gang, by_rank: Mapping) -> None:
    plan = gang.plan
    token = secrets.token_hex(16)
    port = int(plan.master_port)
    specs = {k: supervisor_spec(h.launch, plan.run_id, port, gang.grace_s, gang.owner)
             for k, h in by_rank.items()}

    def start(k: int, gang_port: int) -> int:
        reply = by_rank[k].agent.call("detach", listen=k == 0, spec=keeper_spec(
            specs[k], nnodes=len(gang.handles), token=token, master_addr=plan.master_addr,
            gang_port=gang_port, max_restarts=gang.keepers.max_restarts,
            start_timeout_s=gang.start_timeout_s,
            hang_timeout_s=gang.hang_timeout_s).to_dict())
        if not reply.get("ok"):
            raise TransportError(by_rank[k].node.host, f"the keeper did not start: "
                                                       f"{reply.get('error')}")
        gang.keepers_started.add(k)
        return int(reply.get("gang_port") or 0)

    gang_port = start(0, 0)
    on_all(lambda k: start(k, gang_port), [k for k in by_rank if k != 0]).values(
        "starting the keepers", gang.label)
    what = "detached" if gang.owner.detached \
        else f"up to {gang.keepers.max_restarts} gang restart(s)"
    if plan.setup:  # no rank exists yet: each node's keeper runs its setup first
        gang.console.milestone(f"started the keepers on {len(gang.handles)} node(s) ({what}); "
                               f"each runs setup:, then its share of {plan.world_size} "
                               f"processes; logs in {gang.run_dir.path}")
    else:
        gang.console.milestone(f"started {plan.world_size} processes on {len(gang.handles)} "
                               f"node(s), kept by their agents ({what}); logs in "
                               f"{gang.run_dir.path}")


def contact_lost(gang) -> bool:
    """A node's follower gone or silent: True once the gang has acted on it.
    Where the nodes own the run (detached, attach) we leave it to them; an
    attached kept run stops, and the outcome names the node we lost, not the
    stop it caused."""
    gone = [h for h in gang.handles if h.control is None and h.poll() is not None]
    silent = [h for h in gang.handles if h.silent and h not in gone]
    if not (gone or silent):
        return False
    for handle in gone:  # its follower ended: the link dropped, or we were paused too long
        handle.facts.find(EndReason.FOLLOWER_LOST, gang.paused_words() or (
            "lost contact with the node's follower (a dropped connection); its keeper "
            "stops the run there on its own"))
    for handle in silent:
        handle.facts.find(EndReason.SILENT, (
            f"nothing from the node for {PEER_TIMEOUT_S:g}s (a silent partition or a frozen "
            f"node); its keeper stops the run there after {PEER_TIMEOUT_S:g}s without us"))
    names = ", ".join(gang.label(h.node.node_rank) for h in gone + silent)
    if gang.leaves or gang.keepers is None:
        gang.left = True
        gang.lost_contact = f"lost contact with {names}"
        gang.console.info(f"{gang.lost_contact}; the run goes on there under its keepers")
        return True
    gang.stop_all(f"{names} silent for {PEER_TIMEOUT_S:g}s" if not gone
                   else f"lost contact with {names}")
    gang.await_finish()
    return True


def kept_outcome(gang, wall_s: float) -> RunOutcome:
    """From node 0's record of every attempt, or what is known so far while
    the run goes on."""
    plan = gang.plan
    for handle in gang.handles:
        if handle.control is not None:
            handle.drain(5.0)
    head = gang.handles[0].control if gang.handles else None
    if gang.left:
        nodes = tuple(_so_far(h) for h in gang.handles)
        return RunOutcome(plan.run_id, RunState.RUNNING, wall_s, nodes, None, None)
    if head is None:  # node 0 is out of reach: what each node said, or lost
        return gang_outcome(plan.run_id, tuple(_so_far(h) for h in gang.handles),
                            wall_s, interrupted=gang.interrupted)
    notes: list[str] = []
    attempts = attempt_outcomes(plan, head.get("attempts") or [], notes)
    for note in notes:  # node 0's record is checked, never trusted
        gang.run_dir.note(0, note)
    last = attempts[-1][1] if attempts else tuple(_so_far(h) for h in gang.handles)
    # The nodes we lost: the keepers record a stop on purpose (ours, and the
    # lost node's follower's); the run failed, and they are why.
    lost = {h.node.node_rank: h for h in gang.handles if h.given_up}
    last = tuple(_so_far(lost[o.node_rank]) if o.node_rank in lost else o for o in last)
    stopped_by_us = bool(lost) and not gang.interrupted
    interrupted = head.get("state") == RunState.INTERRUPTED and not stopped_by_us
    outcome = gang_outcome(plan.run_id, last, wall_s,
                           interrupted=gang.interrupted or interrupted)
    return RunOutcome(outcome.run_id, outcome.state, wall_s, outcome.nodes,
                      outcome.root_cause, None, tuple(a for a, _ in attempts))


def _so_far(handle) -> NodeOutcome:
    """A kept run's node as its follower knows it: its last attempt's end,
    lost, or still running."""
    if handle.given_up:
        return node_outcome(handle.node, handle.facts, handle.phase, handle.asked)
    if handle.exits and handle.control is not None:
        return node_outcome(handle.node, NodeFacts(handle.exits[-1], ended_at=handle.facts.ended_at),
                            handle.phase, handle.asked)
    state = "started" if handle.started else "joined" if handle.joined else "starting"
    facts = NodeFacts(found=EndReason.RUNNING, words=f"running (attempt {handle.attempt}, {state})")
    return node_outcome(handle.node, facts, handle.phase)


def attempt_outcomes(plan, recorded: object, notes: list[str] | None = None,
                     ) -> list[tuple[AttemptOutcome, tuple[NodeOutcome, ...]]]:
    """Node 0's record of each attempt as outcomes. The record is checked
    first: what is malformed is left out, with a line in ``notes``."""
    out = []
    for entry in clean_attempts(recorded, [] if notes is None else notes):
        nodes = []
        for node in plan.nodes:
            part = entry["nodes"].get(str(node.node_rank))
            if not isinstance(part, dict):
                part = {"lost": "no report"}
            if part.get("hung"):  # the keepers' hang rule named this node
                facts = NodeFacts(code=part.get("code"), ended_at=part.get("stopped_at"),
                                  found=EndReason.HUNG, words=part["hung"])
            elif "lost" in part:
                facts = NodeFacts(found=EndReason.KEEPER_UNHEARD,
                                  words=f"its keeper could not be heard: {part['lost']}")
            else:
                facts = NodeFacts(part, ended_at=part.get("stopped_at"))
            nodes.append(node_outcome(node, facts, asked=Ask.STOP if part.get("stop_asked")
                                      else Ask.NOTHING))
        ran = gang_outcome(plan.run_id, tuple(nodes), 0.0,
                           interrupted=entry.get("state") == RunState.INTERRUPTED)
        note = "restarting" if entry.get("restart") else \
            f"no restart: {entry['no_restart']}" if entry.get("no_restart") else ""
        out.append((AttemptOutcome(int(entry.get("attempt", len(out))),
                                   int(entry.get("master_port", 0)), ran.state,
                                   ran.root_cause, note), tuple(nodes)))
    return out


def kept_status(record: "RunRecord", plan, replies: Mapping[int, dict],
                unreachable: Mapping[int, str]) -> RunDescription:
    """A live detached run as its nodes' keepers say it (``status``, ``ps``).
    Once over, outcomes come from node 0's record; until then each keeper
    says how far its node is. A bad record is a note, never a crash."""
    notes: dict[int, list[str]] = {k: [] for k in range(len(record.nodes))}
    # Each keeper's record, checked field by field: a node's bad record
    # is ignored with a note, never a crash of ``status`` or ``ps``.
    kept_by = {k: clean_keeper_state(reply.get("keeper"), notes[k]) or {}
               for k, reply in replies.items()}
    noted = [f"  node {k}: {note}" for k in sorted(notes) for note in notes[k]]
    head = kept_by.get(0) or {}
    if head.get("state") not in (None, RunState.RUNNING) and isinstance(head.get("attempts"), list):
        for k in sorted(notes):  # the run is over: said once, as the record settles
            for note in notes[k]:
                record.run.note(k, note)
        attempts = attempt_outcomes(plan, head["attempts"])
        ran = gang_outcome(record.run_id, attempts[-1][1] if attempts else (), 0.0,
                           interrupted=head["state"] == RunState.INTERRUPTED)
        ended = head.get("updated")
        return RunDescription(ran.state, ran.nodes, ran.root_cause,
                              "\n".join([f"ended {_when(ended)}, as node 0's keeper "
                                         "recorded"] + noted),
                              tuple(a for a, _ in attempts), ended)
    lines, gone = [], []
    for k, node in enumerate(record.nodes):
        reply = replies.get(k)
        kept = kept_by.get(k) or {}
        if reply is None:
            lines.append(f"  node {k} ({node.host}): cannot be reached: "
                         f"{unreachable.get(k, 'no answer')}")
        elif reply.get("alive"):
            lines.append(f"  node {k} ({node.host}): running, attempt {kept.get('attempt', 0)}")
        elif kept.get("state") not in (None, RunState.RUNNING):
            lines.append(f"  node {k} ({node.host}): {kept['state']} "
                         f"(exit {kept.get('code')})")
        else:  # recorded as running, but its keeper is not: killed
            facts = NodeFacts(code=kept.get("code"), ended_at=kept.get("updated"),
                              found=EndReason.KEEPER_GONE)
            gone.append(node_outcome(NodePlace(k, node.host), facts))
            lines.append(f"  node {k} ({node.host}): its keeper is gone without finishing")
    detail = "the nodes say:\n" + "\n".join(lines + noted)
    # Over only on firm ground: every node answered and no keeper runs.
    if unreachable or any(r.get("alive") for r in replies.values()):
        return RunDescription(RunState.RUNNING, (), None, detail,
                              progress=_kept_progress(record, replies, kept_by),
                              attempt=head.get("attempt"))
    return RunDescription(RunState.FAILED, tuple(gone), gone[0] if gone else None, detail)


def _kept_progress(record: "RunRecord", replies: Mapping[int, dict],
                   kept_by: Mapping[int, dict]) -> tuple[dict, ...]:
    """Each rank's last step as the live keepers recorded it, its times
    moved from the node's clock to ours."""
    ranks = []
    for k, kept in kept_by.items():
        reply = replies[k]
        if not reply.get("alive"):
            continue
        now = reply.get("now")
        skew = time.time() - now if is_time(now) else 0.0
        for rank, seen in (kept.get("progress") or {}).items():
            last = seen["last_progress"]  # the record is cleaned: its GPU fields too
            line = seen.get("last_output")  # absent from an older keeper's record
            step = seen.get("last_step")  # likewise
            ranks.append({**seen, "rank": int(rank), "node_rank": k,
                          "host": record.nodes[k].host,
                          "last_progress": None if last is None else last + skew,
                          "last_output": None if line is None else line + skew,
                          "last_step": None if step is None else step + skew})
    return tuple(sorted(ranks, key=lambda r: r["rank"]))


def _when(stamp: object) -> str:
    if not is_time(stamp):
        return "at an unknown time"
    return "at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
