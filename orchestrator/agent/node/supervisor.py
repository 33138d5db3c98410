"""ddp-orch node supervisor: runs one node's torchrun and owns its teardown.

torchrun starts each worker in a session of its own, so killing torchrun's
process group leaves workers running (and holding GPUs). The supervisor
makes itself a child subreaper, so every process of the run stays its
descendant even when orphaned, and also finds the run's processes by marker
variables in their environment. It tears them all down (SIGTERM, a grace
period, SIGKILL) on ``stop``, on stdin EOF (the controller or its SSH link
is gone), on SIGTERM, SIGINT or SIGHUP, and when torchrun exits.

Its output is torchrun's and the workers' lines, each prefixed ``[rankN]: ``,
then one control line: the exit code, the reason and the root cause.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

from . import failures, gpus, guardian, probes, procs
from .. import layout

from ..wire import files
from ..wire.fields import is_time
from . import nodesetup, outputsteps, setupstamp
from ..wire.protocol import (PEER_TIMEOUT_S, Control, Ended, Event, LineBuffer, Reader,
                             controller_silent_for, encode, exit_event, message)
from .holdings import Holdings
from .spec import SupervisorSpec
from .workerlogs import WorkerLogs

TAIL_BYTES = 65536  # how much of torchrun's own output is kept for failure reports
# How often the worker log files are looked at: soon after output, then less
# often while the ranks stay quiet (torchrun's own tailer looks every 0.1 s).
# Every look is CPU taken from ranks that may share the node's cores.
FOLLOW_POLL_S = 0.02
FOLLOW_IDLE_S = 0.1
PROGRESS_READ = 64  # characters of a rank's step report read ("<step> <time> [<samples> ...]\n")
GPU_SAMPLE_TIMEOUT_S = 3.0  # one nvidia-smi query in a heartbeat; it delays the beat at most this
_RANK_LINE = re.compile(rb"^\[rank(\d+)\]:", re.MULTILINE)  # a worker's line (WorkerLogs)


def _pace(words: list[str]) -> list[float] | None:
    """``[compute_s, data_s]`` from a step file's last two words, checked as
    the controller checks them (``fields.is_time``); else None."""
    if len(words) != 2:
        return None
    try:
        times = [float(word) for word in words]
    except ValueError:
        return None
    if not all(is_time(t) for t in times):
        return None
    return [round(t, 6) for t in times]


def _output_steps(pattern: str | None) -> outputsteps.OutputSteps:
    """The file's ``progress:`` pattern; one that cannot serve here (a job
    file edited by hand) gives way to the defaults, with a note."""
    try:
        return outputsteps.OutputSteps(pattern)
    except ValueError as exc:
        sys.stdout.buffer.write(f"ddp-orch: progress pattern {pattern!r} ignored: {exc}\n"
                                .encode())
        sys.stdout.buffer.flush()
        return outputsteps.OutputSteps()


class Supervisor:
    def __init__(self, spec: SupervisorSpec | dict, stdin: Reader | None = None,
                 holdings: Holdings | None = None):
        """``spec`` as built or as JSON (checked: SpecError if it is not one);
        ``holdings``: the port and GPU locks held for this run, if any."""
        self.spec = spec = spec if isinstance(spec, SupervisorSpec) \
            else SupervisorSpec.from_dict(spec)
        self.stdin = stdin or Reader(0)  # what serve left of stdin, if it read ahead
        self.holdings = holdings or Holdings()
        self.run_dir = spec.run_dir
        # torchrun's --log-dir: each attempt of a kept run has its own (kept/keeper.py)
        self.log_dir = spec.log_dir or os.path.join(self.run_dir, layout.TORCHRUN_LOGS)
        self.last_exit: dict | None = None  # the exit event, once emitted
        # Called with torchrun's exit code as soon as it is reaped (a keeper
        # tells the gang at once; kept/keeper.py).
        self.on_torchrun_exit = lambda code: None
        self.marker = procs.run_marker(spec.run_id, spec.node_rank)
        self.grace_s = float(spec.grace_s)
        self.stop_reason = ""
        self.stop_cause = Ended.STOPPED  # why the stop was asked, once it is
        self.stop_requested = False
        self.stopped_at: float | None = None  # when a stop was asked for, if ever
        self.guardian = None  # guardian.start(): ends the run if we die first
        self.last_heard = time.monotonic()  # the controller's last line (a ping at least)
        self.controller_lost = False
        self.survivors: dict[int, str] = {}  # pid -> command line of what would not die
        self.hurry = threading.Event()  # skip the grace period: SIGKILL now
        self.out = sys.stdout.buffer
        self.out_lock = threading.Lock()
        self.torchrun_pid = -1
        self.tail = b""  # torchrun's last output, split into lines only on failure
        self.exited = threading.Event()
        self.exit_code: int | None = None
        self.wakeup = _Wakeup()  # torchrun exited or a stop was requested
        self.workers_done = threading.Event()  # follow the worker logs to their end
        # Masked in our own output too where it goes to a file (a Slurm job's
        # or a keeper's agent.out); over a channel the controller masks what
        # it receives. Output is masked as bytes; control lines string by
        # string before they are encoded, so they stay valid JSON.
        self.secrets = [v for v in spec.secrets if v] if not spec.owner.pings else []
        self.masks = [v.encode() for v in self.secrets]
        # ``setup:`` (nodesetup.py): once it has succeeded here, torchrun waits for
        # every node's (``setup_barrier``: the controller's ``go`` on stdin by
        # default; a keeper's gang or a Slurm job's files set their own).
        self.go = threading.Event()
        self.setup_barrier = None  # (supervisor) -> None; returns once all are ready or stopping
        self.setup_over = threading.Event()  # setup done everywhere (or none): torchrun may start
        self.workers_started = False  # torchrun has spawned workers (``started``)
        # rank -> wall time of its last output line, where a keeper counts lines
        # as progress (its hang rule, status); the attached controller counts them itself
        self.line_seen: dict[int, float] | None = None
        self.record_trouble = ""  # why supervisor.json could not be written, once said
        # each rank's step as its lines say it, for ranks that report none
        self.output_steps = _output_steps(spec.env.get(outputsteps.PATTERN_ENV))

    def run(self) -> int:
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chdir(self.run_dir)
        if self.spec.bundle:
            _extract(self.spec.bundle, self.run_dir)
        procs.become_subreaper()
        self.guardian = guardian.start(self.marker, self.grace_s, self.holdings.gpu_fds())
        guardian.arm(self.guardian, self.log_dir, list(self.spec.secrets),
                     os.path.join(self.run_dir, layout.GUARDIAN_RECORD))
        if not self.spec.owner.keepers_hold:  # a keeper (kept/keeper.py) handles them itself
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, lambda signum, _f: self.request_stop(
                    f"got {signal.Signals(signum).name}", Ended.SIGNAL))
        self.watcher = threading.Thread(target=self.watch_stdin, daemon=True)
        if self.spec.owner.pings:  # not under Slurm or a keeper: no controller there
            self.watcher.start()
        env = {k: v for k, v in os.environ.items() if k not in self.spec.unset_env}
        env.update(self.spec.env)
        started = time.time()
        # Heartbeats from the start: a quiet setup is not a silent partition.
        threading.Thread(target=self.send_heartbeats, daemon=True).start()
        if self.spec.setup and not self.prepare(env, started):
            return self.last_exit["code"]
        self.setup_over.set()
        # torchrun, and so every worker, starts in the node's code root
        # (``NodePlan.code_root``: the uploaded project, or the built-ins' code/)
        self.holdings.release_ports()  # node 0's master port, held since it was found free
        child = subprocess.Popen(list(self.spec.argv), env=env,
                                 cwd=self.spec.cwd or self.run_dir,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.torchrun_pid = child.pid
        threading.Thread(target=self.reap_torchrun, args=(child.pid,), daemon=True).start()
        self.write_state(child.pid, started, None)
        relay = threading.Thread(target=self.relay, args=(child.stdout,), daemon=True)
        relay.start()
        follower = threading.Thread(target=self.follow_workers, daemon=True)
        follower.start()
        code = self.wait(child.pid)
        if code is None:  # stop requested before torchrun finished
            code = self.teardown(child.pid)
            reason, ended = self.stop_reason, self.stop_cause
        else:
            reason, ended = "torchrun exited", Ended.ITSELF
            self.teardown(child.pid, grace_s=min(self.grace_s, 3.0))
        torn_down_at = time.time()  # nothing of the run is left here (but survivors)
        guardian.release(self.guardian)  # the run is torn down: nothing left to guard
        self.workers_done.set()  # every worker is gone: what is in the files is all
        follower.join(timeout=10.0)
        relay.join(timeout=2.0)
        # the ranks' last steps, which a run shorter than a heartbeat's period
        # (or ending between two) would otherwise never report
        self.emit(self.heartbeat())
        if self.spec.secrets:  # the logs are complete: mask what they hold
            files.scrub_tree(self.log_dir, list(self.spec.secrets))
        last = [line for line in self.tail_lines() if line.strip()][-5:] if code else []
        full = code and probes.disk_full(self.run_dir)
        if full:  # what a full disk breaks (torchrun's error files, the logs) says little
            last.append(f"ddp-orch: {full}")
        self.last_exit = exit_event(
            code, reason, ended, failures=failures.collect(
                self.run_dir, self.tail_lines(), self.log_dir,
                mask=lambda text: files.mask_strings(text, list(self.spec.secrets))),
            stopped_at=self.stopped_at, last_lines=last,
            survivors=[{"pid": p, "cmd": c} for p, c in self.survivors.items()],
            duration_s=round(time.time() - started, 3))
        self.write_state(child.pid, started, code, reason, torn_down_at)
        self.emit(self.last_exit)
        self.wakeup.close()  # a keeper runs one Supervisor per attempt: no fds left behind
        return code

    def prepare(self, env: dict, started: float) -> bool:
        """The run's ``setup:`` here, then the wait for every node's; False
        when torchrun must not start, after the exit event that says why."""
        setup = self.spec.setup
        commands = [list(argv) for argv in setup["commands"]]
        stamp = skip = None
        if setup.get("when_changed"):  # skipped while its inputs are as at the last success
            stamp = setupstamp.NodeStamp(self.run_dir, setup["cwd"], commands,
                                         setup["when_changed"], dict(self.spec.env))
            skip, line = stamp.check()
            self.write_out(f"ddp-orch: {line}\n".encode())
        if setup.get("path_first"):  # the run's python first: its pip, as if activated
            env = {**env, "PATH": f"{setup['path_first']}:{env.get('PATH', os.defpath)}"}
        done = {"ok": True} if skip else nodesetup.run_setup(
            commands, setup["cwd"], env,
            float(setup["timeout_s"]), self.write_out, self.controller_silent)
        self.emit(message(Event.SETUP, ok=done["ok"]))
        if done["ok"]:
            (self.setup_barrier or _await_go)(self)
            if not self.stop_requested:
                # Stamped once every node's setup succeeded: two nodes on one
                # host share a stamp, and one's success must not stand for
                # the other's failure.
                trouble = stamp.done() if stamp is not None and not skip else ""
                if trouble:
                    self.write_out(f"ddp-orch: {trouble}; the next run sets up again\n".encode())
                return True
        code = 128 + signal.SIGTERM if self.stop_requested else int(done.get("code") or 1)
        failed = not done["ok"] and not done.get("stopped")
        last = [str(line) for line in done.get("last_lines", ())][-3:]
        self.last_exit = exit_event(
            code, "setup failed" if failed else self.stop_reason or "stopped during setup",
            Ended.SETUP_FAILED if failed else self.stop_cause,
            stopped_at=self.stopped_at,
            last_lines=last + [f"ddp-orch: {done['message']}"] if failed else [],
            duration_s=round(time.time() - started, 3), setup_failed=failed)
        self.exit_code = code  # no torchrun ran: nothing for the teardown to wait for
        self.exited.set()
        self.teardown(-1, grace_s=min(self.grace_s, 3.0))  # whatever setup left behind
        torn_down_at = time.time()
        guardian.release(self.guardian)
        self.write_state(-1, started, code, self.last_exit["reason"], torn_down_at)
        self.emit(self.last_exit)
        self.wakeup.close()
        return False

    def controller_silent(self) -> bool:
        """Whether the run must stop: asked for, or the controller silent for
        the peer timeout (a frozen link sends no FIN, only misses pings).
        Asked in every phase, so a partition ends it within one bound."""
        if self.spec.owner.pings and not self.stop_requested and \
                time.monotonic() - self.last_heard > PEER_TIMEOUT_S:
            self.controller_lost = True
            self.request_stop(controller_silent_for(PEER_TIMEOUT_S), Ended.CONTROLLER_LOST)
        return self.stop_requested

    def request_stop(self, reason: str, cause: Ended = Ended.STOPPED) -> None:
        """Stop the run for ``reason`` (words) and ``cause``; the first asked stands."""
        if not self.stop_requested:
            self.stopped_at = time.time()
            self.stop_reason, self.stop_cause = reason, cause
            self.stop_requested = True
            self.wakeup.set()

    def watch_stdin(self) -> None:
        """``stop`` and EOF: graceful teardown; ``kill``: no grace; ``done``:
        the channel goes back to ``serve``. Raw reads on fd 0: a daemon thread
        blocked in a buffered read aborts the interpreter at exit."""
        while True:
            try:
                line = self.stdin.readline().strip()
            except (OSError, ValueError):
                line = b""
            self.last_heard = time.monotonic()
            if not line and self.stdin.eof:
                self.request_stop("lost the controller (stdin closed)", Ended.CONTROLLER_LOST)
                return
            word = Control.parse(line)
            if word is Control.DONE:
                return
            if word is Control.GO:  # every node's setup is done (``_await_go``)
                self.go.set()
                self.wakeup.set()
            elif word is Control.STOP:  # who stopped the run, as the controller says
                self.request_stop(Control.reason(line) or "stopped by the controller")
            elif word is Control.KILL:
                self.request_stop("killed by the controller")
                self.hurry.set()
                return

    def relay(self, stream) -> None:
        """Copy torchrun's output to ours, whole lines at a time, so that a
        control line from ``emit`` always starts a line of its own."""
        lines = LineBuffer(max_line=TAIL_BYTES)
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.relay_block(lines.feed(chunk))
        rest = lines.flush()
        self.relay_block(rest + b"\n" if rest else b"")

    def relay_block(self, block: bytes) -> None:
        self.write_out(block)
        self.tail = (self.tail + block)[-TAIL_BYTES:]

    def follow_workers(self) -> None:
        """Relay the workers' log files until every worker is gone."""
        logs = WorkerLogs(self.log_dir, self.spec.run_id, self.spec.first_rank, self.spec.nproc)
        pause = FOLLOW_POLL_S
        while not self.workers_done.is_set():
            data = logs.read()
            if data:
                pause = FOLLOW_POLL_S
                now = time.time()
                if self.line_seen is not None:
                    for rank in set(_RANK_LINE.findall(data)):
                        self.line_seen[int(rank)] = now
                self.output_steps.feed(data, now)
                self.write_out(data)
            else:
                self.workers_done.wait(pause)
                pause = min(pause * 2, FOLLOW_IDLE_S)
        self.write_out(logs.read(final=True))

    def write_out(self, data: bytes, control: bool = False) -> None:
        """Whole lines only (one writer at a time), so control lines stay whole.
        Dropped once the controller is gone or silent; short of that every
        write waits its turn, as a dropped control line could lose an exit."""
        if data and self.masks and not control:
            data = files.mask(data, self.masks)
        if data and control and self.controller_lost:
            # A controller that was only paused (a laptop lid, Ctrl-Z) reads
            # its pipe on waking: a control line is offered to it, for a moment.
            offer = threading.Thread(target=self._write_whole, args=(data,), daemon=True)
            offer.start()
            offer.join(1.0)
            return
        if data and not self.controller_lost:
            # A write blocks while a partitioned controller's pipe is full:
            # once it is given up on, nothing waits on that pipe any more.
            while not self.out_lock.acquire(timeout=1.0):
                if self.controller_lost:
                    return
            try:
                self._write_held(data)
            finally:
                self.out_lock.release()

    def _write_whole(self, data: bytes) -> None:
        with self.out_lock:
            self._write_held(data)

    def _write_held(self, data: bytes) -> None:
        """``data`` out, the output lock held."""
        try:
            self.out.write(data)
            self.out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: stdout closed
            pass

    def tail_lines(self) -> list[str]:
        """torchrun's last (up to 200) whole lines: once the tail was cut,
        its first line is a fragment (maybe of a secret, unmaskable): gone."""
        lines = self.tail.decode("utf-8", "replace").splitlines()
        if len(self.tail) >= TAIL_BYTES:
            lines = lines[1:]
        return lines[-200:]

    def emit(self, payload: dict) -> None:
        self.write_out(encode(files.mask_strings(payload, self.secrets)), control=True)

    def reap_torchrun(self, pid: int) -> None:
        """Block until torchrun exits: the run's end is seen at once, no polling."""
        self.exit_code = procs.reap(pid, block=True)
        self.exited.set()
        self.wakeup.set()
        if not self.stop_requested:
            try:
                self.on_torchrun_exit(self.exit_code)
            except Exception:  # noqa: BLE001 (a gang notice must not break the teardown)
                pass

    def wait(self, pid: int) -> int | None:
        """torchrun's exit code, or None once a stop is requested. On the way
        it reports ``joined`` (torchrun connected to the master port) and
        ``started`` (workers spawned: with static rendezvous, after every
        node joined), for the controller's start timeout."""
        milestones = ["joined", "started"]
        while True:
            if self.exited.is_set():
                return self.exit_code
            if self.stop_requested:
                return None
            if milestones:
                self.check_milestones(pid, milestones)
            if self.controller_silent():
                continue
            self.wakeup.wait(0.25 if milestones else 1.0)

    def send_heartbeats(self) -> None:
        """A heartbeat every ``heartbeat_s`` while torchrun runs, so the
        controller can tell a quiet run from a silent partition; with the
        GPUs' use (until nvidia-smi first fails) and this node's clock, which
        dates the ranks' progress when a job's stream is read later."""
        every = self.spec.heartbeat_s
        watched = visible_gpus(self.spec.env)
        while every and not self.exited.wait(every):
            event = self.heartbeat()
            use = gpus.sample(watched, min(every, GPU_SAMPLE_TIMEOUT_S)) if watched else None
            if use:
                event["gpus"] = use
            elif watched:
                watched = []  # no nvidia-smi, or it failed: not asked again
            self.emit(event)

    def heartbeat(self) -> dict:
        """A heartbeat event: the ranks' progress, dated by this node's clock."""
        return message(Event.HEARTBEAT, progress=self.progress(), now=round(time.time(), 3))

    def progress(self) -> dict:
        """{rank: [step, age_s]} from the ranks' step files, else their output
        lines (``outputsteps``), with samples and pace where the file says them."""
        directory = os.path.join(self.run_dir, layout.PROGRESS_DIR)
        now = time.time()
        out = self.output_steps.progress(now)  # a rank's own step report wins (below)
        try:
            names = os.listdir(directory)
        except OSError:
            return out
        for name in names:
            if not name.startswith("rank-") or not name[5:].isdigit():
                continue
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as fh:
                    text = fh.read(PROGRESS_READ)
                step, stamp, *rest = text.split()
                if len(rest) not in (0, 1, 3):
                    continue  # no step report: ignored, as any bad line
                seen = [int(step), round(max(0.0, now - float(stamp)), 3)]
            except (OSError, ValueError):
                continue
            whole = text.endswith("\n") or len(text) < PROGRESS_READ
            samples = int(rest[0]) if whole and rest and rest[0].isascii() \
                and rest[0].isdigit() else None
            pace = _pace(rest[1:]) if whole else None
            if pace is not None:
                seen += [samples, *pace]
            elif samples is not None:
                seen.append(samples)
            out[name[5:]] = seen
        return out

    def check_milestones(self, pid: int, milestones: list[str]) -> None:
        port = self.spec.master_port
        if milestones[0] == "joined" and port and procs.connected_to(pid, int(port)):
            milestones.pop(0)
            self.emit(message(Event.JOINED))
        if milestones and milestones[0] == "started":
            workers = procs.children_of(pid)
            if workers:
                milestones.pop(0)
                self.workers_started = True
                self.emit(message(Event.STARTED, workers=len(workers)))

    def teardown(self, pid: int, grace_s: float | None = None) -> int:
        """SIGTERM every process of the run, wait, SIGKILL the rest; torchrun's code."""
        me = os.getpid()
        _, survivors = procs.terminate(
            self.processes, self.grace_s if grace_s is None else grace_s, hurry=self.hurry,
            still_ours=lambda p: procs.has_marker(p, self.marker) or procs.descends_from(p, me))
        self.survivors.update(on_gpus(survivors) if survivors and visible_gpus(self.spec.env)
                              else survivors)
        self.exited.wait(30.0)  # SIGKILL was sent: torchrun is gone or going
        return self.exit_code if self.exit_code is not None else 128 + signal.SIGKILL

    def processes(self) -> set[int]:
        """Live processes of this run on this node: descendants and marked ones."""
        me = os.getpid()
        children: dict[int, list[int]] = {}
        for pid, ppid, state in procs.proc_table():
            if state == "Z":
                if ppid == me and pid != self.torchrun_pid:
                    procs.reap(pid)  # an orphan that re-parented to us (subreaper)
                continue
            children.setdefault(ppid, []).append(pid)
        found, stack = set(), [me]
        if self.guardian is not None:  # it outlives us on purpose; released, it leaves
            children[me] = [p for p in children.get(me, []) if p != self.guardian.pid]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return found | procs.marked_processes(self.marker)

    def write_state(self, child_pid: int, started: float, code: int | None,
                    reason: str = "", torn_down_at: float | None = None) -> None:
        """``supervisor.json``; once the run is over here, also its teardown
        record (wall clock: ``stopped_at``, why, ``torn_down_at``) and the
        exit event: with no controller to hear it (a detached Slurm job),
        ``status`` reads the node's end from here."""
        state = {"supervisor_pid": os.getpid(), "torchrun_pid": child_pid,
                 "started": started, "exit_code": code, "run_id": self.spec.run_id,
                 "node_rank": self.spec.node_rank}
        if torn_down_at is not None:
            state.update(stopped_at=self.stopped_at, reason=files.mask_strings(
                reason, list(self.spec.secrets)), torn_down_at=torn_down_at)
            if self.last_exit is not None:  # a file: its last lines and commands masked too
                state["exit"] = files.mask_strings(self.last_exit, list(self.spec.secrets))
        try:
            files.put_json(os.path.join(self.run_dir, layout.SUPERVISOR_STATE), state)
        except OSError as exc:  # a full disk: the record is lost, never the run or its end
            if not self.record_trouble:
                self.record_trouble = exc.strerror or str(exc)
                self.write_out(f"ddp-orch: cannot write {layout.SUPERVISOR_STATE}: "
                               f"{self.record_trouble}\n".encode())


def _await_go(sup: "Supervisor") -> None:
    """The controller's barrier: ``go`` once every node's setup is done, or a stop."""
    if not sup.spec.owner.pings:
        return
    while not (sup.go.is_set() or sup.controller_silent()):
        sup.wakeup.wait(0.5)


class _Wakeup:
    """Wakes the main thread, also from signal handlers: a pipe, as setting a
    ``threading.Event`` in a handler that interrupted its lock deadlocks."""

    def __init__(self):
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()  # set() against close(): never a write to a reused fd
        self._closed = False

    def set(self) -> None:
        # Never blocks (a signal handler may interrupt a set() or a close() on
        # its own thread): when the lock is taken, another wake-up is being
        # written or the pipe is closing; ``wait`` polls anyway (1 s at most).
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self._closed:
                os.write(self._write, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already
        finally:
            self._lock.release()

    def close(self) -> None:
        """Once the run is over; later ``set()`` calls do nothing."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)

    def wait(self, timeout: float | None) -> None:
        select.select([self._read], [], [], timeout)
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass


def _extract(bundle: str, run_dir: str) -> None:
    import tarfile  # only here: it is a good part of the supervisor's start time

    with tarfile.open(os.path.join(run_dir, bundle)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(run_dir, filter="data")
        else:  # Python < 3.11.4: the bundle is ours, made by the controller
            tar.extractall(run_dir)



def visible_gpus(env: dict) -> list[int]:
    """The GPU indices the node's ranks see (its ``CUDA_VISIBLE_DEVICES``);
    none for CPU processes, a scheduler's or a UUID list."""
    words = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return [int(w) for w in words] if all(w.isdigit() for w in words) and words != [""] else []


def on_gpus(survivors: dict[int, str]) -> dict[int, str]:
    """``survivors`` (pid -> command line), those still holding GPU memory
    said so: one stuck in the driver keeps its GPU busy for the next run."""
    found = gpus.facts(GPU_SAMPLE_TIMEOUT_S)
    held: dict[int, list[str]] = {}
    for app in found.get("apps") or () if found.get("ok") else ():
        if app["pid"] in survivors:
            used = "" if app.get("used_mib") is None else f"{app['used_mib']} MiB on "
            held.setdefault(app["pid"], []).append(f"{used}GPU {app['gpu_uuid']}")
    return {pid: cmd + (f" (still holds {', '.join(held[pid])})" if pid in held else "")
            for pid, cmd in survivors.items()}
