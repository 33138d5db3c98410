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
  restarts are left and ``restarts`` sees no reason against it (no process
  of the last attempt is left on any node: each node waits up to
  ``SURVIVOR_WAIT_S`` for what would not die), after a backoff of
  ``restart_backoff(n)`` seconds (1 s before the first restart, doubling,
  at most ``MAX_BACKOFF_S``) and a last check that every node is still
  linked; else ends the run (``gang-finish``) and records every attempt.

Every attempt has a start timeout (the run's ``start_timeout_s``): a node
whose torchrun has spawned no worker by then (with torchrun's static
rendezvous, a node of the gang is missing) stops the attempt.

What node 0 records of the attempts is bounded by construction: each
node's exit record is capped field by field (``compact``), and what one
``finished`` line or one ``keeper.json`` (the ``keeper`` reply) carries is
cut to ``ATTEMPTS_BUDGET`` bytes, the oldest detail first
(``fit_attempts``).

A node that loses its head stops too: so however one node goes (its rank
fails, its keeper is SIGKILLed, its host freezes), every other node starts
its teardown within ``peers.GANG_TIMEOUT_S`` (at once when the link
closes) and is gone a grace period later: at most 10 s + the grace
period (10 s by default), 20 s in all.

The liveness rule (``rule``): ``detached``: the nodes own the run, and the
controller's channel (``serve``'s ``follow``) may come and go; ``attached``
(``--max-restarts`` without ``--detach``): the follower that loses its
controller signals the keeper, which stops the gang, as an attached run does;
and the keeper watches its follower (``daemon.follower_present``): one that
is gone however it went (``kill -9`` included), or that never came within
the start timeout, stops the gang too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shutil
import signal
import socket
import threading
import time
from typing import Iterable

from . import daemon, peers
from .. import gangrule
from ..stackgroups import place

from ..wire import files

from ..node import gpus, probes, procs, stacks
from .. import layout
from ..node.procs import start_time
from ..wire.protocol import ENDED_ON_ITS_OWN, MAX_CONTROL_LINE, KeptRule, encode, rank_progress
from .restarts import setup_failed, survivors_left, will_recur
from ..worker.shim import SHIM_MODULE
from ..node.spec import Liveness, SupervisorSpec
from ..node.supervisor import GPU_SAMPLE_TIMEOUT_S, Supervisor, visible_gpus

ENDED_WAIT_S = 60.0  # after a stop, how long the head waits for a node's report
# What one node's exit record may hold in the attempts that node 0 keeps and
# sends: ``finished`` is one control line, and a run may have many attempts.
MAX_FAILURES, MAX_MESSAGE, MAX_LAST_LINES, MAX_LINE = 3, 500, 3, 300
FULL_ATTEMPTS = 16  # older attempts keep only the records of nodes that failed
MAX_SURVIVORS, MAX_CMD, BRIEF_TEXT = 5, 200, 200
# What one ``finished`` line or one keeper.json (the ``keeper`` reply) may
# carry of the attempts: half a control line, so the envelope always fits.
ATTEMPTS_BUDGET = MAX_CONTROL_LINE // 2
SURVIVOR_WAIT_S = 30.0  # how long a node waits for what would not die before it reports
MAX_BACKOFF_S = 30.0
FOLLOWER_POLL_S = 1.0  # how often an attached keeper looks for its follower
RULE_POLL_S = 1.0  # how often the head applies the gang's rule (start timeout, hang)
STACKS_WAIT_S = 15.0  # a hang: how long the head waits for every node's stacks
MAX_PLACE = 300  # one rank's place (``stackgroups.place``) as a node reports it
# Each rank's last step in keeper.json (``status`` of a live detached run):
# at most this many ranks, so the record stays small (looked at every GANG_HEARTBEAT_S).
MAX_PROGRESS_RANKS = 256


def restart_backoff(restart: int) -> float:
    """Seconds before restart number ``restart`` (1, 2, ...): 1, 2, 4, ... 30."""
    return min(MAX_BACKOFF_S, 2.0 ** (restart - 1))


def attempt_spec(spec: SupervisorSpec, attempt: int, master_port: int) -> SupervisorSpec:
    """The supervisor spec of one attempt: the dry-run's for attempt 0; later,
    the fresh master port, a torchrun log directory of the attempt's own (the
    run directory keeps every attempt's) and ``DDP_ORCH_RESTART_COUNT``.
    The argv is the dry-run's with exactly two values of torchrun's own
    options swapped, by flag; nothing after ``-m ddp_orch_shim`` (the user's
    program and its arguments) is touched. The keeper holds it
    (``Liveness.KEEPER``)."""
    log_dir = os.path.join(spec.run_dir, layout.attempt_logs(attempt))
    swap = {"--master-port": str(master_port), "--log-dir": log_dir}
    argv = list(spec.argv)
    own = argv.index(SHIM_MODULE) - 1 if SHIM_MODULE in argv else len(argv)
    for i, word in enumerate(argv[:own - 1]):
        if word in swap:
            argv[i + 1] = swap[word]
    out = dataclasses.replace(spec, argv=tuple(argv), master_port=master_port, log_dir=log_dir,
                              liveness=Liveness.KEEPER,
                              env={**spec.env, "DDP_ORCH_RESTART_COUNT": str(attempt)})
    if attempt and out.setup:  # ``setup:`` runs once, before the first attempt
        # the bundle is unpacked once too: a restart runs on what setup made of it
        out = dataclasses.replace(out, setup=None, bundle=None)
    return out


class Keeper:
    """One node's keeper; ``run()`` returns the node's last torchrun code."""

    def __init__(self, spec: dict, listener: socket.socket | None = None):
        self.spec = spec
        self.sup_spec = SupervisorSpec.from_dict(spec["supervisor"])
        self.node_rank = self.sup_spec.node_rank
        self.nnodes = int(spec["nnodes"])
        self.run_dir = self.sup_spec.run_dir
        self.listener = listener
        self.lock = threading.Condition()
        self.supervisor: Supervisor | None = None
        self.final = ""  # why the run stops for good (a signal, a peer's signal)
        self.signals = 0
        self.attempts: list[dict] = []
        self.shrunk = 0  # node 0: how many of the oldest attempts hold less detail
        self.stop_for: dict[int, str] = {}  # attempt -> why it stops (maybe before it starts)
        self.current = 0
        self.finishing = False  # gang-finish sent: links closing now are no loss
        self.joining_over = False  # node 0: every node joined, or the start timed out
        # Secret env values: masked in every string this keeper writes or sends
        # (its agent.out, keeper.json, the gang link), at the source, value by
        # value, before anything is serialized (masking serialized JSON could
        # break it: a "secret" may read "false").
        self.secrets = [v for v in self.sup_spec.secrets if v]
        self.head: peers.Link | None = None  # a node's link to node 0
        # node 0's view of the gang: the links, and per attempt who ended how
        self.links: dict[int, peers.Link] = {}
        self.lost: dict[int, str] = {}
        self.lost_when: dict[int, dict] = {}  # {lost_at, heard_at} of each lost link
        self.ended: dict[int, dict] = {}
        self.stop_asked: set[int] = set()
        self.setup_ready: set[int] = set()  # node 0: whose setup is done (``gang-setup``)
        self.setup_go = threading.Event()  # every node's setup is done (``gang-go``)
        self._signalled = os.pipe()  # the signal handler's only act: a byte here
        self.over = threading.Event()  # the run has ended here
        self.followed = False  # an attached run's follower has been seen (``_watch_follower``)
        self.state_lock = threading.Lock()  # keeper.json: one writer at a time
        # node 0, this attempt: what the gang's rule (``gangrule``) is judged on
        self.failing: dict[int, int] = {}  # a node's torchrun exited with this code
        self.reported: dict[int, tuple[bool, dict[int, float]]] = {}  # started, rank -> at
        self.clock = gangrule.Clock(time.monotonic())
        self.hung: dict[int, str] = {}  # node -> the hang's root cause (its record's "hung")
        self.hanging = False  # the stacks of a hang are being dumped
        self.places: dict[int, dict[int, str]] = {}  # node -> rank -> place (a hang)
        self.hang_s = spec.get("hang_timeout_s")
        # this attempt's ranks here: rank -> step, samples, when
        self.progress: dict[str, dict] = {}

    # -- shared ---------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chdir(self.run_dir)
        threading.Thread(target=self._on_signals, daemon=True, name="keeper-signals").start()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_state("running")
        if self.spec.get("rule") == KeptRule.ATTACHED:
            threading.Thread(target=self._watch_follower, daemon=True,
                             name="keeper-follower").start()
        try:
            if self.node_rank == 0:
                code, state = self.lead()
            else:
                code, state = self.follow_head()
        except Exception as exc:  # noqa: BLE001 (recorded, then the keeper ends)
            self.say(f"ddp-orch: keeper failed: {type(exc).__name__}: {exc}")
            code, state = 1, "failed"
        self.over.set()
        try:  # the record first: whoever reads the finished line finds the end recorded
            self.write_state(state, code)
        except OSError as exc:  # a full disk: the stream below still says how it ended
            self.say(f"ddp-orch: cannot record the end in {layout.KEEPER_STATE}: {exc}")
        self.emit(self.finished_message(code, state))
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
            # who sent it, if they said (``daemon.signal_keeper``): down, a follower
            why = daemon.stop_request(self.run_dir) if signum == signal.SIGTERM else ""
            why = why or f"got {name}"
            self.stop_for_good(f"{why} on node {self.node_rank}", why, hurry=self.signals > 1)

    def stop_for_good(self, why: str, short: str = "", hurry: bool = False) -> None:
        """Stop the run, with no restart: this node's attempt and the gang's."""
        self.final = self.final or why
        sup = self.supervisor
        if sup is not None:
            sup.request_stop(short or why)
            if hurry:
                sup.hurry.set()
        with self.lock:
            self.lock.notify_all()  # a backoff waiting for a restart ends now
        self.on_local_stop()

    def _watch_follower(self) -> None:
        """The attached rule, held by the keeper itself: once its follower
        (the controller's channel, ``daemon.follow``) is gone, however it went,
        or if none came within the start timeout, the run stops."""
        deadline = time.monotonic() + float(self.spec["start_timeout_s"])
        seen = False
        while not self.over.wait(FOLLOWER_POLL_S):
            if daemon.follower_present(self.run_dir):
                if not seen:  # recorded: from now on its going stops the run
                    seen = self.followed = True
                    self.write_state("running", unless_over=True)
            elif seen or time.monotonic() > deadline:
                why = (f"the controller's follower on node {self.node_rank} is gone"
                       if seen else f"no controller followed node {self.node_rank} within "
                                    f"{float(self.spec['start_timeout_s']):g}s")
                self.say(f"ddp-orch: {why} (an attached run); stopping the run")
                self.stop_for_good(why)
                return

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
            shutil.rmtree(os.path.join(self.run_dir, layout.PROGRESS_DIR), ignore_errors=True)
        self.emit({"event": "attempt", "attempt": attempt, "master_port": port})
        with self.lock:
            self.current = attempt
            why = self.final or self.stop_for.get(attempt)
            if why:  # stopped before it started: nothing to run
                return {"code": 128 + signal.SIGTERM, "reason": why, "failures": [],
                        "last_lines": [], "duration_s": 0, "stopped_at": time.time()}
            self.supervisor = sup = Supervisor(spec)
            sup.line_seen = {}  # output lines are progress: the hang rule's and status's
            sup.setup_barrier = self._setup_barrier
            # The gang hears of a failure when torchrun exits, not after this
            # node's teardown, log draining and failure collection.
            sup.on_torchrun_exit = lambda code: code and self.on_own_failure(attempt, code)
        threading.Thread(target=self._report_progress, args=(sup, attempt), daemon=True,
                         name="keeper-progress").start()
        sup.run()
        self._await_survivors(sup)
        with self.lock:
            self.supervisor = None
        event = compact(self.masked(dict(sup.last_exit or {})))  # mask, then cut
        event["stepped"] = any(seen[0] is not None and seen[0] >= 0
                               for seen in sup.progress().values())
        return event

    def _report_progress(self, sup: Supervisor, attempt: int) -> None:
        """Until this attempt ends here: whether torchrun has started and the
        ranks' progress, to the head (node 0: to itself), every
        ``GANG_HEARTBEAT_S``: what the gang's start timeout and hang rule
        are judged on (``_judge``); and the ranks' steps into keeper.json
        for ``status`` (``_record_progress``), from the same look."""
        self.progress = {}
        watched = visible_gpus(sup.spec.env)
        while not sup.exited.wait(peers.GANG_HEARTBEAT_S):
            use = gpus.sample(watched, GPU_SAMPLE_TIMEOUT_S) if watched else None
            watched = watched if use else []  # no nvidia-smi, or it failed: not asked again
            self._record_progress(sup.progress(), _rank_gpus(sup, use), dict(sup.line_seen or {}),
                                  range(sup.spec.first_rank, sup.spec.first_rank + sup.spec.nproc)
                                  if sup.workers_started else ())
            progress = _progress_of(sup)
            if self.node_rank == 0:
                self._progress_from(0, attempt, sup.workers_started, progress)
            elif self.head is not None:
                self.head.send({"event": "gang-progress", "attempt": attempt,
                                "started": sup.workers_started, "progress": progress})

    def _progress_from(self, k: int, attempt: int, started: bool, progress: object) -> None:
        """Node 0: node ``k``'s report; {rank: [step, age_s]} or {rank: [step,
        age_s, samples]} (``rank_progress``) on its clock, kept as times on ours."""
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
        """Node 0: the gang's rule, also when nothing is reported (a start
        timeout, a hang), until the attempt has ended everywhere."""
        while not self.over.wait(RULE_POLL_S):
            with self.lock:
                if attempt != self.current or len(self.ended) >= self.nnodes:
                    return
                self._judge()

    def _judge(self) -> None:
        """Node 0, holding the lock: the gang's rule (``gangrule``) on what is
        known of this attempt; on a verdict, the attempt stops (a hang: once
        every node's stacks are dumped)."""
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
            float(self.spec["start_timeout_s"]), None,
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
        """Node 0: every node dumps its ranks' stacks (kept in its run
        directory, ``stacks/<stamp>/``) and says where each rank stands;
        the odd rank's node is named, and the attempt stops (a failure like
        any other for the restart rule)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.say(f"ddp-orch: {verdict.why.split(';')[0]}; dumping every rank's stack")
        with self.lock:
            self.places = {}
        self._broadcast({"event": "gang-stacks", "attempt": attempt, "stamp": stamp})
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

    def _dump_stacks(self, stamp: str) -> dict[int, str]:
        """This node's ranks' stacks, kept in ``stacks/<stamp>/rank-N.txt``;
        where each rank stands."""
        out = {}
        try:
            dumped = stacks.dump(self.sup_spec.run_id, {self.node_rank: self.run_dir})
            saved = os.path.join(self.run_dir, "stacks", stamp)
            os.makedirs(saved, mode=0o700, exist_ok=True)
            for r in dumped:
                text, error = str(r.get("text") or ""), str(r.get("error") or "")
                with open(os.path.join(saved, f"rank-{r['rank']}.txt"), "w",
                          encoding="utf-8") as fh:
                    fh.write(self.masked(text) or f"(no dump: {error})\n")
                out[int(r["rank"])] = place(str(r.get("how")), text, error)[:MAX_PLACE]
        except Exception as exc:  # noqa: BLE001 (the hang is still the cause)
            self.say(f"ddp-orch: could not dump the ranks' stacks: {exc}")
        return out

    def _write_summary(self, stamp: str, why: str, places: dict[int, str]) -> None:
        saved = os.path.join(self.run_dir, "stacks", stamp)
        try:
            os.makedirs(saved, mode=0o700, exist_ok=True)
            with open(os.path.join(saved, "summary.txt"), "w", encoding="utf-8") as fh:
                fh.write(self.masked(why) + "\n" + "".join(
                    f"  rank {rank}: {where}\n" for rank, where in sorted(places.items())))
        except OSError as exc:
            self.say(f"ddp-orch: cannot keep the stacks' summary: {exc}")

    def _stacks_asked(self, attempt: int, stamp: str) -> None:
        """Another node: the head asks for this node's ranks' stacks (a hang)."""
        places = self._dump_stacks(stamp)
        if self.head is not None:
            self.head.send({"event": "gang-stacks-done", "attempt": attempt,
                            "places": {str(k): v for k, v in places.items()}})

    def _record_progress(self, heartbeats: dict, use: dict | None = None,
                         lines: dict | None = None, ranks: Iterable[int] = ()) -> None:
        """Each rank's last step, its samples so far (null where its step
        heartbeat says none: ``Supervisor.progress``) and when it made
        progress (this node's clock) into keeper.json, as the heartbeats
        carry them and its output
        lines (``lines``: rank -> wall time of its last line, the supervisor's
        ``line_seen``) show it, with its GPU's use now (``use``: rank ->
        ``gpu``, ``gpu_util``, ``gpu_mem_mib``): a detached run has no
        controller to keep ``progress.json``, so ``status`` reads them from
        here (``describe``). ``ranks``: this node's ranks once its workers
        run, each listed even with nothing (a rank with no output yet).
        Written only when something changed."""
        now = time.time()
        use = use or {}
        lines = {str(rank): at for rank, at in (lines or {}).items()}
        ranks = sorted(set(heartbeats) | set(use) | set(lines) | set(map(str, ranks)),
                       key=int)[:MAX_PROGRESS_RANKS]
        seen = {}
        for rank in ranks:
            step, age, *samples = heartbeats.get(rank, (None, None))
            line = lines.get(rank)
            times = [t for t in (None if age is None else now - age, line) if t is not None]
            seen[rank] = {"step": step, "samples": samples[0] if samples else None,
                          "last_progress": round(max(times), 3) if times else None,
                          "last_output": None if line is None else round(line, 3),
                          **use.get(rank, {})}
        if seen and seen != self.progress:
            self.progress = seen
            self.write_state("running", unless_over=True)

    def _setup_barrier(self, sup: Supervisor) -> None:
        """The gang's barrier after ``setup:`` (the supervisor's
        ``setup_barrier``): a node tells the head its setup is done and waits
        for ``gang-go``; the head sends it once every node's is. A stop (a
        node's setup failed, a signal, a lost link) ends the wait."""
        if self.node_rank == 0:
            self._setup_done_on(0)
        elif self.head is not None:
            self.head.send({"event": "gang-setup", "node_rank": self.node_rank})
        while not (self.setup_go.wait(0.25) or sup.stop_requested or self.final):
            pass

    def _setup_done_on(self, k: int) -> None:
        """Node 0: node ``k``'s setup is done; once all are, every node goes."""
        with self.lock:
            self.setup_ready.add(k)
            if len(self.setup_ready) < self.nnodes or self.setup_go.is_set():
                return
            self.setup_go.set()
        self._broadcast({"event": "gang-go"})

    def _await_survivors(self, sup: Supervisor) -> None:
        """Processes of the attempt that would not die (``procs.terminate``'s
        survivors: uninterruptible sleep, a GPU's driver still releasing
        them): wait up to ``SURVIVOR_WAIT_S`` for them to go; the exit record
        keeps those still there, which rules out a restart
        (``restarts.survivors_left``)."""
        last = sup.last_exit
        if not last or not last.get("survivors"):
            return
        deadline = time.monotonic() + SURVIVOR_WAIT_S
        left = list(last["survivors"])
        self.say(f"ddp-orch: {len(left)} process(es) of this attempt would not die; waiting "
                 f"up to {SURVIVOR_WAIT_S:g}s for them to go")
        while True:
            left = [s for s in left if _still_there(s)]
            if not left or time.monotonic() >= deadline or self.final:
                break
            time.sleep(0.2)
        last["survivors"] = left
        if not left:
            last["survivors_gone"] = True

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

    def fitted_attempts(self) -> dict:
        """``{"attempts": [...]}`` (node 0; masked, and cut to
        ``ATTEMPTS_BUDGET``), with ``attempts_omitted`` when the oldest
        records had to go; ``{}`` elsewhere."""
        if self.node_rank != 0 or not self.attempts:
            return {}
        attempts, omitted = fit_attempts(self.masked(self.attempts))
        return {"attempts": attempts, **({"attempts_omitted": omitted} if omitted else {})}

    def finished_message(self, code: int, state: str) -> dict:
        """The stream's last line; one control line, however many attempts."""
        return {"event": "finished", "code": code, "state": state,
                **(self.fitted_attempts() if self.node_rank == 0 else {})}

    def write_state(self, state: str, code: int | None = None,
                    unless_over: bool = False) -> None:
        """keeper.json; ``unless_over``: not once the run has ended here (a
        thread other than the main one must never write over the end)."""
        with self.state_lock:
            if unless_over and self.over.is_set():
                return
            payload = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
                       "node_rank": self.node_rank, "run_id": self.sup_spec.run_id,
                       "rule": self.spec.get("rule"), "state": state, "code": code,
                       "attempt": len(self.attempts), "updated": time.time(),
                       **({"followed": True} if self.followed else {}),
                       **({"progress": self.progress} if self.progress else {}),
                       **self.fitted_attempts()}
            files.put_json(os.path.join(self.run_dir, layout.KEEPER_STATE), self.masked(payload))

    # -- node 0 ---------------------------------------------------------------

    def lead(self) -> tuple[int, str]:
        gang = self.spec.get("gang") or {}
        if gang.get("listen_note"):
            self.say(f"ddp-orch: {gang['listen_note']}")
        gate = peers.Gate(self.listener, gang["token"], self.nnodes, self._joined).start() \
            if self.listener is not None else None
        deadline = time.monotonic() + float(self.spec["start_timeout_s"])
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
            self.finishing = True
            self._broadcast({"event": "gang-finish", "state": "failed"})
            return 1, "interrupted" if self.final else "failed"
        restarts = int(self.spec.get("max_restarts", 0))
        port = self.sup_spec.master_port
        for attempt in range(restarts + 1):
            if attempt:
                why_not = self._back_off(attempt)
                if why_not:  # between the decision and now: a node lost, a signal
                    self.attempts[-1].update(restart="", no_restart=why_not)
                    self.say(f"ddp-orch: no restart after all: {why_not}")
                    break
                port = _fresh_port((self.spec.get("gang") or {}).get("addr"))
            with self.lock:
                self.current, self.ended, self.stop_asked = attempt, {}, set()
                self.failing, self.reported, self.hung = {}, {}, {}
                self.clock = gangrule.Clock(time.monotonic())
                if self.lost:  # lost after the check above: this attempt cannot start
                    self._stop_all(f"lost node(s) {', '.join(map(str, sorted(self.lost)))} "
                                   f"before attempt {attempt} started")
            self._broadcast({"event": "gang-start", "attempt": attempt, "master_port": port})
            threading.Thread(target=self._watch_rule, args=(attempt,), daemon=True,
                             name="keeper-rule").start()
            ended = self._await_ended(attempt, self.run_attempt(attempt, port))
            codes = [e.get("code") for e in ended.values()]
            record = self._record(attempt, port, ended)
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
            # no stop was needed when every node failed on its own: name the failures
            why = record["stop_reason"] or ", ".join(
                f"node {k} failed (exit {e.get('code')})" for k, e in sorted(ended.items())
                if e.get("code") not in (0, None)) or "no node succeeded"
            self.say(f"ddp-orch: attempt {attempt} failed ({why}); "
                     f"restarting the whole gang in {restart_backoff(attempt + 1):g}s "
                     f"({attempt + 1} of {restarts} restart(s))")
        state = "interrupted" if self.final else "failed"
        self.finishing = True
        self._broadcast({"event": "gang-finish", "state": state})
        return int(self.ended.get(0, {}).get("code") or 1), state

    def _record(self, attempt: int, port: int, ended: dict[int, dict]) -> dict:
        """Node 0's record of one attempt: each node's (``compact``) exit
        record, ``stop_asked`` when the head stopped it."""
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
        """Every node's end of ``attempt``, node 0's being ``mine``: its exit
        event, or ``{"lost": why}`` for a node whose link is gone, or that has
        not reported ``ENDED_WAIT_S`` past the grace period once stopped."""
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
        """Past ``FULL_ATTEMPTS``, an attempt keeps the nodes that failed by
        themselves or were lost (the root cause is among them) in brief,
        the others bare (``_shrink``): the memory a long run holds is bounded."""
        while self.shrunk < len(self.attempts) - FULL_ATTEMPTS:
            self.attempts[self.shrunk] = _shrink(self.attempts[self.shrunk], 2)
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

    def _from_peer(self, k: int, message: dict) -> None:
        if message["event"] == "gang-setup":
            self._setup_done_on(k)
            return
        if message["event"] == "gang-progress":
            self._progress_from(k, message["attempt"], message["started"], message["progress"])
            return
        with self.lock:
            if message["event"] == "gang-ended" and message["attempt"] == self.current:
                self.ended[k] = compact(self.masked(message["exit"]))  # mask, then cut
                self._judge()
            elif message["event"] == "gang-failing" and message["attempt"] == self.current:
                self.failing[k] = message["code"]
                self._judge()
            elif message["event"] == "gang-stacks-done" and message["attempt"] == self.current:
                self.places[k] = {int(r): str(w)[:MAX_PLACE] for r, w in
                                  list(message["places"].items())[:4096] if str(r).isdigit()}
            elif message["event"] == "gang-stop" and message["final"]:
                self.final = self.final or message["reason"]
                self._stop_all(message["reason"])
            elif message["event"] == "gang-stop":  # this attempt only (its start timeout)
                if message["attempt"] == self.current and self.current not in self.stop_for:
                    self._stop_all(message["reason"])
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

    def on_own_failure(self, attempt: int, code: int) -> None:
        """This node's torchrun exited non-zero (called from its reaper thread)."""
        if self.node_rank == 0:
            with self.lock:
                if attempt == self.current:
                    self.failing[0] = code
                    self._judge()
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
        if message["event"] == "gang-go":
            self.setup_go.set()
            return
        if message["event"] == "gang-stacks":  # off the link's reader: a dump takes seconds
            threading.Thread(target=self._stacks_asked, args=(message["attempt"],
                             message["stamp"]), daemon=True, name="keeper-stacks").start()
            return
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
    """A node's exit record, capped (``MAX_*``) for the attempts node 0 keeps:
    only the fields the outcome is built from, each of a known type and
    size, so one record is bounded whatever a node sent."""
    out: dict = {} if _int(event.get("code")) is None else {"code": event["code"]}
    out["duration_s"] = _num(event.get("duration_s")) or 0
    if _num(event.get("stopped_at")) is not None:
        out["stopped_at"] = event["stopped_at"]
    for key in ("stepped", "stop_asked", "survivors_gone", "setup_failed"):
        if isinstance(event.get(key), bool):
            out[key] = event[key]
    out["reason"] = str(event.get("reason", ""))[:MAX_MESSAGE]
    out["failures"] = [_failure(f, MAX_MESSAGE) for f in _list(event.get("failures"))
                       if isinstance(f, dict)][:MAX_FAILURES]
    out["last_lines"] = [str(line)[-MAX_LINE:]
                         for line in _list(event.get("last_lines"))[-MAX_LAST_LINES:]]
    out["survivors"] = [{"pid": _int(s.get("pid")) or 0, "cmd": str(s.get("cmd", ""))[:MAX_CMD]}
                        for s in _list(event.get("survivors")) if isinstance(s, dict)
                        ][:MAX_SURVIVORS]
    if "lost" in event:
        out = {"lost": str(event["lost"])[:MAX_MESSAGE],
               **{k: event[k] for k in ("lost_at", "heard_at")
                  if _num(event.get(k)) is not None}}
    return out


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _failure(failure: dict, size: int) -> dict:
    stamp = failure.get("timestamp")
    path = failure.get("error_file")
    return {"local_rank": _int(failure.get("local_rank")) or 0,
            "message": str(failure.get("message", ""))[-size:],
            "timestamp": stamp if isinstance(stamp, (int, float))
            and not isinstance(stamp, bool) else 0,
            "error_file": str(path)[-size:] if path is not None else None}


def _failed_itself(entry: dict) -> bool:
    """A node record that may be the root cause: lost, or failed before it
    was asked to stop (the controller's rule, ``exit_outcome``: torchrun
    ended on its own, or a failure is stamped before the stop)."""
    if "lost" in entry or entry.get("hung"):
        return True
    if entry.get("code") in (0, None):
        return False
    if not entry.get("stop_asked") or entry.get("reason") == ENDED_ON_ITS_OWN:
        return True
    stopped = _num(entry.get("stopped_at"))
    stamps = [_num(f.get("timestamp")) for f in _list(entry.get("failures"))
              if isinstance(f, dict)]
    return stopped is not None and any(
        t is not None and t + (1 if float(t).is_integer() else 0) <= stopped for t in stamps)


def _brief(entry: dict, failures: int = 1, text: int = BRIEF_TEXT) -> dict:
    """A node record with its detail dropped, still a whole exit record (the
    controller checks it as one): the outcome, and ``failures`` failures."""
    if "lost" in entry:
        return {"lost": str(entry["lost"])[:text]}
    out = {k: entry[k] for k in ("code", "stop_asked", "stopped_at", "stepped",
                                 "survivors_gone", "hung") if k in entry}
    out.update(reason=str(entry.get("reason", ""))[:text], last_lines=[],
               duration_s=_num(entry.get("duration_s")) or 0,
               failures=[_failure(f, text) for f in _list(entry.get("failures"))
                         if isinstance(f, dict)][:failures],
               survivors=[{"pid": _int(s.get("pid")) or 0, "cmd": str(s.get("cmd", ""))[:80]}
                          for s in _list(entry.get("survivors")) if isinstance(s, dict)
                          ][:failures])
    return out


def _shrink(record: dict, level: int) -> dict:
    """An attempt's record with less detail: level 1, every node's record
    brief; level 2, the nodes that failed by themselves or were lost (the
    root cause is among them) brief, the others bare (their outcome only);
    level 3, only the nodes that failed by themselves or were lost."""
    nodes = dict(record.get("nodes") or {})
    kept = {k: _brief(e) if level == 1 or _failed_itself(e) else _brief(e, 0, 80)
            for k, e in nodes.items() if level < 3 or _failed_itself(e)}
    out = {**record, "nodes": kept}
    if len(kept) < len(nodes):
        out["nodes_omitted"] = int(record.get("nodes_omitted", 0)) + len(nodes) - len(kept)
    return out


def _size(value) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def fit_attempts(attempts: list[dict], budget: int = ATTEMPTS_BUDGET) -> tuple[list[dict], int]:
    """The attempts' records, cut to ``budget`` bytes of JSON, the oldest
    detail first; and how many of the oldest records had to go entirely.

    In order, until they fit: every attempt but the last with brief node
    records, oldest first; then with only the nodes that failed by
    themselves or were lost in detail and the others bare; then the last
    attempt (the run's outcome, node by node) brief; then the oldest
    attempts dropped; then the last attempt at less detail, then with only
    its failed and lost nodes, then without its nodes from the highest rank
    down (``nodes_omitted`` counts them)."""
    out = list(attempts)
    sizes = [_size(a) for a in out]

    def fits() -> bool:
        return sum(sizes) + len(sizes) + 1 <= budget

    def shrink(i: int, level: int) -> None:
        out[i] = _shrink(out[i], level)
        sizes[i] = _size(out[i])

    for level in (1, 2):
        for i in range(len(out) - 1):
            if fits():
                return out, 0
            shrink(i, level)
    if not out or fits():
        return out, 0
    shrink(-1, 1)
    omitted = 0
    while len(out) > 1 and not fits():
        out.pop(0)
        sizes.pop(0)
        omitted += 1
    for level in (2, 3):
        if not fits():
            shrink(-1, level)
    if not fits():
        last = dict(out[-1])
        nodes = dict(last.get("nodes") or {})
        over = sum(sizes) + len(sizes) + 1 - budget
        for k in sorted(nodes, key=lambda k: -int(k) if k.lstrip("-").isdigit() else 0):
            if over <= 0:
                break
            over -= _size({k: nodes.pop(k)})
            last["nodes_omitted"] = int(last.get("nodes_omitted", 0)) + 1
        out[-1] = {**last, "nodes": nodes}
    return out, omitted


def _rank_gpus(sup: Supervisor, use: dict | None) -> dict[str, dict]:
    """Each of this node's ranks' GPU in a sample (``gpus.sample``): rank ->
    its index, utilisation and memory now."""
    if not use:
        return {}
    visible = visible_gpus(sup.spec.env)
    out = {}
    for local, index in enumerate(visible[:sup.spec.nproc]):
        if str(index) in use:
            util, used = use[str(index)]
            out[str(sup.spec.first_rank + local)] = {"gpu": index, "gpu_util": util,
                                                     "gpu_mem_mib": used}
    return out


def _progress_of(sup: Supervisor) -> dict:
    """{rank: [step, age_s]}, or [step, age_s, samples] where the rank's
    heartbeat says its samples: the ranks' heartbeats and their output lines
    (``line_seen``), the younger of the two: what the hang rule counts."""
    progress = sup.progress()
    now = time.time()
    for rank, at in dict(sup.line_seen or {}).items():
        step, age, *samples = progress.get(str(rank), [None, None])
        line_age = round(max(0.0, now - at), 3)
        progress[str(rank)] = [step, line_age if age is None else min(age, line_age), *samples]
    return progress


def _still_there(survivor: dict) -> bool:
    """Is a survivor (``{pid, cmd}``) still that process? A zombie of ours
    (we are a subreaper) is reaped on the way."""
    pid = survivor.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        if int(fields[1]) == os.getpid():
            procs.reap(pid)
        return False
    return procs.command_line(pid) == survivor.get("cmd")


def _fresh_port(master_addr: str | None = None) -> int:
    """A free port for the next attempt's rendezvous, as ``bind`` checks it,
    in the family of the master address (an IPv6 master gets an IPv6 port)."""
    found = probes.bind(0, master_addr)
    if not found["ok"]:
        raise OSError(f"no free port for the next attempt: {found['error']}")
    return found["port"]
