"""Follow a resolved dry-run on its nodes as one gang, as its owner says.

One watch loop for every backend and way a run is held: the controller's
run (stopped on the rule's verdict, ``agent/gangrule.py``, and torn down in
a ``finally`` whatever happens), a kept run (the keepers hold the gang), or
a job we only watch (``attach``: stop nothing; Ctrl-C only leaves).
"""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from typing import Callable, Mapping

from ..agent.gangrule import (Clock, NodeView, Stop, Timeouts, Verdict, hang_words, judge,
                              stop_reason, tick)
from ..agent.stackgroups import place
from ..agent.wire.protocol import HEARTBEAT_S, PEER_TIMEOUT_S, pace_fields
from ..console import Console
from ..plan.dryrun import DryRun
from ..records.outcome import EndReason, RunOutcome, RunState, gang_outcome
from ..records.rundir import RunDir
from .agentlink import AgentHandle
from .fanout import on_all
from .gpuuse import rank_gpu
from .keptgang import Keepers, begin_kept, contact_lost, kept_outcome
from .nodehandle import NodeHandle
from .nodespec import supervisor_spec
from .stacks import StacksResult, save_stacks


PROGRESS_WRITE_S = 2.0  # progress.json at most this often
QUIET_PROGRESS_S = 15.0  # with --quiet, a progress line per node at most this often
# The watch looks every 0.5 s; a gap this long means we were stopped ourselves
# (SIGSTOP, Ctrl-Z, a laptop asleep), and the nodes were not silent: we were.
PAUSED_S = 10.0
PAUSE_SETTLE_S = 2.0  # after a pause, the relays' time to read what came meanwhile


class Part(enum.Enum):
    """The controller's part in a gang: decided once, from the run's owner
    and whether ``attach`` only watches."""

    JUDGE = "judge"  # it holds the gang: judges the rule, holds the setup barrier, tears down
    KEEPERS = "keepers"  # the keepers hold it: we start them and follow, and stop them on Ctrl-C
    WATCH = "watch"  # only watching (attach): stop nothing; Ctrl-C only leaves


class Gang:
    """One run of a resolved ``DryRun``; ``run()`` returns its ``RunOutcome``.
    A node's silence is a loss only where ``Owner.pings`` (a
    scheduler owns its nodes' liveness)."""

    def __init__(self, info: DryRun, run: RunDir, agents: Mapping[int, AgentHandle],
                 console: Console, *, watching: bool = False, grace_s: float = 10.0,
                 start_timeout_s: float = 300.0, hang_timeout_s: float | None = None,
                 dump_stacks: Callable[[], StacksResult] | None = None,
                 lines: int | None = None):
        self.info = info
        self.plan = info.plan
        self.run_dir = run
        self.console = console
        self.owner = info.owner
        self.part = Part.WATCH if watching else Part.KEEPERS if self.owner.keepers_hold \
            else Part.JUDGE
        self.grace_s = grace_s
        self.start_timeout_s = start_timeout_s
        # The hang rule: no rank's progress (a heartbeat or a line) for this
        # long once every node has started -> dump stacks, name the odd rank,
        # stop. A kept run's keepers hold it (``keeper_spec``), not us.
        self.hang_timeout_s = hang_timeout_s
        self.dump_stacks = dump_stacks
        # A kept run to start here: its gang restarts, as the dry-run says.
        self.keepers = Keepers(info.max_restarts) if self.part is Part.KEEPERS else None
        self.lines = lines  # where to follow a kept run from (attach)
        self.keepers_started: set[int] = set()
        self.lost_contact = ""  # why the controller left a kept run, when not asked to
        self._progress_written = self._progress_shown = time.monotonic()
        self._changed = threading.Event()  # some node's command ended
        self._over = threading.Event()  # the gang is done: stop pinging
        self.handles = [NodeHandle(launch, agents[launch.node_rank], run, console,
                                   on_change=self._changed.set) for launch in info.nodes]
        for handle in self.handles:  # a live stream's lines are progress (not attach's replay)
            handle.watch_output = not watching
        self.interrupted = False
        # From the first Ctrl-C on, another one (or a SIGTERM) is a flag the
        # teardown's wait looks at (kill at once), not an exception that could
        # land before the teardown's own ``try`` and skip its stop and kill.
        self._hurried = False
        self._handlers: dict = {}
        self.left = False
        self.paused_s = 0.0  # the longest we were stopped ourselves, by the watch's clock
        self.stop_why = ""  # who stopped the gang and why, each node's reason for its end

    @property
    def judges(self) -> bool:
        return self.part is Part.JUDGE

    @property
    def leaves(self) -> bool:
        """Detached and started here: we leave once every node has started."""
        return self.owner.detached and self.part is not Part.WATCH

    def run(self) -> RunOutcome:
        """Start the nodes or their keepers, or follow what runs; watch; tear down ours."""
        started = time.monotonic()
        by_rank = {h.node.node_rank: h for h in self.handles}
        if self.owner.keepers_hold:
            begin_kept(self, by_rank)
        try:
            if not self.owner.keepers_hold:
                port = int(self.plan.master_port)
                on_all(lambda k: by_rank[k].start(
                    supervisor_spec(by_rank[k].launch, self.plan.run_id, port, self.grace_s,
                                    self.owner)),
                    by_rank).values("starting the nodes", self.label)
            if self.judges and self.plan.setup:
                # no rank exists yet: each node runs its setup first (_release_setup)
                self.console.milestone(f"running setup: on {len(self.handles)} node(s) before "
                                       f"their {self.plan.world_size} processes start; logs "
                                       f"in {self.run_dir.path}")
            elif self.judges:
                self.console.milestone(f"started {self.plan.world_size} processes on "
                                       f"{len(self.handles)} node(s); logs in {self.run_dir.path}")
            # The nodes hear us (``ping``): a supervisor, or an attached kept
            # run's follower, stops its run after PEER_TIMEOUT_S of silence.
            threading.Thread(target=self._ping, daemon=True, name="gang-ping").start()
            self._watch()
        except KeyboardInterrupt as exc:
            self._interrupted(exc)
        finally:
            self._over.set()
            try:
                if self.judges and not self.left:
                    self._teardown()
                elif self.owner.keepers_hold:
                    for handle in self.handles:
                        if self.left or handle.control is None:
                            handle.agent.close(timeout_s=2.0)  # the follower leaves; the run goes on
            finally:
                for sig, handler in self._handlers.items():
                    signal.signal(sig, handler)
        wall = time.monotonic() - started
        if self.owner.keepers_hold:
            outcome = kept_outcome(self, wall)
            self._report_progress(final=True)
            return outcome
        if self.left:
            return RunOutcome(self.plan.run_id, RunState.RUNNING, wall,
                              tuple(h.finish(timeout=0.1) for h in self.handles), None, None)
        paused = self.paused_words()
        if paused:  # the nodes that stopped as we were paused: why, on our side
            for handle in self.handles:
                handle.facts.find(EndReason.PAUSED, paused)
        outcomes = tuple(h.finish() for h in self.handles)
        self._report_progress(final=True)  # the nodes' last heartbeats, read by finish()
        return gang_outcome(self.plan.run_id, outcomes, time.monotonic() - started,
                            interrupted=self.interrupted)

    def paused_words(self) -> str:
        """Why the nodes stopped if we were paused past the peer timeout, else ""."""
        if self.paused_s < PEER_TIMEOUT_S:
            return ""
        return (f"stopped its run after {PEER_TIMEOUT_S:g}s without hearing from ddp-orch, "
                f"which was paused for {self.paused_s:.0f}s (stopped, or its machine asleep); "
                "keep it awake while the run goes on, or use `up --detach`")

    def _interrupted(self, exc: KeyboardInterrupt) -> None:
        """Ctrl-C or a signal (``down``): stop what is ours, else only leave."""
        if self.judges:
            self._hurry_on_signals()
        elif self.part is Part.WATCH or self.leaves:
            self.left = True
            return
        self.interrupted = True
        who = stopper(exc, self.run_dir)
        self.console.always(f"ddp-orch: interrupted by {who}; stopping every node "
                            "(press Ctrl-C again to kill at once)")
        self.stop_why = f"stopped by {who}"
        if self.owner.keepers_hold:  # the keepers stop the run; they report its end
            for handle in self.handles:
                handle.stop(self.stop_why)
            self.await_finish()

    def label(self, node_rank: int) -> str:
        return f"node {node_rank} ({self.plan.nodes[node_rank].host})"

    def _watch(self) -> None:
        """Until the gang is over (or, detached, has started); on a stop verdict
        ask every node to stop and return: the teardown enforces the deadline."""
        clock = Clock(time.monotonic())
        looked = (time.monotonic(), time.time())
        while True:
            # the monotonic clock stops while the machine sleeps; the wall clock does not
            away = max(time.monotonic() - looked[0], time.time() - looked[1])
            if away > PAUSED_S:  # we were stopped, or the machine slept
                self.paused_s = max(self.paused_s, away)
                # the relays were stopped with us: what the nodes sent meanwhile
                # (their heartbeats, their ends) is read before anyone is judged
                time.sleep(PAUSE_SETTLE_S)
            looked = (time.monotonic(), time.time())
            self._changed.clear()
            if self.owner.keepers_hold:
                if all(h.control is not None for h in self.handles):  # every keeper finished
                    return
                if contact_lost(self):
                    return
            elif all(h.poll() is not None for h in self.handles):
                return
            if self.leaves and all(h.started for h in self.handles):
                self.left = True
                return
            self._release_setup()
            now = time.monotonic()
            views = [self._view(h) for h in self.handles]
            clock = tick(clock, views, now)
            verdict = None
            if self.judges:
                verdict = judge(views, Timeouts(self.start_timeout_s, PEER_TIMEOUT_S,
                                                self.hang_timeout_s), clock, now)
            elif self.keepers is not None and all(h.attempt == 0 for h in self.handles):
                # A kept run: the keepers judge every attempt; the controller
                # only gives up on a first start that never comes.
                verdict = judge(views, Timeouts(self.start_timeout_s), clock, now)
            if verdict is not None:
                self._act(verdict)
                return
            self._report_progress()
            self._changed.wait(0.5)  # woken at once when a node ends

    def _view(self, handle: NodeHandle) -> NodeView:
        """A node as the rule sees it; a kept run's node has no end to judge here."""
        return NodeView(handle.node.node_rank, self.label(handle.node.node_rank),
                        code=handle.poll() if self.judges else None,
                        joined=handle.joined, started=handle.started,
                        setup_done=not self.plan.setup or handle.setup_ok,
                        heard_s=handle.heard_s if self.judges
                        and self.owner.pings else None,
                        progress=tuple((rank, at) for rank, (_step, at)
                                       in dict(handle.progress).items()))

    def _act(self, verdict: Verdict) -> None:
        """Stop the gang for ``verdict``, marking the nodes it blames."""
        by_rank = {h.node.node_rank: h for h in self.handles}
        blamed = [by_rank[k] for k in verdict.nodes]
        why = verdict.why
        if verdict.stop is Stop.LOST:
            for handle in blamed:
                handle.give_up()
        elif verdict.stop is Stop.START_TIMEOUT:
            for handle in blamed:
                handle.facts.find(EndReason.START_TIMEOUT)
        elif verdict.stop is Stop.HANG:
            why = self._hang(verdict, by_rank)
        self.stop_all(why)
        if self.owner.keepers_hold:
            self.await_finish()

    def _hang(self, verdict: Verdict, by_rank: Mapping[int, NodeHandle]) -> str:
        """Dump and keep every rank's stack, mark the odd ranks' nodes; the root cause."""
        result = None
        if self.dump_stacks is not None:
            try:
                result = self.dump_stacks()
            except Exception as exc:  # noqa: BLE001 (the hang is still the cause)
                self.console.info(f"could not dump the ranks' stacks: {exc}")
        if result is not None and result.ranks:
            saved, _text = save_stacks(self.run_dir.path, result, self.plan.run_id)
            self.console.info(f"stacks of every rank kept in {saved}")
        places = {s.rank: place(s.how, s.text, s.error) for s in result.ranks} \
            if result is not None else None
        ranks_of = {k: by_rank[k].node.ranks for k in verdict.nodes}
        why, blamed = hang_words(verdict, places, ranks_of)
        for k in blamed:
            by_rank[k].facts.find(EndReason.HUNG, why)
        return why

    def _release_setup(self) -> None:
        """Tell every node to go once all setups succeeded, where the controller
        holds the barrier (a Slurm job and a kept run hold their own)."""
        if self.judges and self.plan.setup \
                and all(h.setup_ok for h in self.handles):
            if not any(h.go_sent for h in self.handles):
                self.console.milestone(f"setup: done on every node; started "
                                       f"{self.plan.world_size} processes on "
                                       f"{len(self.handles)} node(s)")
            for handle in self.handles:
                handle.go()

    def _report_progress(self, final: bool = False) -> None:
        """Each rank's progress into ``progress.json`` (``status`` of a live run),
        and with ``--quiet`` a line per node now and then. A rank with no progress
        is listed too, once its node runs: most programs print on rank 0 only."""
        now = time.monotonic()
        if self.leaves or not final and now - self._progress_written < PROGRESS_WRITE_S:
            # A run we leave once it has started keeps its progress on its
            # nodes (``status`` asks them): a file here would go stale.
            return
        self._progress_written = now
        wall = time.time()
        ranks = {}
        gpu_of = {r.rank: r.gpu for r in self.plan.ranks}
        for h in self.handles:
            seen, lines = dict(h.progress), dict(h.output_at)
            samples, pace, stepped = dict(h.samples), dict(h.pace), dict(h.step_at)
            for rank in h.node.ranks:
                gpu = rank_gpu(h.gpu_use, gpu_of.get(rank))
                if rank not in seen and not gpu and not h.started:
                    continue
                step, at = seen.get(rank, (None, None))
                line_at = lines.get(rank)
                ranks[rank] = {"node_rank": h.node.node_rank, "host": h.node.host, "step": step,
                               "samples": samples.get(rank),
                               **pace_fields(pace.get(rank)),
                               "last_progress": None if at is None else
                               round(wall - (now - at), 3),
                               "last_step": None if rank not in stepped else
                               round(wall - (now - stepped[rank]), 3),
                               "last_output": None if line_at is None else
                               round(wall - (now - line_at), 3), **gpu}
        if not ranks:
            return
        # a kept run's attempt, as its keepers announce each one (``top``)
        attempt = {"attempt": max(h.attempt for h in self.handles)} if self.owner.keepers_hold else {}
        try:
            self.run_dir.write_progress({"updated": wall, **attempt, "ranks": ranks})
        except OSError:
            pass  # the runs directory is full: the node logs' writer says so, once
        if not final and self.console.view == "quiet" \
                and now - self._progress_shown >= QUIET_PROGRESS_S:
            self._progress_shown = now
            for h in self.handles:
                mine = [ranks[r] for r in h.node.ranks if r in ranks]
                if mine:
                    self.console.always(progress_line(h.node.node_rank, h.node.host, mine, wall))

    def _ping(self) -> None:
        """``ping`` every node while the gang runs."""
        while not self._over.wait(HEARTBEAT_S):
            for handle in self.handles:
                handle.ping()

    def stop_all(self, why: str) -> None:
        """Stop every node for ``why``, which each records as its reason."""
        self.console.info(f"{why}; stopping every node")
        self.stop_why = self.stop_why or stop_reason(why)
        for handle in self.handles:
            handle.stop(self.stop_why)

    def _hurry_on_signals(self) -> None:
        """Ctrl-C or SIGTERM from now on sets ``_hurried`` (``_teardown``)."""
        def hurry(_signum, _frame) -> None:
            self._hurried = True

        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, hurry)
        except ValueError:  # not the main thread: a second one raises, as before
            pass

    def await_finish(self) -> None:
        """A kept run: until every keeper we can still hear has finished, within
        the grace period. A lost node's keeper stops on its own."""
        wait_all([h for h in self.handles if not h.given_up], self.grace_s + 30.0)

    def _teardown(self) -> None:
        """Stop what still runs: gracefully, then SIGKILL through the
        supervisors, then cut them off. A 2nd Ctrl-C skips the grace period."""
        running = [h for h in self.handles
                   if h.supervising and not h.given_up and h.poll() is None]
        if not running:
            return
        try:
            for handle in running:
                handle.stop(self.stop_why)
            self._await_stopped(running, self.grace_s + 5.0)
            if self._hurried:
                self.console.always("ddp-orch: second interrupt; killing now")
        except KeyboardInterrupt:
            self.console.always("ddp-orch: second interrupt; killing now")
        finally:
            for handle in running:
                handle.kill()
            wait_all(running, 5.0)
            for handle in running:
                handle.abort()


    def _await_stopped(self, handles: list[NodeHandle], timeout_s: float) -> None:
        """Until every node has ended, ``timeout_s``, or a second Ctrl-C. A node
        that turns silent meanwhile is given up on at once: it cannot hear the stop."""
        deadline = time.monotonic() + timeout_s
        while any(h.poll() is None for h in handles) and time.monotonic() < deadline \
                and not self._hurried:
            if self.owner.pings:
                for handle in handles:
                    if handle.silent:
                        handle.give_up()
            time.sleep(0.05)


def stopper(exc: BaseException, run: RunDir) -> str:
    """Who stopped the run: the words ``down`` left, else the signal to the
    controller, else Ctrl-C."""
    asked = run.stop_request()
    if asked:
        return asked
    signum = getattr(exc, "signum", signal.SIGINT)
    if signum == signal.SIGINT:
        return "Ctrl-C on the controller"
    return f"{signal.Signals(signum).name} to the controller (pid {os.getpid()})"


def wait_all(handles: list[NodeHandle], timeout_s: float) -> None:
    """Until every handle's command has ended, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(h.poll() is None for h in handles):
        time.sleep(0.05)


def progress_line(node_rank: int, host: str, ranks: list[dict], wall: float) -> str:
    """``--quiet``'s line for one node; a rank with no progress counts as
    having no output, not as stalled."""
    stamps = [r["last_progress"] for r in ranks if r["last_progress"] is not None]
    silent = len(ranks) - len(stamps)
    head = f"ddp-orch: node {node_rank} ({host}): {len(ranks)} rank(s)"
    if not stamps:
        return f"{head}, no output yet{_gpu_words(ranks)}\n"
    steps = sorted(r["step"] for r in ranks if r["step"] is not None)
    at = f" at step {steps[0]}" + (f"-{steps[-1]}" if steps[-1] != steps[0] else "") \
        if steps else ""
    quiet = f" ({silent} with no output yet)" if silent else ""
    return (f"{head}{at}, last progress {wall - max(stamps):.0f}s ago{quiet}"
            f"{_gpu_words(ranks)}\n")


def _gpu_words(ranks: list[dict]) -> str:
    """``; GPUs 97%, 95% busy``: the node's ranks' GPU utilisation now."""
    utils = [f"{r['gpu_util']}%" for r in ranks if r.get("gpu_util") is not None]
    return f"; GPUs {', '.join(utils)} busy" if utils else ""
