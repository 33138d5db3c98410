"""The scheduler base: a run as one job of a batch scheduler, over a shared directory.

The scheduler places, starts, signals and accounts for the nodes; we never
imitate it. The controller writes the agent, the bundle, ``job.json`` and
``job.id`` into the run directory, which the compute nodes must share, and
reads each node's ``node-K/agent.out`` as it grows, so the gang and its
summary are the same as over SSH.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import signal
import threading
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar, Mapping

from ...agent import layout
from ...agent.node.stream import offset_of_last_lines
from ...agent.layout import RENDEZVOUS as RENDEZVOUS_FILE, STREAM as STREAM_FILE
from ...agent.node import outputs
from ...agent.node.jobfile import JobNode, JobSpec, Placement, secret_variable
from ...agent.node.procs import own_marker
from ...agent.wire import bootstrap, files
from ...config.spec import AUTO_PORT
from ...console import Console
from ...engine.bundle import build_bundle, code_notes, stand_ins
from ...engine.nodespec import BUNDLE_NAME, supervisor_spec
from ...engine.nodestate import NodeFacts, NodePlace, node_outcome
from ...engine.results import fetch_outputs, store_fetched, wanted_files
from ...engine.run import RunHandle, node_records
from ...errors import LaunchError
from ...plan.build import build_plan, resolve_plan
from ...plan.dryrun import ByHand, DryRun, NodeLaunch
from ...plan.model import NodePlan, RunPlan
from ...plan.secrets import is_secret
from ...plan.torchrun import torchrun_argv
from ...records.outcome import (EndReason, NodeOutcome, NodeState, RunDescription, RunOutcome,
                               RunState, gang_outcome, is_cascade)
from ...records.rundir import RunDir
from ...records.store import NodeRecord, RunRecord, controller_alive
from ..base import CancelResult, LaunchBackend, recorded_dryrun
from .job import Job, JobState, JobStream, stream_progress

if TYPE_CHECKING:
    from ...engine.stacks import StacksResult

AGENT_FILE = "agent.pyz"
JOB_FILE = "job.json"
JOB_ID_FILE = "job.id"  # the scheduler's id of the job, written as soon as it is known
STATE_GIVE_UP_S = 120.0  # asking for the job's state failing that long while queued: give up


class interrupts_held:
    """Ctrl-C and SIGTERM wait until the block is over (main thread only);
    ``raise_if_interrupted`` then raises."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "interrupts_held":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, lambda s, _: self.caught.append(s))
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def raise_if_interrupted(self) -> None:
        if self.caught:
            raise KeyboardInterrupt


def job_dir(plan: RunPlan) -> str:
    """The job's shared directory: the local run directory, holding every node's."""
    return posixpath.dirname(plan.nodes[0].run_dir)


def agent_argv(plan: RunPlan) -> list[str]:
    """What each task runs: the agent zipapp on the job file, which tells it its node."""
    directory = job_dir(plan)
    return [plan.nodes[0].python, "-I", "-S", f"{directory}/{AGENT_FILE}", "job",
            f"{directory}/{JOB_FILE}"]


class SchedulerBackend(LaunchBackend):
    """A backend whose runs are one job of a scheduler. A subclass fills in
    the abstract methods; ``placement.scheduler`` is its name in messages."""

    # Where a node's agent finds its place in the job (``jobnode.node_rank_here``,
    # ``check_gpus``): the variables the scheduler sets for each task, and the
    # words its messages use; written into job.json, so the agent names no scheduler.
    placement: ClassVar[Placement]
    # The key of the job id in each node's record (``NodeRecord.connection``).
    job_key: ClassVar[str] = "job"
    # How the scheduler stops the other nodes when one fails, in words ("":
    # it does not; the controller's gang rule does, while it runs).
    stops_the_rest: ClassVar[str] = ""

    # -- what a scheduler fills in --------------------------------------------

    @abstractmethod
    def submit_job(self, plan: RunPlan, run: RunDir, env: dict[str, str]) -> str:
        """Submit the job in ``run``: one task per node, each running
        ``agent_argv(plan)`` with ``env`` (it carries the secrets and the
        run's marker) and the placement variables set. Returns the job id."""

    @abstractmethod
    def job_state(self, job_id: str) -> JobState | None:
        """The job as the scheduler lists it now; None once it no longer does.
        A failure to ask is an ``OrchestratorError``."""

    @abstractmethod
    def cancel_job(self, job_id: str, signal: str | None = None) -> None:
        """End the job: SIGTERM to every task, then the scheduler's grace;
        ``signal`` ("KILL") at once."""

    def job_extras(self, plan: RunPlan) -> Mapping[str, str]:
        """What the dry-run shows of the submission beside the nodes (a batch script)."""
        return {}

    def by_hand(self, plan: RunPlan) -> ByHand:
        """The shell dry-run's lines for starting the job's nodes by hand."""
        return ByHand()

    def job_output(self, job_id: str, run: RunDir) -> str:
        """The scheduler's own output file of the job, if it keeps one ("": none)."""
        return ""

    def accounted(self, job_id: str) -> str:
        """How a job the queue no longer lists ended, in the scheduler's words ("": unknown)."""
        return ""

    def job_stacks(self, job_id: str, nodes, run_id: str, native: bool = False) -> StacksResult:
        """Every rank's stack now, dumped by each node's agent (``stacks``)."""
        raise LaunchError(f"the {self.name} backend cannot dump a running job's stacks")

    def placed_note(self, plan: RunPlan) -> str:
        """The dry-run's note for nodes the scheduler chooses."""
        return f"hosts      chosen by {self.placement.scheduler} when the job starts"

    # -- the plan and its dry-run (pure) -------------------------------------

    def plan(self, run_id: str, local_run_dir: str) -> RunPlan:
        spec = self.require_spec()
        return build_plan(spec, run_id=run_id, local_run_dir=local_run_dir,
                          master_addr=spec.master_addr or self.placement.addr_slot,
                          shared_run_dir=True)

    def where(self, node: NodePlan) -> str:
        name = self.placement.scheduler
        if self.require_spec().placed and node.host.startswith("<"):
            return f"{name} task on the allocation's node {node.node_rank}"
        return f"{name} task on node {node.host}"

    def dryrun(self, plan: RunPlan) -> DryRun:
        # Until the job runs, the master is two placeholder words that node 0's
        # agent fills in (``agent/node/jobnode.py``); the rest is the real argv.
        shown = plan if plan.master_port != AUTO_PORT else \
            dataclasses.replace(plan, master_port=self.placement.port_slot)
        nodes = tuple(NodeLaunch(node=n, where=self.where(n), env=n.env, unset_env=n.unset_env,
                                 argv=torchrun_argv(shown, n), setup=plan.setup,
                                 setup_timeout_s=plan.setup_timeout_s,
                                 setup_when_changed=plan.setup_when_changed)
                      for n in plan.nodes)
        notes = list(code_notes(plan, self.spec.source if self.spec else ""))
        if self.require_spec().placed:
            notes.append(self.placed_note(plan))
        owner, words = self.owner()
        return DryRun(backend=self.name, plan=plan, nodes=nodes, notes=tuple(notes),
                      source=self.spec.source if self.spec else "",
                      extras=dict(self.job_extras(plan)), owner=owner, owner_words=words,
                      by_hand=self.by_hand(plan))

    # -- submit and reconnect ----------------------------------------------------

    def submit(self, info: DryRun, run: RunDir, console: Console) -> "JobRun":
        """Write the job's files and submit it; nothing is submitted when the
        job cannot run as planned. The id is on record before Ctrl-C acts,
        so no job is queued that ``down`` cannot find."""
        plan = info.plan
        started = time.monotonic()
        problems = [r for r in self.check(plan).results if not r.ok]
        if problems:
            raise LaunchError("the job cannot run as planned; nothing was submitted:\n"
                              + "\n".join(f"  {r.host}: {r.check}: {r.detail}" for r in problems))
        env = self.write_job(info, run)
        # Ctrl-C or SIGTERM while the scheduler takes the job would leave it
        # queued with no id on record: they wait until the id is written
        # and a handle that cancels the job holds it.
        with interrupts_held() as held:
            job_id = self.submit_job(plan, run, env)
            run.write_text(JOB_ID_FILE, job_id + "\n")
            handle = JobRun(self, info, run, Job(job_id, self, poll=False), started)
        try:  # from here on, whatever happens, nothing of the job stays queued (close)
            held.raise_if_interrupted()
            console.info(f"submitted {self.placement.scheduler} job {job_id}; "
                         f"run directory {run.path}")
        except BaseException:
            handle.close()
            raise
        return handle

    def reconnect(self, record: RunRecord, *, lines: int | None = None) -> "JobRun":
        """Follow a detached job's node streams until it ends; Ctrl-C leaves
        it to the scheduler."""
        job_id = self.job_of(record)
        if job_id is None:
            raise LaunchError(f"run {record.run_id} has no {self.placement.scheduler} job "
                              f"on record")
        handle = JobRun(self, recorded_dryrun(record), record.run, Job(job_id, self),
                        time.monotonic(), watching=True, records=record.nodes)
        if lines is not None:
            for stream in handle.streams.values():
                stream.offset = _offset_of_last_lines(stream.path, lines)
        return handle

    def job_of(self, record: RunRecord) -> str | None:
        """The run's job id: from its nodes' records, else ``JOB_ID_FILE``
        (the controller ended before it recorded them)."""
        for node in record.nodes:
            job_id = node.connection.get(self.job_key)
            if job_id:
                return str(job_id)
        written = (read_capped(record.run.file(JOB_ID_FILE), 64) or b"").decode("ascii",
                                                                               "replace")
        return written.strip() if written.strip().isalnum() else None

    def await_running(self, job: Job, console: Console) -> str:
        """Wait while the job is queued; "" once it runs or ended, else why it never ran."""
        name = self.placement.scheduler
        shown = None
        limit = self.options.queue_timeout_s
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            state = job.state
            if job.ended or (state is not None and state.running):
                return ""
            if job.failing_for > STATE_GIVE_UP_S:
                raise LaunchError(f"cannot follow {name} job {job.job_id} for "
                                  f"{job.failing_for:.0f}s: {job.error}")
            if state is not None and (state.state, state.reason) != shown:
                shown = (state.state, state.reason)
                console.info(f"{name} job {job.job_id} {state.state.lower()}"
                             + (f" ({state.reason})" if state.reason else ""))
            if deadline is not None and time.monotonic() > deadline:
                reason = f" ({state.reason})" if state and state.reason else ""
                console.info(f"{name} job {job.job_id} still queued after {limit:g}s{reason}; "
                             "cancelling it")
                job.cancel()
                job.wait_ended(30)
                return (f"the {name} job was still queued after the queue timeout of "
                        f"{limit:g}s{reason}; it was cancelled and never ran")
            time.sleep(0.2)

    def resolve(self, info: DryRun, job: Job) -> DryRun | None:
        """The dry-run with the allocation's hosts and node 0's rendezvous, once
        node 0's agent has published it; None if the job ended first."""
        plan = info.plan
        hosts: dict[int, str] = {}
        if self.require_spec().placed:
            state = job.state or job.refresh()
            placed = state.hosts if state is not None else ()  # Slurm's asks scontrol: once
            if not placed:
                return None
            hosts = dict(enumerate(placed))
        path = posixpath.join(job_dir(plan), RENDEZVOUS_FILE)
        deadline = time.monotonic() + self.options.start_timeout_s
        while True:
            try:
                with open(path, encoding="utf-8") as fh:
                    where = json.load(fh)
                break
            except (FileNotFoundError, ValueError):
                if job.ended or time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        port, addr = int(where["port"]), str(where["addr"])
        placeholder = plan.master_addr == self.placement.addr_slot
        return self.dryrun(resolve_plan(plan, master_port=port, homes={}, hosts=hosts,
                                        master_addr=addr if placeholder else None))

    def ended_early(self, plan: RunPlan, run: RunDir, job: Job, started: float) -> RunOutcome:
        """The job ended, or never got node 0 going, before any rendezvous."""
        name = self.placement.scheduler
        if not job.ended:
            job.cancel()
            job.wait_ended(self.options.grace_s + 30)
        state = job.state.state if job.state else "gone"
        wrote = [n.node_rank for n in plan.nodes
                 if os.path.exists(posixpath.join(n.run_dir, STREAM_FILE))]
        output = self.job_output(job.job_id, run)
        if not wrote and job.state is not None and job.state.cancelled:
            why = f"the {name} job was cancelled before its nodes started"
        elif not wrote:
            why = (f"the {name} job ended ({state}) before any node wrote to {job_dir(plan)}: "
                   "the compute nodes must see the run directory (a shared file system), "
                   "and the node's python must run the agent")
        else:
            why = f"the {name} job ended ({state}) before node 0 published the rendezvous"
        if output:
            why += f"; the job's output: {output}"
        for node in plan.nodes:
            _copy_stream(node, run)
        return _not_run(plan, why, started)

    def explain(self, outcome: NodeOutcome, nodes: tuple[NodeOutcome, ...],
                job: Job) -> NodeOutcome:
        """The scheduler's words for a node that ended without a report. A
        cascade (``SystemExit: 143``) is no failed other node: this node's
        loss may have set it off."""
        if outcome.state is not NodeState.LOST or outcome.failures:
            return outcome
        place = NodePlace(outcome.node_rank, outcome.host)
        failed = [o for o in nodes if o.state is NodeState.FAILED and not is_cascade(o)]
        if failed and self.stops_the_rest:
            words = (f"ended by {self.placement.scheduler} when node {failed[0].node_rank} "
                     f"failed ({self.stops_the_rest})")
            why = EndReason.SCHEDULER_STOPPED
        else:
            state = job.state.state if job.state else "no longer listed"
            words = (f"the {self.placement.scheduler} job ended ({state}) without a report "
                     f"from this node's agent (killed, or the node failed)")
            why = EndReason.SCHEDULER_ENDED
        return node_outcome(place, NodeFacts(code=outcome.exit_code, ended_at=outcome.ended_at,
                                             found=why, words=words))

    def write_job(self, info: DryRun, run: RunDir) -> dict[str, str]:
        """Write agent.pyz, the bundle and job.json (secrets left out); returns
        the submission's env: the secrets and the run's marker."""
        plan = info.plan
        bootstrap.zipapp(run.file(AGENT_FILE))
        build_bundle(run.file(BUNDLE_NAME), plan.code, stand_ins(self.spec))
        env = {**os.environ, **own_marker(plan.run_id)}
        nodes = []
        for launch in info.nodes:
            spec = supervisor_spec(launch, plan.run_id, 0, self.options.grace_s, info.owner)
            hidden = sorted(name for name, value in spec.env.items() if is_secret(name, value))
            for name in hidden:
                env[secret_variable(launch.node_rank, name)] = spec.env[name]
            spec = dataclasses.replace(
                spec, env={k: v for k, v in spec.env.items() if k not in hidden}, secrets=(),
                bundle=run.file(BUNDLE_NAME))
            nodes.append(JobNode(launch.host, spec, tuple(hidden)))
        placeholder = plan.master_addr == self.placement.addr_slot
        job = JobSpec(plan.run_id, job_dir(plan), self.require_spec().placed, self.placement,
                      None if placeholder else plan.master_addr,
                      None if plan.master_port == AUTO_PORT else int(plan.master_port),
                      self.options.start_timeout_s, tuple(nodes))
        run.write_json(JOB_FILE, job.to_dict())
        return env

    def collect(self, info: DryRun, outcome: RunOutcome, run: RunDir) -> dict | None:
        """Bring home ``results.wanted_files`` from the shared directory:
        nothing over its cap, nothing whose real path leaves the node's."""
        for k, wanted in wanted_files(info, outcome).items():
            root = os.path.realpath(info.plan.nodes[k].run_dir)
            for file in wanted:
                if not os.path.realpath(file.remote).startswith(root + os.sep):
                    continue
                try:
                    data = files.get(file.remote, file.limit)
                except files.TransferError as exc:
                    run.note(k, str(exc))
                    continue
                if data is not None:
                    store_fetched(run, info, k, file, data)
        root = info.plan.nodes[0].code_root  # the shared directory: read here, checked the same

        def get(path: str, limit: int) -> bytes | None:
            if not outputs.inside(root, path):
                raise OSError(f"{path}: not fetched: it leads out of {root} (a symbolic link?)")
            try:
                return files.get(path, limit)
            except files.TransferError as exc:
                raise OSError(str(exc)) from None

        fetch_outputs(info, run, lambda **request: outputs.collect(**request), get)
        result = run.result()
        return result if isinstance(result, dict) else None

    # -- down, status, stacks ------------------------------------------------------

    def cancel(self, record: RunRecord) -> list[CancelResult]:
        name = self.placement.scheduler
        job_id = self.job_of(record)
        if job_id is None:
            return [CancelResult(n.node_rank, n.host, (), f"no {name} job on record (never "
                                 "submitted)") for n in record.nodes]
        job = Job(job_id, self)
        try:
            job.cancel()
            ended = job.wait_ended(self.options.grace_s + 60)
        finally:
            job.close()
        error = "" if ended else f"{name} job {job_id} is still listed after its cancel"
        return [CancelResult(n.node_rank, n.host, (), error) for n in record.nodes]

    def stacks(self, record: RunRecord, native: bool = False) -> StacksResult:
        job_id = self.job_of(record)
        if job_id is None:
            raise LaunchError(f"run {record.run_id} has no {self.placement.scheduler} job "
                              f"on record")
        return self.job_stacks(job_id, record.nodes, record.run_id, native)

    def describe(self, record: RunRecord) -> RunDescription:
        name = self.placement.scheduler
        job_id = self.job_of(record)
        if job_id is None:  # its controller never saw the job run
            gone = record.state.live and not controller_alive(record)
            return RunDescription(RunState.INTERRUPTED if gone else record.state,
                                  record.outcomes, record.root_cause,
                                  f"no {name} job on record" if gone else "")
        state = self.job_state(job_id)
        if state is not None and not state.ended:
            where = f" on {state.nodelist}" if state.running and state.nodelist else ""
            reason = f" ({state.reason})" if state.reason else ""
            live = (RunState.PENDING if state.queued else RunState.RUNNING) \
                if record.state.live else record.state
            # no controller keeps progress.json: each rank's step from its node's stream
            progress = stream_progress(record) if state.running and (
                record.owner.detached or not controller_alive(record)) else ()
            return RunDescription(live, record.outcomes, record.root_cause,
                                  f"{name} job {job_id}: {state.state}{reason}{where}",
                                  progress=progress)
        accounted = "" if state is not None else self.accounted(job_id)
        if state is not None:
            detail = f"{name} job {job_id}: {state.state}"
        elif accounted:
            detail = f"{name} job {job_id}: {accounted}"
        else:
            detail = f"{name} job {job_id}: no longer listed by {name}"
        if record.state.live:  # the controller is gone: the agents' records say how it ended
            return _from_agents(record, detail)
        return RunDescription(record.state, record.outcomes, record.root_cause, detail)


class JobRun(RunHandle):
    """A scheduler's job, its node streams the gang's channels; ``running``
    waits in the queue, then for node 0's rendezvous."""

    def __init__(self, backend: SchedulerBackend, info: DryRun, run: RunDir, job: Job,
                 started: float, *, watching: bool = False,
                 records: tuple[NodeRecord, ...] = ()):
        super().__init__(info, run, watching=watching, records=records or node_records(
            info, {backend.job_key: job.job_id}), dump_stacks=lambda: backend.job_stacks(
                job.job_id, self.records, info.plan.run_id))
        self.backend = backend
        self.job = job
        self.started = started  # the outcome's wall time counts from here
        self.pending = not watching
        self.streams: dict[int, JobStream] = {} if self.pending else self._streams(info)
        self.channels = self.streams

    def _streams(self, info: DryRun) -> dict[int, JobStream]:
        return {n.node_rank: JobStream(posixpath.join(n.run_dir, STREAM_FILE), self.job, n.host)
                for n in info.plan.nodes}

    def running(self, console: Console) -> RunOutcome | None:
        if not self.pending:
            return None
        backend, job, plan, started = self.backend, self.job, self.dryrun.plan, self.started
        job.start_polling()
        try:
            waited = backend.await_running(job, console)
        except KeyboardInterrupt:
            console.always(f"ddp-orch: interrupted; cancelling {backend.placement.scheduler} "
                           f"job {job.job_id}")
            job.cancel()
            return _not_run(plan, "cancelled while queued (Ctrl-C)", started, interrupted=True)
        if waited:
            return _not_run(plan, waited, started)
        self.streams = self._streams(self.dryrun)
        self.channels = self.streams
        try:
            resolved = backend.resolve(self.dryrun, job)
        except KeyboardInterrupt:
            job.cancel()
            return _not_run(plan, "cancelled while starting (Ctrl-C)", started, interrupted=True)
        if resolved is None:
            return backend.ended_early(plan, self.run, job, started)
        self.dryrun = resolved
        self.records = node_records(resolved, {backend.job_key: job.job_id})
        self.pending = False
        return None

    def settle(self, outcome: RunOutcome) -> RunOutcome:
        """Wait for the job to leave the queue; explain each node's end."""
        job, plan = self.job, self.dryrun.plan
        if not job.wait_ended(self.backend.options.grace_s + 30):
            job.cancel()
            job.wait_ended(30)
        for stream in self.streams.values():
            stream.close()
        nodes = tuple(self.backend.explain(o, outcome.nodes, job) for o in outcome.nodes)
        return gang_outcome(plan.run_id, nodes, time.monotonic() - self.started,
                            interrupted=outcome.state is RunState.INTERRUPTED)

    def fetch(self, outcome: RunOutcome) -> dict | None:
        return self.backend.collect(self.dryrun, outcome, self.run)

    def close(self, left: bool = False) -> None:
        """Cancel the job, unless it was left to the scheduler (``--detach``, ``attach``)."""
        try:
            if not left and not self.job.ended:
                self.job.cancel()
                self.job.wait_ended(self.backend.options.grace_s + 60)
        finally:
            self.job.close()


def _offset_of_last_lines(path: str, lines: int) -> int:
    try:
        with open(path, "rb") as fh:
            return offset_of_last_lines(fh, lines)
    except FileNotFoundError:
        return 0


def _from_agents(record: RunRecord, detail: str) -> RunDescription:
    """A run's end from its agents' records (``node-K/supervisor.json``),
    where no controller recorded it: each node's exit event read as the
    controller would have heard it (``exit_outcome``)."""
    from ...agent.wire.protocol import ProtocolError, validate

    first_ranks = _first_ranks(record)
    nodes, ends = [], []
    for node in record.nodes:
        path = posixpath.join(node.run_dir, layout.SUPERVISOR_STATE)
        try:
            with open(path, encoding="utf-8") as fh:
                written = json.load(fh)
            code = written.get("exit_code")
            if code is not None:
                ends.append(os.path.getmtime(path))
        except (OSError, ValueError, AttributeError):
            written, code = {}, None
        try:
            event = validate(written.get("exit")) if written.get("exit") is not None else None
        except ProtocolError:  # a record this version cannot read: its exit code says enough
            event = None
        place = NodePlace(node.node_rank, node.host, first_ranks.get(node.node_rank, 0))
        if code is None:
            facts = NodeFacts(found=EndReason.NEVER_STARTED, words="never started: no run "
                              "directory") if not os.path.isdir(node.run_dir) else NodeFacts(
                found=EndReason.AGENT_DIED,
                words="the node agent ended without reporting (no exit status on record)")
        elif event is not None and code and node.node_rank in first_ranks:  # how it failed
            facts = NodeFacts(event, ended_at=os.path.getmtime(path))
        elif code == 0:  # as its record says it
            facts = NodeFacts({"code": 0}, found=EndReason.EXITED, words="torchrun exited 0")
        else:
            facts = NodeFacts({"code": code})
        nodes.append(node_outcome(place, facts))
    outcome = gang_outcome(record.run_id, tuple(nodes), 0.0, interrupted=False)
    return RunDescription(outcome.state, outcome.nodes, outcome.root_cause, detail,
                          ended=max(ends, default=None))


def _first_ranks(record: RunRecord) -> dict[int, int]:
    """Each node's first global rank, from the recorded plan ({}: unreadable)."""
    try:
        return {int(n["node_rank"]): int(n["ranks"][0]) for n in record.run.plan()["nodes"]}
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return {}


def _not_run(plan: RunPlan, why: str, started: float, *, interrupted: bool = False) -> RunOutcome:
    facts = NodeFacts(found=EndReason.NEVER_STARTED if interrupted else EndReason.NOT_RUN,
                      words=why)
    nodes = tuple(node_outcome(n, facts) for n in plan.nodes)
    return gang_outcome(plan.run_id, nodes, time.monotonic() - started, interrupted=interrupted)


def read_capped(path: str, limit: int) -> bytes | None:
    """A file's bytes, or None where it is missing, unreadable or over ``limit``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _copy_stream(node: NodePlan, run: RunDir) -> None:
    """What a node wrote before the job ended early, into its node log."""
    data = read_capped(posixpath.join(node.run_dir, STREAM_FILE), 1 << 20)
    if data:
        with open(run.node_log(node.node_rank), "ab") as fh:
            fh.write(data)
