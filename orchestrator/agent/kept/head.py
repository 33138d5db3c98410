"""Node 0's keeper: the head of a kept run's gang.

It starts each attempt everywhere, judges ``gangrule`` on what the nodes
report, stops every node on the first verdict, records the attempt and
decides on a restart (``restarts.py``) once every node is still linked;
else it ends the run. On a hang it first gathers every node's stacks and
names the odd rank's node.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from . import peers
from .attempts import FULL_ATTEMPTS, MAX_MESSAGE, compact, fit_attempts, shrink
from .keeper import MAX_PLACE, Keeper
from .spec import KeeperSpec
from .restarts import setup_failed, survivors_left, will_recur
from .. import gangrule
from ..node import probes
from ..node.holdings import Holdings
from ..wire.protocol import Event, message, rank_progress
from ..wire.runstate import RunState

ENDED_WAIT_S = 60.0  # after a stop, how long the head waits for a node's report
MAX_BACKOFF_S = 30.0
RULE_POLL_S = 1.0  # how often the head applies the gang's rule (start timeout, hang)
STACKS_WAIT_S = 15.0  # a hang: how long the head waits for every node's stacks


def restart_backoff(restart: int) -> float:
    """Seconds before restart number ``restart`` (1, 2, ...): 1, 2, 4, ... 30."""
    return min(MAX_BACKOFF_S, 2.0 ** (restart - 1))


class Head(Keeper):
    """Node 0's keeper; ``keep`` leads the gang through its attempts."""

    def __init__(self, spec: KeeperSpec, listener: socket.socket | None = None,
                 holdings: Holdings | None = None):
        super().__init__(spec, holdings)
        self.listener = listener  # the gang's port, bound by the daemon
        self.attempts: list[dict] = []  # one record per attempt (``attempts.py``)
        self.shrunk = 0  # how many of the oldest attempts hold less detail
        self.joining_over = False  # every node joined, or the start timed out
        # the gang: the links, and per attempt who ended how
        self.links: dict[int, peers.Link] = {}
        self.lost: dict[int, str] = {}
        self.lost_when: dict[int, dict] = {}  # {lost_at, heard_at} of each lost link
        self.ended: dict[int, dict] = {}
        self.stop_asked: set[int] = set()
        self.setup_ready: set[int] = set()  # whose setup is done (``gang-setup``)
        # this attempt: what the gang's rule (``gangrule``) is judged on
        self.failing: dict[int, int] = {}  # a node's torchrun exited with this code
        self.reported: dict[int, tuple[bool, dict[int, float]]] = {}  # started, rank -> at
        self.clock = gangrule.Clock(time.monotonic())
        self.hung: dict[int, str] = {}  # node -> the hang's root cause (its record's "hung")
        self.hanging = False  # the stacks of a hang are being dumped
        self.places: dict[int, dict[int, str]] = {}  # node -> rank -> place (a hang)
        self.hang_s = spec.hang_timeout_s

    def on_local_stop(self) -> None:
        with self.lock:
            self._stop_all(self.final)
            self.lock.notify_all()

    def tell_progress(self, attempt: int, started: bool, progress: dict) -> None:
        self._progress_from(0, attempt, started, progress)

    def setup_done_here(self) -> None:
        self._setup_done_on(0)

    def attempts_done(self) -> int:
        return len(self.attempts)

    def on_own_failure(self, attempt: int, code: int) -> None:
        with self.lock:
            if attempt == self.current:
                self.failing[0] = code
                self._judge()
                self.lock.notify_all()

    def fitted_attempts(self) -> dict:
        """``{"attempts": [...]}``, masked and cut to ``ATTEMPTS_BUDGET``
        (``attempts_omitted`` where old ones went); ``{}`` before the first."""
        if not self.attempts:
            return {}
        attempts, omitted = fit_attempts(self.masked(self.attempts))
        return {"attempts": attempts, **({"attempts_omitted": omitted} if omitted else {})}

    def keep(self) -> tuple[int, str]:
        gang = self.spec.gang
        if gang.listen_note:
            self.say(f"ddp-orch: {gang.listen_note}")
        gate = peers.Gate(self.listener, gang.token, self.nnodes, self._joined).start() \
            if self.listener is not None else None
        deadline = time.monotonic() + self.spec.start_timeout_s
        with self.lock:
            while len(self.links) + len(self.lost) < self.nnodes - 1 and not self.final:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            missing = [k for k in range(1, self.nnodes) if k not in self.links]
            self.joining_over = True
        if gate is not None:  # every node has joined, or never will: no port from here on
            gate.close()
        if missing or self.final:
            why = self.final or ("node(s) " + ", ".join(map(str, missing)) +
                                 " never joined the gang's port")
            self.say(f"ddp-orch: {why}")
            self._finish(RunState.FAILED)
            return 1, RunState.INTERRUPTED if self.final else RunState.FAILED
        restarts = self.spec.max_restarts
        port = self.sup_spec.master_port
        for attempt in range(restarts + 1):
            if attempt:
                why_not = self._back_off(attempt)
                if why_not:  # between the decision and now: a node lost, a signal
                    self.attempts[-1].update(restart="", no_restart=why_not)
                    self.say(f"ddp-orch: no restart after all: {why_not}")
                    break
                port = _fresh_port(self.holdings, gang.addr)
            with self.lock:
                self.current, self.ended, self.stop_asked = attempt, {}, set()
                self.failing, self.reported, self.hung = {}, {}, {}
                self.clock = gangrule.Clock(time.monotonic())
                if self.lost:  # lost after the check above: this attempt cannot start
                    self._stop_all(f"lost node(s) {', '.join(map(str, sorted(self.lost)))} "
                                   f"before attempt {attempt} started")
            self._broadcast(message(Event.GANG_START, attempt=attempt, master_port=port))
            threading.Thread(target=self._watch_rule, args=(attempt,), daemon=True,
                             name="keeper-rule").start()
            ended = self._await_ended(attempt, self.run_attempt(attempt, port))
            codes = [e.get("code") for e in ended.values()]
            record = self._record(attempt, port, ended)
            if all(c == 0 for c in codes):
                record["state"] = RunState.SUCCEEDED
                self.attempts.append(record)
                self._finish(RunState.SUCCEEDED)
                return 0, RunState.SUCCEEDED
            why_not = self._why_no_restart(ended)
            record["state"] = RunState.INTERRUPTED if self.final else RunState.FAILED
            record["restart"] = "" if why_not or attempt == restarts else "restarting"
            record["no_restart"] = why_not if attempt < restarts else ""
            self.attempts.append(record)
            self._compact_old_attempts()
            self.write_state(RunState.RUNNING)
            if why_not or attempt == restarts:
                break
            # no stop was needed when every node failed on its own: name the failures
            why = record["stop_reason"] or ", ".join(
                f"node {k} failed (exit {e.get('code')})" for k, e in sorted(ended.items())
                if e.get("code") not in (0, None)) or "no node succeeded"
            self.say(f"ddp-orch: attempt {attempt} failed ({why}); "
                     f"restarting the whole gang in {restart_backoff(attempt + 1):g}s "
                     f"({attempt + 1} of {restarts} restart(s))")
        state = RunState.INTERRUPTED if self.final else RunState.FAILED
        self._finish(state)
        return int(self.ended.get(0, {}).get("code") or 1), state

    def _record(self, attempt: int, port: int, ended: dict[int, dict]) -> dict:
        """Node 0's record of one attempt: each node's exit record, ``stop_asked``."""
        return {"attempt": attempt, "master_port": port,
                "stop_reason": str(self.stop_for.get(attempt, ""))[:MAX_MESSAGE],
                "nodes": {str(k): {**e, "stop_asked": k in self.stop_asked,
                                   **({"hung": self.hung[k][:MAX_MESSAGE]}
                                      if k in self.hung and "lost" not in e else {})}
                          for k, e in sorted(ended.items())}}

    def _back_off(self, attempt: int) -> str:
        """Wait ``restart_backoff(attempt)`` before restarting (cut short by a
        stop), then check again that a restart may go ahead: why not, or ""."""
        until = time.monotonic() + restart_backoff(attempt)
        with self.lock:
            while not self.final and not self.lost:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            if self.final:
                return f"stopped on purpose ({self.final})"
            if self.lost:
                return (f"node(s) {', '.join(map(str, sorted(self.lost)))} lost before the "
                        f"restart: a restart needs every node")
        return ""

    def _await_ended(self, attempt: int, mine: dict) -> dict[int, dict]:
        """Every node's end of ``attempt``: its exit event, or ``{"lost": why}``
        where its link is gone or it is ``ENDED_WAIT_S`` late once stopped."""
        with self.lock:
            self.ended[0] = mine
            self._judge()
            deadline = None
            while True:
                for k, why in self.lost.items():
                    self.ended.setdefault(k, {"lost": why, **self.lost_when.get(k, {})})
                if len(self.ended) >= self.nnodes:
                    return dict(self.ended)
                if attempt in self.stop_for and deadline is None:
                    deadline = time.monotonic() + float(self.sup_spec.grace_s) \
                        + ENDED_WAIT_S
                if deadline is not None and time.monotonic() >= deadline:
                    for k in range(self.nnodes):
                        self.ended.setdefault(k, {"lost": "never reported its end"})
                    return dict(self.ended)
                self.lock.wait(1.0 if deadline is None
                               else max(0.01, deadline - time.monotonic()))

    def _compact_old_attempts(self) -> None:
        """Past ``FULL_ATTEMPTS``, old attempts keep their failed or lost nodes
        in brief, the rest bare, so a long run's memory stays bounded."""
        while self.shrunk < len(self.attempts) - FULL_ATTEMPTS:
            self.attempts[self.shrunk] = shrink(self.attempts[self.shrunk], 2)
            self.shrunk += 1

    def _why_no_restart(self, ended: dict[int, dict]) -> str:
        if self.final:
            return f"stopped on purpose ({self.final})"
        lost = sorted(set(self.lost) | {k for k, e in ended.items() if "lost" in e})
        if lost:
            return f"node(s) {', '.join(map(str, lost))} lost: a restart needs every node"
        left = survivors_left(ended) or setup_failed(ended)
        if left:
            return left
        return will_recur({k: e for k, e in ended.items() if "lost" not in e},
                          any(e.get("stepped") for e in ended.values()))

    def _joined(self, k: int, conn: socket.socket, rest: bytes) -> None:
        """A node said its hello with the run's token (``peers.Gate``)."""
        with self.lock:
            if k in self.links or self.finishing or self.joining_over:
                conn.close()
                return
            self.links[k] = peers.Link(
                conn, lambda msg, k=k: self._from_peer(k, msg),
                lambda why, k=k: self._peer_lost(k, why), first=rest).start()
            self.lock.notify_all()

    def _from_peer(self, k: int, said: dict) -> None:
        """What node ``k`` said (checked by its link: ``protocol.validate``)."""
        event = said["event"]
        if event == Event.GANG_SETUP:
            self._setup_done_on(k)
            return
        if event == Event.GANG_PROGRESS:
            self._progress_from(k, said["attempt"], said["started"], said["progress"])
            return
        with self.lock:
            if event == Event.GANG_ENDED and said["attempt"] == self.current:
                self.ended[k] = compact(self.masked(said["exit"]))  # mask, then cut
                self._judge()
            elif event == Event.GANG_FAILING and said["attempt"] == self.current:
                self.failing[k] = said["code"]
                self._judge()
            elif event == Event.GANG_STACKS_DONE and said["attempt"] == self.current:
                self.places[k] = {int(r): str(w)[:MAX_PLACE] for r, w in
                                  list(said["places"].items())[:4096] if str(r).isdigit()}
            elif event == Event.GANG_STOP and said["final"]:
                self.final = self.final or said["reason"]
                self._stop_all(said["reason"])
            elif event == Event.GANG_STOP:  # this attempt only (its start timeout)
                if said["attempt"] == self.current and self.current not in self.stop_for:
                    self._stop_all(said["reason"])
            self.lock.notify_all()

    def _peer_lost(self, k: int, why: str) -> None:
        with self.lock:
            if self.finishing:
                return
            self.lost[k] = why  # no later attempt: it cannot take part again
            link = self.links.get(k)
            if link is not None:  # when: what the loss bounds are measured on
                self.lost_when[k] = {"lost_at": link.lost_at or time.time(),
                                     "heard_at": link.heard_at}
            self._judge()  # a node that has ended is no loss to this attempt
            self.lock.notify_all()
        self.say(f"ddp-orch: lost node {k}: {why}")

    def _stop_all(self, reason: str) -> None:
        """Every node that has not ended stops (called holding the lock)."""
        self.stop_for.setdefault(self.current, reason)
        for k in range(self.nnodes):
            if k not in self.ended:
                self.stop_asked.add(k)
        self._broadcast(message(Event.GANG_STOP, attempt=self.current, reason=reason,
                                final=bool(self.final)))
        if self.supervisor is not None:
            self.supervisor.request_stop(gangrule.stop_reason(reason))

    def _finish(self, state: RunState) -> None:
        """The gang's last word to every node, then each link closed, which
        writes it out first: a member that saw its link close without the
        word would end as having "lost the gang's head"."""
        self.finishing = True
        self._broadcast(message(Event.GANG_FINISH, state=state))
        for link in list(self.links.values()):
            link.close()

    def _broadcast(self, said: dict) -> None:
        for link in list(self.links.values()):
            link.send(said)

    def _progress_from(self, k: int, attempt: int, started: bool, progress: object) -> None:
        """Node ``k``'s report (``rank_progress``), its ages kept as times on ours."""
        now = time.monotonic()
        seen = {}
        for key, value in list(progress.items() if isinstance(progress, dict) else ())[:4096]:
            entry = rank_progress(value) if isinstance(key, str) and key.isdigit() else None
            if entry is not None:
                seen[int(key)] = now - entry[1]
        with self.lock:
            if attempt == self.current:
                self.reported[k] = (bool(started), seen)
                self._judge()

    def _watch_rule(self, attempt: int) -> None:
        """The gang's rule, also when nothing is reported (a start
        timeout, a hang), until the attempt has ended everywhere."""
        while not self.over.wait(RULE_POLL_S):
            with self.lock:
                if attempt != self.current or len(self.ended) >= self.nnodes:
                    return
                self._judge()

    def _judge(self) -> None:
        """Holding the lock: ``gangrule`` on this attempt; a verdict stops it
        (a hang: once every node's stacks are dumped)."""
        if self.current in self.stop_for or self.hanging:
            return
        now = time.monotonic()
        setup_done = self.setup_go.is_set() or not self.sup_spec.setup \
            or self.current > 0
        views = []
        for k in range(self.nnodes):
            ended = self.ended.get(k)
            code = ended.get("code") if ended is not None and "lost" not in ended \
                else self.failing.get(k)
            started, seen = self.reported.get(k, (False, {}))
            views.append(gangrule.NodeView(
                k, f"node {k}", code=code, joined=started, started=started or ended is not None,
                setup_done=setup_done, lost=self.lost.get(k, "") if ended is None else "",
                progress=tuple(seen.items())))
        self.clock = gangrule.tick(self.clock, views, now)
        verdict = gangrule.judge(views, gangrule.Timeouts(
            self.spec.start_timeout_s, None,
            float(self.hang_s) if self.hang_s is not None else None, attempt=self.current),
            self.clock, now)
        if verdict is None:
            return
        if verdict.stop is gangrule.Stop.HANG:
            self.hanging = True
            threading.Thread(target=self._on_hang, args=(self.current, verdict), daemon=True,
                             name="keeper-hang").start()
            return
        if verdict.stop is gangrule.Stop.START_TIMEOUT:
            self.say(f"ddp-orch: {verdict.why}; stopping it")
        self._stop_all(verdict.why)

    def _on_hang(self, attempt: int, verdict: gangrule.Verdict) -> None:
        """Every node dumps its ranks' stacks; the odd rank's node is named,
        and the attempt stops (a failure like any other for restarts)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.say(f"ddp-orch: {verdict.why.split(';')[0]}; dumping every rank's stack")
        with self.lock:
            self.places = {}
        self._broadcast(message(Event.GANG_STACKS, attempt=attempt, stamp=stamp))
        mine = self._dump_stacks(stamp)
        deadline = time.monotonic() + STACKS_WAIT_S
        with self.lock:
            self.places[0] = mine
            while len(self.places) < len([k for k in verdict.nodes if k not in self.ended
                                          and k not in self.lost]) \
                    and time.monotonic() < deadline and not self.final:
                self.lock.wait(max(0.01, deadline - time.monotonic()))
            places = {rank: where for found in self.places.values()
                      for rank, where in found.items()}
            ranks_of = {k: sorted(set(self.places.get(k, {})) | set(self.reported.get(
                k, (False, {}))[1])) for k in verdict.nodes}
            why, blamed = gangrule.hang_words(verdict, places or None, ranks_of)
            self.hanging = False
            if attempt == self.current and attempt not in self.stop_for:
                self.hung = {k: why for k in blamed}
                self._stop_all(why)
            self.lock.notify_all()
        self._write_summary(stamp, why, places)
        self.say(f"ddp-orch: {why}; stopping every node")

    def _write_summary(self, stamp: str, why: str, places: dict[int, str]) -> None:
        saved = os.path.join(self.run_dir, "stacks", stamp)
        try:
            os.makedirs(saved, mode=0o700, exist_ok=True)
            with open(os.path.join(saved, "summary.txt"), "w", encoding="utf-8") as fh:
                fh.write(self.masked(why) + "\n" + "".join(
                    f"  rank {rank}: {where}\n" for rank, where in sorted(places.items())))
        except OSError as exc:
            self.say(f"ddp-orch: cannot keep the stacks' summary: {exc}")

    def _setup_done_on(self, k: int) -> None:
        """Node ``k``'s setup is done; once all are, every node goes."""
        with self.lock:
            self.setup_ready.add(k)
            if len(self.setup_ready) < self.nnodes or self.setup_go.is_set():
                return
            self.setup_go.set()
        self._broadcast(message(Event.GANG_GO))


def _fresh_port(holdings: Holdings, master_addr: str | None = None) -> int:
    """A free port for the next attempt's rendezvous, as ``bind`` checks it,
    in the family of the master address (an IPv6 master gets an IPv6 port)."""
    found = probes.bind(0, master_addr, holdings=holdings)  # its supervisor lets it go
    if not found["ok"]:
        raise OSError(f"no free port for the next attempt: {found['error']}")
    return found["port"]
