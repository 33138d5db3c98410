"""Run a resolved dry-run on its nodes as one gang, and own it until it is over.

Lifecycle: every node's agent, which has the code already (see
``AgentBackend.launch``), becomes its supervisor, all in parallel. The gang then watches
them. When one node fails, the others are stopped at once. Whatever
happens (success, failure, Ctrl-C, an exception), the ``finally`` block
stops every node still running: ``stop`` on stdin, a deadline, ``kill``,
then the channel is cut, which the supervisors also treat as "tear down".
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Callable, Mapping

from ..agent.wire.protocol import HEARTBEAT_S, PEER_TIMEOUT_S
from ..console import Console
from ..plan.dryrun import DryRun
from ..records.outcome import RunOutcome, RunState, gang_outcome
from ..records.rundir import RunDir
from .agentlink import AgentHandle
from .fanout import on_all
from .stacks import hang_summary, keep, odd_ranks
from .stacks import StacksResult
from .nodehandle import NodeHandle, supervisor_spec


PROGRESS_WRITE_S = 2.0  # progress.json at most this often
QUIET_PROGRESS_S = 15.0  # with --quiet, a progress line per node at most this often


class Gang:
    """One launch of a resolved ``DryRun``; ``run()`` returns its ``RunOutcome``."""

    def __init__(self, info: DryRun, run: RunDir, agents: Mapping[int, AgentHandle],
                 console: Console, *, grace_s: float = 10.0, start_timeout_s: float = 300.0,
                 watch_silence: bool = True, hang_timeout_s: float | None = None,
                 dump_stacks: Callable[[], StacksResult] | None = None,
                 leave_when_started: bool = False, observe: bool = False,
                 release_setup: bool = True):
        self.info = info
        self.plan = info.plan
        self.run_dir = run
        self.console = console
        self.grace_s = grace_s
        self.start_timeout_s = start_timeout_s
        # A node silent for PEER_TIMEOUT_S is given up on, unless the nodes'
        # liveness is someone else's (Slurm's).
        self.watch_silence = watch_silence
        # The hang watchdog: no rank's progress (a heartbeat or a line) for this
        # long once every node has started -> dump stacks, name the odd rank, stop.
        self.hang_timeout_s = hang_timeout_s
        self.dump_stacks = dump_stacks
        self.all_started_at: float | None = None
        self._progress_written = self._progress_shown = time.monotonic()
        self._changed = threading.Event()  # some node's command ended
        self._over = threading.Event()  # the gang is done: stop pinging
        self.handles = [NodeHandle(launch, agents[launch.node_rank], run, console,
                                   on_change=self._changed.set) for launch in info.nodes]
        for handle in self.handles:
            handle.watch_output = hang_timeout_s is not None
        self.interrupted = False
        # From the first Ctrl-C on, another one (or a SIGTERM) is a flag the
        # teardown's wait looks at (kill at once), not an exception that could
        # land before the teardown's own ``try`` and skip its stop and kill.
        self._hurried = False
        self._handlers: dict = {}
        # A scheduler's job outlives us (Slurm): ``leave_when_started`` returns
        # once every node runs (``up --detach``); ``observe`` follows a job we
        # did not start (``attach``) and never stops it: Ctrl-C just leaves.
        self.leave_when_started = leave_when_started
        self.observe = observe
        self.left = False
        # ``setup:``: the controller holds the barrier (``go`` to every node
        # once all have succeeded), unless the nodes hold it themselves (a
        # Slurm job's files, a kept run's gang).
        self.release_setup = release_setup and not observe
        self._setup_done = not self.plan.setup

    def run(self) -> RunOutcome:
        """Start every node (their agents have the code already), watch them,
        tear down."""
        started = time.monotonic()
        by_rank = {h.node.node_rank: h for h in self.handles}
        try:
            port = int(self.plan.master_port)
            on_all(lambda k: by_rank[k].start(
                supervisor_spec(by_rank[k].launch, self.plan.run_id, port, self.grace_s)),
                by_rank).values("starting the nodes", self._label)
            if not self.observe:
                self.console.info(f"started {self.plan.world_size} processes on "
                                  f"{len(self.handles)} node(s); logs in {self.run_dir.path}")
            threading.Thread(target=self._ping, daemon=True, name="gang-ping").start()
            self._watch()
        except KeyboardInterrupt:
            if self.observe:
                self.left = True
            else:
                self._hurry_on_signals()
                self.interrupted = True
                self.console.always("ddp-orch: interrupted; stopping every node "
                                    "(press Ctrl-C again to kill at once)")
        finally:
            self._over.set()
            try:
                if not (self.left or self.observe):
                    self._teardown()
            finally:
                for sig, handler in self._handlers.items():
                    signal.signal(sig, handler)
        if self.left:
            return RunOutcome(self.plan.run_id, RunState.RUNNING, time.monotonic() - started,
                              tuple(h.finish(timeout=0.1) for h in self.handles), None, None)
        outcomes = tuple(h.finish() for h in self.handles)
        return gang_outcome(self.plan.run_id, outcomes, time.monotonic() - started,
                            interrupted=self.interrupted)

    def _label(self, node_rank: int) -> str:
        return f"node {node_rank} ({self.plan.nodes[node_rank].host})"

    def _watch(self) -> None:
        """Wait for every node; on the first failure or a start timeout, ask
        all to stop and return: ``_teardown`` enforces the deadline."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            self._changed.clear()
            codes = [h.poll() for h in self.handles]
            if all(code is not None for code in codes):
                return
            if self.leave_when_started and all(h.started for h in self.handles):
                self.left = True
                return
            if self._setup_pending():  # the start timeout counts once every setup is done
                deadline = time.monotonic() + self.start_timeout_s
            if self.observe:  # someone else's job: watch it end, stop nothing
                self._report_progress()
                self._changed.wait(0.5)
                continue
            silent = [h for h in self.handles if h.silent] if self.watch_silence else []
            if silent:
                for handle in silent:
                    handle.partitioned = True
                    handle.abort()  # it cannot hear a stop; its agent gives up on us too
                self._stop_all(", ".join(self._label(h.node.node_rank) for h in silent)
                               + f" silent for {PEER_TIMEOUT_S:g}s")
                return
            failed = [h for h, code in zip(self.handles, codes) if code not in (None, 0)]
            if failed:
                first = failed[0]
                self._stop_all(f"{self._label(first.node.node_rank)} failed "
                               f"(exit {first.poll()})")
                return
            elif self._hung():
                return
            elif time.monotonic() > deadline and not all(h.started for h in self.handles):
                self._give_up_start()
                return
            self._report_progress()
            self._changed.wait(0.5)  # woken at once when a node ends

    def _setup_pending(self) -> bool:
        """True while some node still runs its ``setup:``. Once every node's
        has succeeded, each is told to go (where the controller holds the
        barrier). A node whose setup fails ends with its exit event, which
        stops the gang like any failure."""
        if self._setup_done:
            return False
        if not all(h.setup_ok for h in self.handles):
            return True
        self._setup_done = True
        if self.release_setup:
            for handle in self.handles:
                handle.go()
        return False

    def _give_up_start(self) -> None:
        """The start timeout passed before every node started: name the nodes
        that have not joined (else those not started), and stop every node."""
        missing = [h for h in self.handles if not h.joined] or \
            [h for h in self.handles if not h.started]
        for handle in missing:
            handle.timed_out = True
        names = ", ".join(self._label(h.node.node_rank) for h in missing)
        self._stop_all(f"the rendezvous did not complete within {self.start_timeout_s:g}s; "
                       f"not joined: {names}")

    def _report_progress(self) -> None:
        """Each rank's last step and progress time into ``progress.json`` (for
        ``status`` of a live run), and with ``--quiet`` one line per node now
        and then, so a long quiet run still shows it is alive."""
        now = time.monotonic()
        if now - self._progress_written < PROGRESS_WRITE_S:
            return
        self._progress_written = now
        wall = time.time()
        ranks = {rank: {"node_rank": h.node.node_rank, "host": h.node.host, "step": step,
                        "last_progress": round(wall - (now - at), 3)}
                 for h in self.handles for rank, (step, at) in sorted(dict(h.progress).items())}
        if not ranks:
            return
        self.run_dir.write_progress({"updated": wall, "ranks": ranks})
        if self.console.view == "quiet" and now - self._progress_shown >= QUIET_PROGRESS_S:
            self._progress_shown = now
            for h in self.handles:
                mine = [ranks[r] for r in h.node.ranks if r in ranks]
                if mine:
                    steps = sorted(r["step"] for r in mine if r["step"] is not None)
                    at = f" at step {steps[0]}" + (f"-{steps[-1]}" if steps[-1] != steps[0]
                                                    else "") if steps else ""
                    age = wall - max(r["last_progress"] for r in mine)
                    self.console.always(f"ddp-orch: node {h.node.node_rank} ({h.node.host}): "
                                        f"{len(mine)} rank(s){at}, last progress "
                                        f"{age:.0f}s ago\n")

    def _hung(self) -> bool:
        """The hang watchdog; True once it has found a hang and stopped the gang."""
        if self.hang_timeout_s is None or not all(h.started for h in self.handles):
            return False
        now = time.monotonic()
        if self.all_started_at is None:
            self.all_started_at = now
        # Only nodes still running: one that ended (say, exited 0 while rank 0
        # writes a last checkpoint) is not hung. dict(): the relay adds ranks.
        running = [h for h in self.handles if h.poll() is None]
        seen = {rank: at for h in running for rank, (_step, at) in dict(h.progress).items()}
        idle = now - max([self.all_started_at, *seen.values()])
        if idle <= self.hang_timeout_s:
            return False
        quiet_first = min(seen, key=seen.get) if seen else None
        result = None
        if self.dump_stacks is not None:
            try:
                result = self.dump_stacks()
            except Exception as exc:  # noqa: BLE001 (the hang is still the cause)
                self.console.info(f"could not dump the ranks' stacks: {exc}")
        why = hang_summary(result, idle, quiet_first)
        if result is not None and result.ranks:
            saved, _text = keep(self.run_dir.path, result, self.plan.run_id)
            self.console.info(f"stacks of every rank kept in {saved}")
        odd = {s.node_rank for s in odd_ranks(result)} if result is not None else set()
        if not odd and quiet_first is not None:
            odd = {h.node.node_rank for h in running if quiet_first in h.node.ranks}
        for handle in running:
            if handle.node.node_rank in (odd or {h.node.node_rank for h in running}):
                handle.hung_reason = why
        self._stop_all(why)
        return True

    def _ping(self) -> None:
        """``ping`` every node while the gang runs (see ``protocol.HEARTBEAT_S``)."""
        while not self._over.wait(HEARTBEAT_S):
            for handle in self.handles:
                handle.ping()

    def _stop_all(self, why: str) -> None:
        self.console.info(f"{why}; stopping every node")
        for handle in self.handles:
            handle.stop()

    def _hurry_on_signals(self) -> None:
        """Ctrl-C or SIGTERM from now on sets ``_hurried`` (``_teardown``)."""
        def hurry(_signum, _frame) -> None:
            self._hurried = True

        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, hurry)
        except ValueError:  # not the main thread: a second one raises, as before
            pass

    def _teardown(self) -> None:
        """Stop what still runs: gracefully, then SIGKILL through the
        supervisors, then cut them off. A 2nd Ctrl-C skips the grace period."""
        running = [h for h in self.handles
                   if h.supervising and not h.partitioned and h.poll() is None]
        if not running:
            return
        try:
            for handle in running:
                handle.stop()
            wait_all(running, self.grace_s + 5.0, until=lambda: self._hurried)
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


def wait_all(handles: list[NodeHandle], timeout_s: float,
             until: Callable[[], bool] = lambda: False) -> None:
    """Until every handle's command has ended, ``timeout_s`` or ``until()``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(h.poll() is None for h in handles) \
            and not until():
        time.sleep(0.05)


