"""A node's side of a kept run: one that needs no controller to stay a gang.

``up --detach`` and ``up --max-restarts N`` start a keeper on every node
instead of a supervisor on the controller's channel (``serve``'s
``detach``): a daemon in a session of its own, writing everything it has
to say into ``agent.out`` in its run directory, so the controller may go
away and come back (``attach``, ``logs --follow``, ``status``).

The keepers hold the gang among themselves (``peers.py``): node 0 is the
head; every other node links to it. An attempt is one torchrun per node
(a ``Supervisor`` each, as in an attached run). The head:

* starts each attempt on every node (``gang-start``, with the attempt's
  master port: the controller's for attempt 0, a freshly bound one after);
* on the first node whose torchrun fails, or whose link is lost, tells
  every other node to stop (``gang-stop``), which each does at once
  (SIGTERM, the grace period, SIGKILL);
* once every node has ended, starts the next attempt if the run failed,
  restarts are left and ``restarts.will_recur`` sees no reason against it;
  else ends the run (``gang-finish``) and records every attempt.

A node that loses its head stops too: so however one node goes (its rank
fails, its keeper is SIGKILLed, its host freezes), every other node starts
its teardown within ``peers.GANG_TIMEOUT_S`` (at once when the link
closes) and is gone a grace period later: at most 10 s + the grace
period (10 s by default), 20 s in all.

The liveness rule (``rule``): ``detached``: the nodes own the run, and the
controller's channel (``serve``'s ``follow``) may come and go; ``attached``
(``--max-restarts`` without ``--detach``): the follower that loses its
controller signals the keeper, which stops the gang, as an attached run does.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import threading
import time

from . import files, peers, probes
from .daemon import STATE_FILE
from .procs import start_time
from .protocol import encode
from .restarts import will_recur
from .shim import SHIM_MODULE
from .supervisor import Supervisor

ENDED_WAIT_S = 60.0  # after a stop, how long the head waits for a node's report
# What one node's exit record may hold in the attempts that node 0 keeps and
# sends: ``finished`` is one control line, and a run may have many attempts.
MAX_FAILURES, MAX_MESSAGE, MAX_LAST_LINES, MAX_LINE = 3, 500, 3, 300
FULL_ATTEMPTS = 16  # older attempts keep only the records of nodes that failed


def attempt_spec(spec: dict, attempt: int, master_port: int) -> dict:
    """The supervisor spec of one attempt: the dry-run's for attempt 0; later,
    the fresh master port, a torchrun log directory of the attempt's own (the
    run directory keeps every attempt's) and ``DDP_ORCH_RESTART_COUNT``.
    The argv is the dry-run's with exactly two values of torchrun's own
    options swapped, by flag; nothing after ``-m ddp_orch_shim`` (the user's
    program and its arguments) is touched."""
    out = dict(spec)
    log_dir = os.path.join(spec["run_dir"], "torchrun" if attempt == 0 else
                           f"torchrun.attempt-{attempt}")
    swap = {"--master-port": str(master_port), "--log-dir": log_dir}
    argv = list(spec["argv"])
    own = argv.index(SHIM_MODULE) - 1 if SHIM_MODULE in argv else len(argv)
    for i, word in enumerate(argv[:own - 1]):
        if word in swap:
            argv[i + 1] = swap[word]
    out.update(argv=argv, master_port=master_port, log_dir=log_dir, own_signals=False,
               watch_stdin=False, peer_timeout_s=None,
               env={**spec["env"], "DDP_ORCH_RESTART_COUNT": str(attempt)})
    return out


class Keeper:
    """One node's keeper; ``run()`` returns the node's last torchrun code."""

    def __init__(self, spec: dict, listener: socket.socket | None = None):
        self.spec = spec
        self.sup_spec = spec["supervisor"]
        self.node_rank = int(self.sup_spec["node_rank"])
        self.nnodes = int(spec["nnodes"])
        self.run_dir = self.sup_spec["run_dir"]
        self.listener = listener
        self.lock = threading.Condition()
        self.supervisor: Supervisor | None = None
        self.final = ""  # why the run stops for good (a signal, a peer's signal)
        self.signals = 0
        self.attempts: list[dict] = []
        self.stop_for: dict[int, str] = {}  # attempt -> why it stops (maybe before it starts)
        self.current = 0
        self.finishing = False  # gang-finish sent: links closing now are no loss
        # Secret env values: masked in every string this keeper writes or sends
        # (its agent.out, keeper.json, the gang link), at the source, value by
        # value, before anything is serialized (masking serialized JSON could
        # break it: a "secret" may read "false").
        self.secrets = [v for v in self.sup_spec.get("secrets", ()) if v]
        self.head: peers.Link | None = None  # a node's link to node 0
        # node 0's view of the gang: the links, and per attempt who ended how
        self.links: dict[int, peers.Link] = {}
        self.lost: dict[int, str] = {}
        self.ended: dict[int, dict] = {}
        self.stop_asked: set[int] = set()
        self._signalled = os.pipe()  # the signal handler's only act: a byte here

    # -- shared ---------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chdir(self.run_dir)
        threading.Thread(target=self._on_signals, daemon=True, name="keeper-signals").start()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_state("running")
        try:
            if self.node_rank == 0:
                code, state = self.lead()
            else:
                code, state = self.follow_head()
        except Exception as exc:  # noqa: BLE001 (recorded, then the keeper ends)
            self.say(f"ddp-orch: keeper failed: {type(exc).__name__}: {exc}")
            code, state = 1, "failed"
        self.emit({"event": "finished", "code": code, "state": state,
                   **({"attempts": self.attempts} if self.node_rank == 0 else {})})
        try:
            self.write_state(state, code)
        except OSError as exc:  # a full disk: the stream above still says how it ended
            self.say(f"ddp-orch: cannot record the end in {STATE_FILE}: {exc}")
        return code

    def _on_signal(self, signum: int, _frame) -> None:
        """``down`` (SIGTERM), Ctrl-C on a foreground run, a hangup: stop the
        run for good; a second signal skips the grace period. A handler may
        run between any two bytecodes of the main thread, even inside a lock,
        so it only writes a byte; ``_on_signals`` acts on it."""
        os.write(self._signalled[1], bytes([signum]))

    def _on_signals(self) -> None:
        while True:
            signum = os.read(self._signalled[0], 1)[0]
            self.signals += 1
            name = signal.Signals(signum).name
            self.final = self.final or f"got {name} on node {self.node_rank}"
            sup = self.supervisor
            if sup is not None:
                sup.request_stop(f"got {name}")
                if self.signals > 1:
                    sup.hurry.set()
            self.on_local_stop()

    def on_local_stop(self) -> None:
        """Tell the rest of the gang: the head stops everyone, a node tells the head."""
        if self.node_rank == 0:
            with self.lock:
                self._stop_all(self.final)
                self.lock.notify_all()
        elif self.head is not None:  # else follow_head tells the head once linked
            self.head.send({"event": "gang-stop", "attempt": self.current,
                            "reason": self.final, "final": True})

    def run_attempt(self, attempt: int, port: int) -> dict:
        """This node's torchrun for one attempt; its exit event."""
        spec = attempt_spec(self.sup_spec, attempt, port)
        if attempt:
            shutil.rmtree(os.path.join(self.run_dir, "progress"), ignore_errors=True)
        self.emit({"event": "attempt", "attempt": attempt, "master_port": port})
        with self.lock:
            self.current = attempt
            why = self.final or self.stop_for.get(attempt)
            if why:  # stopped before it started: nothing to run
                return {"code": 128 + signal.SIGTERM, "reason": why, "failures": [],
                        "last_lines": [], "duration_s": 0, "stopped_at": time.time()}
            self.supervisor = sup = Supervisor(spec)
            # The gang hears of a failure when torchrun exits, not after this
            # node's teardown, log draining and failure collection.
            sup.on_torchrun_exit = lambda code: code and self.on_own_failure(attempt, code)
        sup.run()
        with self.lock:
            self.supervisor = None
        event = self.masked(compact(dict(sup.last_exit or {})))
        event["stepped"] = any(step is not None and step >= 0
                               for step, _age in sup.progress().values())
        return event

    def masked(self, message):
        """``message`` with every secret value masked in every string in it."""
        return files.mask_strings(message, self.secrets)

    def emit(self, message: dict) -> None:
        try:
            os.write(1, encode(self.masked(message)))
        except OSError:
            pass  # a full disk must not stop a teardown; the state is in memory

    def say(self, text: str) -> None:
        try:
            os.write(1, self.masked(text).encode("utf-8", "replace") + b"\n")
        except OSError:
            pass

    def write_state(self, state: str, code: int | None = None) -> None:
        payload = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
                   "node_rank": self.node_rank, "run_id": self.sup_spec["run_id"],
                   "rule": self.spec.get("rule"), "state": state, "code": code,
                   "attempt": len(self.attempts), "updated": time.time()}
        if self.node_rank == 0 and self.attempts:
            payload["attempts"] = self.attempts
        path = os.path.join(self.run_dir, STATE_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(self.masked(payload), fh)
        os.replace(path + ".tmp", path)

    # -- node 0 ---------------------------------------------------------------

    def lead(self) -> tuple[int, str]:
        threading.Thread(target=self._accept, daemon=True, name="gang-accept").start()
        deadline = time.monotonic() + float(self.spec["start_timeout_s"])
        with self.lock:
            while len(self.links) + len(self.lost) < self.nnodes - 1 and not self.final:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
            missing = [k for k in range(1, self.nnodes) if k not in self.links]
        if missing or self.final:
            why = self.final or ("node(s) " + ", ".join(map(str, missing)) +
                                 " never joined the gang's port")
            self.say(f"ddp-orch: {why}")
            self.finishing = True
            self._broadcast({"event": "gang-finish", "state": "failed"})
            return 1, "interrupted" if self.final else "failed"
        restarts = int(self.spec.get("max_restarts", 0))
        port = int(self.sup_spec["master_port"])
        for attempt in range(restarts + 1):
            if attempt:
                port = _fresh_port()
            with self.lock:
                self.current, self.ended, self.stop_asked = attempt, {}, set()
            self._broadcast({"event": "gang-start", "attempt": attempt, "master_port": port})
            ended = self._await_ended(attempt, self.run_attempt(attempt, port))
            codes = [e.get("code") for e in ended.values()]
            record = {"attempt": attempt, "master_port": port,
                      "stop_reason": self.stop_for.get(attempt, ""),
                      "nodes": {str(k): {**e, "stop_asked": k in self.stop_asked}
                                for k, e in sorted(ended.items())}}
            if all(c == 0 for c in codes):
                record["state"] = "succeeded"
                self.attempts.append(record)
                self.finishing = True
                self._broadcast({"event": "gang-finish", "state": "succeeded"})
                return 0, "succeeded"
            why_not = self._why_no_restart(ended)
            record["state"] = "interrupted" if self.final else "failed"
            record["restart"] = "" if why_not or attempt == restarts else "restarting"
            record["no_restart"] = why_not if attempt < restarts else ""
            self.attempts.append(record)
            self._compact_old_attempts()
            self.write_state("running")
            if why_not or attempt == restarts:
                break
            self.say(f"ddp-orch: attempt {attempt} failed ({record['stop_reason']}); "
                     f"restarting the whole gang ({attempt + 1} of {restarts} restart(s))")
        state = "interrupted" if self.final else "failed"
        self.finishing = True
        self._broadcast({"event": "gang-finish", "state": state})
        return int(self.ended.get(0, {}).get("code") or 1), state

    def _await_ended(self, attempt: int, mine: dict) -> dict[int, dict]:
        """Every node's end of ``attempt``, node 0's being ``mine``: its exit
        event, or ``{"lost": why}`` for a node whose link is gone, or that has
        not reported ``ENDED_WAIT_S`` past the grace period once stopped."""
        with self.lock:
            self.ended[0] = mine
            if mine.get("code") and attempt not in self.stop_for:
                self._stop_all(f"node 0 failed (exit {mine.get('code')})")
            deadline = None
            while True:
                for k, why in self.lost.items():
                    self.ended.setdefault(k, {"lost": why})
                if len(self.ended) >= self.nnodes:
                    return dict(self.ended)
                if attempt in self.stop_for and deadline is None:
                    deadline = time.monotonic() + float(self.sup_spec.get("grace_s", 10)) \
                        + ENDED_WAIT_S
                if deadline is not None and time.monotonic() >= deadline:
                    for k in range(self.nnodes):
                        self.ended.setdefault(k, {"lost": "never reported its end"})
                    return dict(self.ended)
                self.lock.wait(1.0 if deadline is None
                               else max(0.01, deadline - time.monotonic()))

    def _compact_old_attempts(self) -> None:
        """Past ``FULL_ATTEMPTS``, an attempt keeps the records of the nodes
        that failed on their own only (the root cause is among them)."""
        for record in self.attempts[:-FULL_ATTEMPTS]:
            record["nodes"] = {k: e for k, e in record["nodes"].items()
                               if e.get("code") not in (0, None) and not e.get("stop_asked")
                               or "lost" in e}

    def _why_no_restart(self, ended: dict[int, dict]) -> str:
        if self.final:
            return f"stopped on purpose ({self.final})"
        lost = sorted(set(self.lost) | {k for k, e in ended.items() if "lost" in e})
        if lost:
            return f"node(s) {', '.join(map(str, lost))} lost: a restart needs every node"
        return will_recur({k: e for k, e in ended.items() if "lost" not in e},
                          any(e.get("stepped") for e in ended.values()))

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._admit, args=(conn,), daemon=True,
                             name="gang-admit").start()

    def _admit(self, conn: socket.socket) -> None:
        """One connection's hello, in a thread of its own: a slow or hostile
        client holds up nobody (``accept_hello`` has a deadline)."""
        try:
            k, rest = peers.accept_hello(conn, self.spec["gang"]["token"], self.nnodes)
        except (OSError, ValueError):
            conn.close()
            return
        with self.lock:
            if k in self.links or self.finishing:
                conn.close()
                return
            self.links[k] = peers.Link(
                conn, lambda msg, k=k: self._from_peer(k, msg),
                lambda why, k=k: self._peer_lost(k, why), first=rest).start()
            self.lock.notify_all()

    def _from_peer(self, k: int, message: dict) -> None:
        with self.lock:
            if message["event"] == "gang-ended" and message["attempt"] == self.current:
                self.ended[k] = compact(message["exit"])
                code = message["exit"].get("code")
                if code and self.current not in self.stop_for:
                    self._stop_all(f"node {k} failed (exit {code})")
            elif message["event"] == "gang-failing" and message["attempt"] == self.current:
                if self.current not in self.stop_for:
                    self._stop_all(f"node {k} failed (exit {message['code']})")
            elif message["event"] == "gang-stop":
                self.final = self.final or message["reason"]
                self._stop_all(message["reason"])
            self.lock.notify_all()

    def _peer_lost(self, k: int, why: str) -> None:
        with self.lock:
            if self.finishing:
                return
            self.lost[k] = why  # no later attempt: it cannot take part again
            if k not in self.ended:
                self._stop_all(f"lost node {k} ({why})")
            self.lock.notify_all()
        self.say(f"ddp-orch: lost node {k}: {why}")

    def on_own_failure(self, attempt: int, code: int) -> None:
        """This node's torchrun exited non-zero (called from its reaper thread)."""
        if self.node_rank == 0:
            with self.lock:
                if attempt == self.current and attempt not in self.stop_for:
                    self._stop_all(f"node 0 failed (exit {code})")
                    self.lock.notify_all()
        elif self.head is not None:
            self.head.send({"event": "gang-failing", "attempt": attempt, "code": code})

    def _stop_all(self, reason: str) -> None:
        """Every node that has not ended stops (called holding the lock)."""
        self.stop_for.setdefault(self.current, reason)
        for k in range(self.nnodes):
            if k not in self.ended:
                self.stop_asked.add(k)
        self._broadcast({"event": "gang-stop", "attempt": self.current, "reason": reason,
                         "final": bool(self.final)})
        if self.supervisor is not None:
            self.supervisor.request_stop(reason)

    def _broadcast(self, message: dict) -> None:
        for link in list(self.links.values()):
            link.send(message)

    # -- every other node -----------------------------------------------------

    def follow_head(self) -> tuple[int, str]:
        gang = self.spec["gang"]
        self.inbox: queue.Queue = queue.Queue()
        deadline = time.monotonic() + float(self.spec["start_timeout_s"])
        sock = peers.connect(gang["addr"], int(gang["port"]), self.node_rank, gang["token"],
                             deadline)
        self.head = peers.Link(sock, self._from_head, self._head_lost).start()
        if self.final:  # signalled while connecting
            self.on_local_stop()
        code = 1
        while True:
            message = self.inbox.get()
            if message is None:
                return code, "failed" if not self.final else "interrupted"
            if message["event"] == "gang-finish":
                self.head.close()
                return code, message["state"]
            if message["event"] == "gang-start":
                event = self.run_attempt(message["attempt"], message["master_port"])
                code = int(event.get("code") or 0)
                self.head.send({"event": "gang-ended", "attempt": message["attempt"],
                                "exit": event})

    def _from_head(self, message: dict) -> None:
        if message["event"] == "gang-finish":
            self.finishing = True  # the link closing next is no loss
        if message["event"] == "gang-stop":
            with self.lock:
                self.stop_for.setdefault(message["attempt"], message["reason"])
                if self.supervisor is not None and self.current == message["attempt"]:
                    self.supervisor.request_stop(f"stopped by the gang: {message['reason']}")
            return
        self.inbox.put(message)

    def _head_lost(self, why: str) -> None:
        if self.finishing:
            return
        why = f"lost the gang's head, node 0 ({why})"
        with self.lock:
            self.final = self.final or why
            if self.supervisor is not None:
                self.supervisor.request_stop(why)
        self.inbox.put(None)
        self.say(f"ddp-orch: {why}; stopping this node")


def compact(event: dict) -> dict:
    """A node's exit record, capped (``MAX_*``) for the attempts node 0 keeps."""
    out = dict(event)
    out["failures"] = [dict(f, message=str(f.get("message", ""))[-MAX_MESSAGE:])
                       for f in list(event.get("failures") or [])[:MAX_FAILURES]
                       if isinstance(f, dict)]
    out["last_lines"] = [str(line)[-MAX_LINE:]
                         for line in list(event.get("last_lines") or [])[-MAX_LAST_LINES:]]
    out["survivors"] = list(event.get("survivors") or [])[:5]
    out["reason"] = str(event.get("reason", ""))[:MAX_MESSAGE]
    return out


def _fresh_port() -> int:
    """A free port for the next attempt's rendezvous, as ``bind`` checks it."""
    found = probes.bind(0)
    if not found["ok"]:
        raise OSError(f"no free port for the next attempt: {found['error']}")
    return found["port"]
