"""A node's side of a kept run: one that needs no controller to stay a gang.

``up --detach`` and ``up --max-restarts N`` start a keeper on every node
instead of a supervisor on the controller's channel: a daemon in a session
of its own that writes all it says into ``agent.out``, so the controller
may go away and come back (``attach``, ``logs --follow``, ``status``).

The keepers hold the gang among themselves (``peers.py``): node 0's is the
head (``head.py``), which runs the attempts and decides on restarts; every
other node's is a member (``member.py``). This is what every keeper does.

A node that loses its head stops too, so however one node goes (a rank
fails, its keeper is SIGKILLed, its host freezes) every other node starts
its teardown within ``peers.GANG_TIMEOUT_S`` and is gone a grace period
later: 20 s in all by default. Attached (``--max-restarts`` without
``--detach``), a keeper whose follower is gone stops the gang too.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import shutil
import signal
import threading
import time
from typing import Iterable

from . import mailbox, peers
from .attempts import compact
from .spec import KeeperSpec
from .. import layout
from ..node import gpus, procs, stacks
from ..node.holdings import Holdings
from ..node.procs import start_time
from ..node.spec import SupervisorSpec
from ..node.stream import Stream
from ..gangrule import stop_reason
from ..node.supervisor import GPU_SAMPLE_TIMEOUT_S, Supervisor, visible_gpus
from ..stackgroups import place
from ..wire import files
from ..wire.protocol import HEARTBEAT_S, Ended, Event, encode, message, pace_fields
from ..wire.runstate import RunState

SURVIVOR_WAIT_S = 30.0  # how long a node waits for what would not die before it reports
FOLLOWER_POLL_S = 1.0  # how often an attached keeper looks for its follower
MAX_PLACE = 300  # one rank's place (``stackgroups.place``) as a node reports it
# Each rank's last step in keeper.json (``status`` of a live detached run):
# at most this many ranks, so the record stays small (looked at every GANG_HEARTBEAT_S).
MAX_PROGRESS_RANKS = 256


def attempt_spec(spec: SupervisorSpec, attempt: int, master_port: int) -> SupervisorSpec:
    """One attempt's supervisor spec: the dry-run's for attempt 0; later, a
    fresh master port, the attempt's own torchrun log directory and
    ``DDP_ORCH_RESTART_COUNT``. Only torchrun's own two options are swapped
    in the argv: the user's program and its arguments are never touched."""
    log_dir = os.path.join(spec.run_dir, layout.attempt_logs(attempt))
    swap = {"--master-port": str(master_port), "--log-dir": log_dir}
    argv = list(spec.argv)
    own = argv.index(layout.SHIM_MODULE) - 1 if layout.SHIM_MODULE in argv else len(argv)
    for i, word in enumerate(argv[:own - 1]):
        if word in swap:
            argv[i + 1] = swap[word]
    out = dataclasses.replace(spec, argv=tuple(argv), master_port=master_port, log_dir=log_dir,
                              env={**spec.env, "DDP_ORCH_RESTART_COUNT": str(attempt)})
    if attempt and out.setup:  # ``setup:`` runs once, before the first attempt
        # the bundle is unpacked once too: a restart runs on what setup made of it
        out = dataclasses.replace(out, setup=None, bundle=None)
    return out


def signalled(said: str, name: str, node_rank: int) -> str:
    """Why a keeper stops for good on signal ``name``, from what its sender
    left (``said``): the stopper's words, the same on every node; a lost
    controller, this node's ("... on node 1"); else the signal."""
    if said.startswith("stopped by"):
        return said
    if said:
        return f"{said} on node {node_rank}"
    return f"stopped by {name} to node {node_rank}'s keeper"


class Keeper(abc.ABC):
    """What every node's keeper does; ``run()`` returns the node's last
    torchrun code. Its role (``head.Head``, ``member.Member``) holds the gang."""

    def __init__(self, spec: KeeperSpec, holdings: Holdings | None = None):
        self.spec = spec
        self.holdings = holdings or Holdings()  # the run's port and GPU locks, from the agent
        self.sup_spec = spec.supervisor
        self.node_rank = self.sup_spec.node_rank
        self.nnodes = spec.nnodes
        self.run_dir = self.sup_spec.run_dir
        self.lock = threading.Condition()
        self.supervisor: Supervisor | None = None
        self.final = ""  # why the run stops for good (a signal, a peer's signal)
        self.signals = 0
        self.stop_for: dict[int, str] = {}  # attempt -> why it stops (maybe before it starts)
        self.current = 0
        self.finishing = False  # gang-finish sent or heard: links closing now are no loss
        # Secret env values: masked in every string this keeper writes or sends
        # (its agent.out, keeper.json, the gang link), at the source, value by
        # value, before anything is serialized (masking serialized JSON could
        # break it: a "secret" may read "false").
        self.secrets = [v for v in self.sup_spec.secrets if v]
        self.setup_go = threading.Event()  # every node's setup is done (``gang-go``)
        self._signalled = os.pipe()  # the signal handler's only act: a byte here
        self.over = threading.Event()  # the run has ended here
        self.followed = False  # an attached run's follower has been seen (``_watch_follower``)
        self.state_lock = threading.Lock()  # keeper.json: one writer at a time
        self.unrecorded = ""  # why keeper.json could not be written last time, said once
        self.stream = Stream(1)  # agent.out, which the daemon made our stdout
        # this attempt's ranks here: rank -> step, samples, when
        self.progress: dict[str, dict] = {}

    # -- what each role does ----------------------------------------------------

    @abc.abstractmethod
    def keep(self) -> tuple[int, str]:
        """Hold the gang until the run ends: (this node's last torchrun code, state)."""

    @abc.abstractmethod
    def on_local_stop(self) -> None:
        """Tell the rest of the gang that this node stops the run for good."""

    @abc.abstractmethod
    def on_own_failure(self, attempt: int, code: int) -> None:
        """This node's torchrun exited non-zero (called from its reaper thread)."""

    @abc.abstractmethod
    def tell_progress(self, attempt: int, started: bool, progress: dict) -> None:
        """Whether this node's torchrun has started, and its ranks' progress
        (``_progress_of``): what the gang's rule is judged on."""

    @abc.abstractmethod
    def setup_done_here(self) -> None:
        """This node's ``setup:`` is done (the gang's barrier)."""

    def fitted_attempts(self) -> dict:
        """The attempts' records for keeper.json (only the head keeps them)."""
        return {}

    def attempts_done(self) -> int:
        """How many attempts have ended (only the head keeps count)."""
        return 0

    # -- every node -------------------------------------------------------------

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chdir(self.run_dir)
        threading.Thread(target=self._on_signals, daemon=True, name="keeper-signals").start()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self.write_state(RunState.RUNNING)
        threading.Thread(target=self._beat, daemon=True, name="keeper-beat").start()
        if not self.spec.owner.detached:
            threading.Thread(target=self._watch_follower, daemon=True,
                             name="keeper-follower").start()
        try:
            code, state = self.keep()
        except Exception as exc:  # noqa: BLE001 (recorded, then the keeper ends)
            self.say(f"ddp-orch: keeper failed: {type(exc).__name__}: {exc}")
            code, state = 1, RunState.FAILED
        self.over.set()
        try:  # the record first: whoever reads the finished line finds the end recorded
            self.write_state(state, code)
        except OSError as exc:  # a full disk: the stream below still says how it ended
            self.say(f"ddp-orch: cannot record the end in {layout.KEEPER_STATE}: {exc}")
        self.emit(self.finished_message(code, state))
        self.stream.give_back()
        return code

    def _on_signal(self, signum: int, _frame) -> None:
        """Stop for good; a second signal skips the grace period. A handler
        may run inside a lock, so it only writes a byte for ``_on_signals``."""
        os.write(self._signalled[1], bytes([signum]))

    def _on_signals(self) -> None:
        while True:
            signum = os.read(self._signalled[0], 1)[0]
            self.signals += 1
            said = mailbox.stop_request(self.run_dir) if signum == signal.SIGTERM else ""
            why = signalled(said, signal.Signals(signum).name, self.node_rank)
            self.stop_for_good(why, said or why, hurry=self.signals > 1)  # this node's: no "on"

    def stop_for_good(self, why: str, short: str = "", hurry: bool = False) -> None:
        """Stop the run, with no restart: this node's attempt and the gang's
        (``why``; ``short``: the same for this node's own record)."""
        self.final = self.final or why
        sup = self.supervisor
        if sup is not None:
            sup.request_stop(short or why)
            if hurry:
                sup.hurry.set()
        with self.lock:
            self.lock.notify_all()  # a backoff waiting for a restart ends now
        self.on_local_stop()

    def _beat(self) -> None:
        """A heartbeat every ``HEARTBEAT_S`` while no supervisor beats, so the
        stream goes quiet only when this process does."""
        while not self.over.wait(HEARTBEAT_S):
            if self.supervisor is None:
                self.emit(message(Event.HEARTBEAT))

    def _watch_follower(self) -> None:
        """Stop the run once the follower (``daemon.follow``) is gone, however
        it went (``kill -9`` too), or if none came within the start timeout."""
        deadline = time.monotonic() + self.spec.start_timeout_s
        seen = False
        while not self.over.wait(FOLLOWER_POLL_S):
            if mailbox.follower_present(self.run_dir):
                if not seen:  # recorded: from now on its going stops the run
                    seen = self.followed = True
                    self.write_state(RunState.RUNNING, unless_over=True)
            elif seen or time.monotonic() > deadline:
                why = (f"the controller's follower on node {self.node_rank} is gone"
                       if seen else f"no controller followed node {self.node_rank} within "
                                    f"{self.spec.start_timeout_s:g}s")
                self.say(f"ddp-orch: {why} (an attached run); stopping the run")
                self.stop_for_good(why)
                return

    def run_attempt(self, attempt: int, port: int) -> dict:
        """This node's torchrun for one attempt; its exit event."""
        spec = attempt_spec(self.sup_spec, attempt, port)
        if attempt:
            shutil.rmtree(os.path.join(self.run_dir, layout.PROGRESS_DIR), ignore_errors=True)
        self.emit(message(Event.ATTEMPT, attempt=attempt, master_port=port))
        with self.lock:
            self.current = attempt
            why = self.final or self.stop_for.get(attempt)
            if why:  # stopped before it started: nothing to run
                return {"code": 128 + signal.SIGTERM, "reason": stop_reason(why),
                        "ended": Ended.STOPPED.value, "failures": [],
                        "last_lines": [], "duration_s": 0, "stopped_at": time.time()}
            self.supervisor = sup = Supervisor(spec, holdings=self.holdings)
            sup.out = self.stream
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
        """Until this attempt ends here, every ``GANG_HEARTBEAT_S``: the ranks'
        progress to the head, for the start timeout and the hang rule, and
        into keeper.json for ``status``."""
        self.progress = {}
        watched = visible_gpus(sup.spec.env)
        while not sup.exited.wait(peers.GANG_HEARTBEAT_S):
            use = gpus.sample(watched, GPU_SAMPLE_TIMEOUT_S) if watched else None
            watched = watched if use else []  # no nvidia-smi, or it failed: not asked again
            self._record_progress(sup.progress(), _rank_gpus(sup, use), dict(sup.line_seen or {}),
                                  range(sup.spec.first_rank, sup.spec.first_rank + sup.spec.nproc)
                                  if sup.workers_started else ())
            self.tell_progress(attempt, sup.workers_started, _progress_of(sup))

    def _dump_stacks(self, stamp: str) -> dict[int, str]:
        """This node's ranks' stacks, kept in ``stacks/<stamp>/``; where each stands."""
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

    def _record_progress(self, heartbeats: dict, use: dict | None = None,
                         lines: dict | None = None, ranks: Iterable[int] = ()) -> None:
        """Each rank's progress and GPU use into keeper.json, on a change: a
        detached run has no controller to keep ``progress.json``, so
        ``status`` reads them here."""
        now = time.time()
        use = use or {}
        lines = {str(rank): at for rank, at in (lines or {}).items()}
        ranks = sorted(set(heartbeats) | set(use) | set(lines) | set(map(str, ranks)),
                       key=int)[:MAX_PROGRESS_RANKS]
        seen = {}
        for rank in ranks:
            step, age, *rest = heartbeats.get(rank, (None, None))
            line = lines.get(rank)
            times = [t for t in (None if age is None else now - age, line) if t is not None]
            seen[rank] = {"step": step, "samples": rest[0] if rest else None,
                          "last_step": None if age is None else round(now - age, 3),
                          **pace_fields(tuple(rest[1:3]) if len(rest) == 3 else None),
                          "last_progress": round(max(times), 3) if times else None,
                          "last_output": None if line is None else round(line, 3),
                          **use.get(rank, {})}
        if seen and seen != self.progress:
            self.progress = seen
            self.write_state(RunState.RUNNING, unless_over=True)

    def _setup_barrier(self, sup: Supervisor) -> None:
        """The gang's barrier after ``setup:``: tell the head, wait for
        ``gang-go``; a stop (a failed setup, a signal, a lost link) ends it."""
        self.setup_done_here()
        while not (self.setup_go.wait(0.25) or sup.stop_requested or self.final):
            pass

    def _await_survivors(self, sup: Supervisor) -> None:
        """Wait up to ``SURVIVOR_WAIT_S`` for processes that would not die
        (uninterruptible sleep, a driver still releasing them); any left rule
        out a restart (``restarts.survivors_left``)."""
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

    def masked(self, value):
        """``value`` with every secret value masked in every string in it."""
        return files.mask_strings(value, self.secrets)

    def emit(self, said: dict) -> None:
        self._write(encode(self.masked(said)))

    def say(self, text: str) -> None:
        self._write(self.masked(text).encode("utf-8", "replace") + b"\n")

    def _write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
        except OSError:
            pass  # a broken stream must not stop a teardown; the state is in memory

    def finished_message(self, code: int, state: RunState) -> dict:
        """The stream's last line; one control line, however many attempts."""
        return message(Event.FINISHED, code=code, state=state, **self.fitted_attempts())

    def write_state(self, state: RunState, code: int | None = None,
                    unless_over: bool = False) -> None:
        """keeper.json; ``unless_over``: not once the run has ended here (a
        thread other than the main one must never write over the end)."""
        with self.state_lock:
            if unless_over and self.over.is_set():
                return
            payload = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
                       "node_rank": self.node_rank, "run_id": self.sup_spec.run_id,
                       "owner": self.spec.owner.to_json(), "state": state, "code": code,
                       "attempt": self.attempts_done(), "updated": time.time(),
                       **({"followed": True} if self.followed else {}),
                       **({"progress": self.progress} if self.progress else {}),
                       **self.fitted_attempts()}
            try:
                files.put_json(os.path.join(self.run_dir, layout.KEEPER_STATE),
                               self.masked(payload))
                self.unrecorded = ""
            except OSError as exc:  # a full disk: the record waits for room, the run goes on
                said = f"ddp-orch: cannot write {layout.KEEPER_STATE}: {exc.strerror or exc}"
                if said != self.unrecorded:  # once, not at every progress report
                    self.say(said)
                self.unrecorded = said


def _rank_gpus(sup: Supervisor, use: dict | None) -> dict[str, dict]:
    """Rank -> its GPU's index, utilisation and memory in ``use``."""
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
    """``Supervisor.progress``, each rank's age the younger of its heartbeat
    and its last output line: what the hang rule counts."""
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
