"""The Slurm backend: ``sbatch`` one job, ``srun`` one node agent per node.

Slurm places, starts, signals and accounts for the nodes; we never imitate
it. The controller runs where ``sbatch`` works (a login or submit host) and
writes everything the job needs into the run directory, which must be on a
file system that the compute nodes share (``check.shared_dir_problem``):

* ``agent.pyz``: the node agent (stdlib only), as a zipapp;
* ``bundle.tar.gz``: the workload code, unpacked by each node's agent;
* ``job.json``: every node's supervisor spec, secrets left out;
* ``job.sbatch``: the batch script, ``exec srun ... agent.pyz job job.json``.

It submits with ``sbatch --parsable``, shows the job pending with Slurm's
reason, and once it runs reads every node's ``node-K/agent.out`` as it
grows (``slurm/job.py``), so the gang, the output, the root cause and the
summary are the same as over SSH. Teardown is ``scancel``: SIGTERM to every
agent, whose supervisor tears its torchrun down, Slurm's KillWait, SIGKILL.
``srun --kill-on-bad-exit`` stops the other nodes when one fails even if
the controller is gone.

Node ranks: a pinned node list keeps the file's order, and each agent finds
its entry by its Slurm node name; with ``nodes: {count: N}`` node K is the
allocation's K-th host (``SLURM_NODEID``). The master is node 0, whose agent
publishes its address and a free port in ``rendezvous.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import time

from ...agent.wire import bootstrap, files
from ...agent.node import outputs
from ...agent.kept.daemon import offset_of_last_lines
from ...agent.node.procs import own_marker
from ...agent import layout
from ...agent.layout import RENDEZVOUS as RENDEZVOUS_FILE, STREAM as STREAM_FILE
from ...agent.node.jobfile import JobNode, JobSpec, Placement
from ...agent.node.jobnode import ADDR_SLOT, PORT_SLOT, secret_variable
from ...config.blocks.slurm import SlurmSpec
from ...config.spec import AUTO_PORT
from ...console import Console
from ...errors import LaunchError
from ...plan.build import build_plan, resolve_plan
from ...plan.dryrun import ByHand, DryRun, NodeLaunch
from ...plan.model import NodePlan, RunPlan
from ...plan.shell import shell_join
from ...plan.secrets import is_secret
from ...plan.torchrun import torchrun_argv
from ...records.outcome import (NodeOutcome, NodeState, RunDescription, RunOutcome, RunState,
                               gang_outcome)
from ...records.rundir import RunDir
from ...records.store import NodeRecord, RunRecord, controller_alive
from . import ctl as slurmctl
from ..base import CancelResult, LaunchBackend, recorded_dryrun
from ...engine.stacks import STACKS_TIMEOUT_S, StacksResult, rank_stacks
from ...engine.preflight import Preflight
from ...engine.bundle import build_bundle, code_notes, stand_ins
from ...engine.run import RunHandle, node_records
from ...engine.nodehandle import BUNDLE_NAME, supervisor_spec
from ...engine.results import fetch_outputs, keep, wanted_files
from .check import slurm_checks
from .job import JobStream, SlurmJob

AGENT_FILE = "agent.pyz"
JOB_FILE = "job.json"
# Where a node's agent finds its place in the job (``jobnode.node_rank_here``,
# ``check_gpus``): the environment variables Slurm sets for each task, and the
# words its messages use; written into job.json, so the agent names no scheduler.
PLACEMENT = Placement(scheduler="Slurm", node_name="SLURMD_NODENAME", node_index="SLURM_NODEID",
                      gpus="SLURM_STEP_GPUS", whole_node="slurm: {extra: [--exclusive]}")
SCRIPT_FILE = "job.sbatch"
SQUEUE_GIVE_UP_S = 120.0  # squeue failing that long while queued: give up (and scancel)


def job_dir(plan: RunPlan) -> str:
    """The job's shared directory: the local run directory, which holds every
    node's run directory (``build_plan(..., shared_run_dir=True)``)."""
    return posixpath.dirname(plan.nodes[0].run_dir)


class Backend(LaunchBackend):
    name = "slurm"
    scheduler = "Slurm keeps the job"
    queue = "how long a job may wait in Slurm's queue"
    no_restarts = ("under Slurm, resubmit (the built-in workloads resume from --checkpoint "
                   "with --resume), or use sbatch's --requeue")

    # -- the plan and its dry-run (pure) -------------------------------------

    def plan(self, run_id: str, local_run_dir: str) -> RunPlan:
        spec = self.require_spec()
        return build_plan(spec, run_id=run_id, local_run_dir=local_run_dir,
                          master_addr=spec.master_addr or ADDR_SLOT, shared_run_dir=True)

    def where(self, node: NodePlan) -> str:
        if self.require_spec().placed and node.host.startswith("<"):
            return f"srun task on the allocation's node {node.node_rank}"
        return f"srun task on Slurm node {node.host}"

    def dryrun(self, plan: RunPlan) -> DryRun:
        # Until the job runs, the master is two placeholder words that node 0's
        # agent fills in (``agent/node/jobnode.py``); the rest is the real argv.
        shown = plan if plan.master_port != AUTO_PORT else \
            dataclasses.replace(plan, master_port=PORT_SLOT)
        nodes = tuple(NodeLaunch(node=n, where=self.where(n), env=n.env, unset_env=n.unset_env,
                                 argv=torchrun_argv(shown, n), setup=plan.setup,
                                 setup_timeout_s=plan.setup_timeout_s,
                                 setup_when_changed=plan.setup_when_changed)
                      for n in plan.nodes)
        notes = list(code_notes(plan, self.spec.source if self.spec else ""))
        if self.require_spec().placed:
            notes.append("hosts      chosen by Slurm when the job starts"
                         + ("; GPUs from its GRES allocation (CUDA_VISIBLE_DEVICES set by Slurm)"
                            if plan.device != "cpu" and plan.nodes[0].gpus is None
                            and "CUDA_VISIBLE_DEVICES" not in plan.nodes[0].env else ""))
        directory = job_dir(plan)
        extras = {
            f"sbatch (from {directory})": shell_join(self.sbatch_argv(plan)),
            f"batch script ({directory}/{SCRIPT_FILE})": self.batch_script(plan),
        }
        owner, words = self.owner()
        return DryRun(backend=self.name, plan=plan, nodes=nodes, notes=tuple(notes),
                      source=self.spec.source if self.spec else "", extras=extras,
                      owner=owner, owner_words=words,
                      by_hand=self.by_hand(plan))

    def sbatch_argv(self, plan: RunPlan) -> list[str]:
        """``sbatch --parsable ...``: every option as one argv word, never shell text."""
        directory = job_dir(plan)
        # --no-requeue: a requeued job would rerun over this run's files.
        return ["sbatch", "--parsable", f"--job-name=ddp-orch-{plan.name}",
                f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1", "--no-requeue",
                "--export=ALL", f"--output={directory}/slurm-%j.out", f"--chdir={directory}",
                *self._resources(plan), f"{directory}/{SCRIPT_FILE}"]

    def _resources(self, plan: RunPlan) -> list[str]:
        """The job's nodes, GPUs, CPUs and the file's ``slurm:`` options."""
        spec = self.require_spec()
        slurm = spec.block("slurm") or SlurmSpec()
        argv = []
        if not spec.placed:
            argv.append("--nodelist=" + ",".join(n.host for n in plan.nodes))
        gpus = _gres_gpus(spec)
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        if self._cpu_procs():
            argv.append(f"--cpus-per-task={self._cpu_procs()}")
        for key in ("partition", "account", "time", "qos"):
            value = getattr(slurm, key)
            if value is not None:
                argv.append(f"--{key}={value}")
        argv += list(slurm.extra)
        return argv

    def by_hand(self, plan: RunPlan) -> ByHand:
        """The shell dry-run's way in: an interactive allocation with the
        job's own options (``salloc``), one step per node (``srun``, placed
        by name or, for nodes Slurm chooses, by their index), and node 0's
        host name for a master address the file leaves to the job."""
        cpus = self._cpu_procs()
        placed = self.require_spec().placed
        step = {n.node_rank: ("srun", "--nodes=1", "--ntasks=1",
                              *([f"--cpus-per-task={cpus}"] if cpus else []),
                              f"--relative={n.node_rank}" if placed else f"--nodelist={n.host}")
                for n in plan.nodes}
        return ByHand(allocate=("salloc", f"--job-name=ddp-orch-{plan.name}",
                                f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1",
                                *self._resources(plan)),
                      step=step,
                      master_host=(*step[0], "hostname") if plan.master_addr == ADDR_SLOT else ())

    def _cpu_procs(self) -> int:
        """CPUs per node a CPU-process job asks for (0: a GPU job)."""
        return max((n.procs for n in self.require_spec().nodes if n.procs is not None),
                   default=0)

    def batch_script(self, plan: RunPlan) -> str:
        directory = job_dir(plan)
        cpus = self._cpu_procs()
        srun = ["srun", f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1",
                # since 22.05 a step does not inherit the job's --cpus-per-task
                *([f"--cpus-per-task={cpus}"] if cpus else []),
                "--kill-on-bad-exit=1", plan.nodes[0].python, "-I", "-S",
                f"{directory}/{AGENT_FILE}", "job", f"{directory}/{JOB_FILE}"]
        return (f"#!/bin/sh\n"
                f"# ddp-orch run {plan.run_id}: {plan.world_size} processes on "
                f"{len(plan.nodes)} node(s).\n"
                f"# One node agent per node. Each finds its node in {JOB_FILE}, starts torchrun\n"
                f"# for it, and writes its output to node-K/{STREAM_FILE} in this directory.\n"
                f"exec {shell_join(srun)}\n")

    # -- submit and reconnect ----------------------------------------------------

    def submit(self, info: DryRun, run: RunDir, console: Console) -> "SlurmRun":
        """The job's files in the run directory, then ``sbatch``; the handle
        waits in the queue and finds the rendezvous once the engine follows.
        Nothing is submitted when the job cannot run as planned."""
        plan = info.plan
        started = time.monotonic()
        problems = [r for r in slurm_checks(self.require_spec(), plan, job_dir(plan)) if not r.ok]
        if problems:
            raise LaunchError("the job cannot run as planned; nothing was submitted:\n"
                              + "\n".join(f"  {r.host}: {r.check}: {r.detail}" for r in problems))
        env = self._write_job(info, run)
        job_id = slurmctl.submit(self.sbatch_argv(plan), env)
        handle = SlurmRun(self, info, run, SlurmJob(job_id, poll=False), started)
        try:  # from here on, whatever happens, nothing of the job stays queued (close)
            console.info(f"submitted Slurm job {job_id}; run directory {run.path}")
        except BaseException:
            handle.close()
            raise
        return handle

    def reconnect(self, record: RunRecord, *, lines: int | None = None) -> "SlurmRun":
        """Follow a detached job's node streams (``agent.out`` in the shared run
        directory) until the job ends; Ctrl-C leaves it to Slurm."""
        job_id = _job_of(record)
        if job_id is None:
            raise LaunchError(f"run {record.run_id} has no Slurm job on record")
        resolved = recorded_dryrun(record)
        started = time.monotonic()
        handle = SlurmRun(self, resolved, record.run, SlurmJob(job_id), started, watching=True,
                          records=record.nodes)
        if lines is not None:
            for stream in handle.streams.values():
                stream.offset = _offset_of_last_lines(stream.path, lines)
        return handle

    def _await_running(self, job: SlurmJob, console: Console) -> str:
        """Wait while the job is queued, showing Slurm's reason; "" once it
        runs (or ended: the streams tell), else why it never ran."""
        shown = None
        limit = self.options.queue_timeout_s
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            state = job.state
            if job.ended or (state is not None and state.running):
                return ""
            if job.failing_for > SQUEUE_GIVE_UP_S:
                raise slurmctl.SlurmError("squeue", f"cannot follow job {job.job_id} for "
                                          f"{job.failing_for:.0f}s: {job.error}")
            if state is not None and (state.state, state.reason) != shown:
                shown = (state.state, state.reason)
                console.info(f"Slurm job {job.job_id} {state.state.lower()}"
                             + (f" ({state.reason})" if state.reason else ""))
            if deadline is not None and time.monotonic() > deadline:
                reason = f" ({state.reason})" if state and state.reason else ""
                console.info(f"Slurm job {job.job_id} still queued after {limit:g}s{reason}; "
                             "cancelling it")
                job.cancel()
                job.wait_ended(30)
                return (f"the Slurm job was still queued after the queue timeout of {limit:g}s"
                        f"{reason}; it was cancelled and never ran")
            time.sleep(0.2)

    def _resolve(self, info: DryRun, job: SlurmJob) -> DryRun | None:
        """The dry-run with the allocation's hosts and node 0's rendezvous, once
        node 0's agent has published it; None if the job ended first."""
        plan = info.plan
        hosts: dict[int, str] = {}
        if self.require_spec().placed:
            state = job.state or job.refresh()
            if state is None or not state.nodelist or state.nodelist.startswith("("):
                return None
            hosts = dict(enumerate(slurmctl.hostnames(state.nodelist)))
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
        return self.dryrun(resolve_plan(plan, master_port=port, homes={}, hosts=hosts,
                                        master_addr=addr if plan.master_addr == ADDR_SLOT
                                        else None))

    def _ended_early(self, plan: RunPlan, run: RunDir, job: SlurmJob,
                     started: float) -> RunOutcome:
        """The job ended, or never got node 0 going, before any rendezvous."""
        if not job.ended:
            job.cancel()
            job.wait_ended(self.options.grace_s + 30)
        state = job.state.state if job.state else "gone"
        wrote = [n.node_rank for n in plan.nodes
                 if os.path.exists(posixpath.join(n.run_dir, STREAM_FILE))]
        output = _tail(run.file(f"slurm-{job.job_id}.out"))
        if not wrote and state == "CANCELLED":
            why = "the Slurm job was cancelled (scancel) before its nodes started"
        elif not wrote:
            why = (f"the Slurm job ended ({state}) before any node wrote to {job_dir(plan)}: "
                   "the compute nodes must see the run directory (a shared file system), "
                   "and the node's python must run the agent")
        else:
            why = f"the Slurm job ended ({state}) before node 0 published the rendezvous"
        if output:
            why += f"; the job's output: {output}"
        for node in plan.nodes:
            _copy_stream(node, run)
        return _not_run(plan, why, started)

    def _explain(self, outcome: NodeOutcome, nodes: tuple[NodeOutcome, ...],
                 job: SlurmJob) -> NodeOutcome:
        """Slurm's words for a node that ended without a report of its own:
        stopped by srun --kill-on-bad-exit (SIGKILL) when another node failed,
        or lost with the job."""
        if outcome.state is not NodeState.LOST or outcome.failures:
            return outcome
        failed = [o for o in nodes if o.state is NodeState.FAILED]
        if failed:
            return dataclasses.replace(
                outcome, state=NodeState.STOPPED,
                reason=f"ended by Slurm when node {failed[0].node_rank} failed "
                       "(srun --kill-on-bad-exit)")
        state = job.state.state if job.state else "no longer listed"
        reason = (f"the Slurm job ended ({state}) without a report from this node's agent "
                  f"(killed, or the node failed)")
        return dataclasses.replace(outcome, reason=reason)

    def _write_job(self, info: DryRun, run: RunDir) -> dict[str, str]:
        """agent.pyz, the bundle, job.json and the batch script, in the run
        directory; returns sbatch's environment, which carries the secrets
        and the run's own marker (``procs.own_marker``: each node's agent
        is a process of the run, found as one)."""
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
        job = JobSpec(plan.run_id, job_dir(plan), self.require_spec().placed, PLACEMENT,
                      None if plan.master_addr == ADDR_SLOT else plan.master_addr,
                      None if plan.master_port == AUTO_PORT else int(plan.master_port),
                      self.options.start_timeout_s, tuple(nodes))
        run.write_json(JOB_FILE, job.to_dict())
        run.write_text(SCRIPT_FILE, self.batch_script(plan))
        os.chmod(run.file(SCRIPT_FILE), 0o700)
        return env

    def _collect(self, info: DryRun, outcome: RunOutcome, run: RunDir) -> dict | None:
        """What the run brings home (``results.wanted_files``), read from the
        shared run directory: no symlink, no file larger than its cap, and
        nothing whose real path leaves the node's run directory."""
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
                    keep(run, info, k, file, data)
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

    # -- down, status, check ---------------------------------------------------

    def cancel(self, record: RunRecord) -> list[CancelResult]:
        job_id = _job_of(record)
        if job_id is None:
            return [CancelResult(n.node_rank, n.host, (), "no Slurm job on record (never "
                                 "submitted)") for n in record.nodes]
        job = SlurmJob(job_id)
        try:
            job.cancel()
            ended = job.wait_ended(self.options.grace_s + 60)
        finally:
            job.close()
        error = "" if ended else f"Slurm job {job_id} is still listed after scancel"
        return [CancelResult(n.node_rank, n.host, (), error) for n in record.nodes]

    def stacks(self, record: RunRecord, native: bool = False) -> StacksResult:
        job_id = _job_of(record)
        if job_id is None:
            raise LaunchError(f"run {record.run_id} has no Slurm job on record")
        return self._stacks(job_id, record.nodes, record.run_id, native)

    def _stacks(self, job_id: str, nodes, run_id: str, native: bool = False) -> StacksResult:
        """One more step in the running job (``srun --overlap``), one task per
        node: each node's agent dumps its ranks into the shared directory."""
        directory = posixpath.dirname(nodes[0].run_dir)
        hosts = [n.host for n in nodes]
        prefix = f"{directory}/stacks-step-{os.getpid()}-{int(time.time() * 1000)}"
        argv = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(hosts)}",
                "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}", "--quiet",
                nodes[0].python, "-I", "-S", f"{directory}/{AGENT_FILE}", "stacks",
                f"{directory}/{JOB_FILE}", prefix, *(["--native"] if native else [])]
        done = slurmctl.run(argv, env={**os.environ, **own_marker(run_id)},
                            timeout=STACKS_TIMEOUT_S + 60)
        ranks, seen = [], set()
        for node in nodes:
            path = f"{prefix}-node-{node.node_rank}.json"
            data = _read_capped(path, 64 << 20)
            try:
                os.unlink(path)
            except OSError:
                pass
            try:
                report = json.loads(data or b"")
            except ValueError:
                continue
            seen.add(node.node_rank)
            ranks += rank_stacks(report.get("ranks") if isinstance(report, dict) else None, nodes)
        why = done.stderr.strip()[-300:] or "its agent wrote no dump into the shared directory"
        missing = tuple((n.node_rank, n.host, why) for n in nodes if n.node_rank not in seen)
        return StacksResult(tuple(sorted(ranks, key=lambda r: r.rank)), missing)

    def describe(self, record: RunRecord) -> RunDescription:
        job_id = _job_of(record)
        if job_id is None:  # its controller never saw the job run
            gone = record.state.live and not controller_alive(record)
            return RunDescription(RunState.INTERRUPTED if gone else record.state,
                                  record.outcomes, record.root_cause,
                                  "no Slurm job on record" if gone else "")
        state = slurmctl.job_state(job_id)
        if state is not None and not state.ended:
            where = f" on {state.nodelist}" if state.running else ""
            reason = f" ({state.reason})" if state.reason else ""
            queued = state.state in ("PENDING", "CONFIGURING")  # waiting for its nodes
            live = (RunState.PENDING if queued else RunState.RUNNING) \
                if record.state.live else record.state
            return RunDescription(live, record.outcomes, record.root_cause,
                                  f"Slurm job {job_id}: {state.state}{reason}{where}")
        accounted = slurmctl.accounting(job_id)
        if state is not None:
            detail = f"Slurm job {job_id}: {state.state}"
        elif accounted is not None:
            detail = f"Slurm job {job_id}: {accounted[0]} (exit {accounted[1]}, from sacct)"
        else:
            detail = f"Slurm job {job_id}: no longer listed by Slurm"
        if record.state.live:  # the controller is gone: the agents' records say how it ended
            return _from_agents(record, detail)
        return RunDescription(record.state, record.outcomes, record.root_cause, detail)

    def check(self, plan: RunPlan) -> Preflight:
        return Preflight(tuple(slurm_checks(self.require_spec(), plan, job_dir(plan))))

class SlurmRun(RunHandle):
    """A Slurm job: its node streams are the gang's channels, Slurm holds
    their liveness, and the job id lives here and in the records (for
    ``down`` while it waits in the queue). Submitted, it is pending: the
    engine's ``running`` waits in the queue, then for node 0's rendezvous."""

    def __init__(self, backend: Backend, info: DryRun, run: RunDir, job: SlurmJob,
                 started: float, *, watching: bool = False,
                 records: tuple[NodeRecord, ...] = ()):
        super().__init__(info, run, watching=watching, records=records or node_records(
            info, {"slurm_job": job.job_id}), dump_stacks=lambda: backend._stacks(
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
            waited = backend._await_running(job, console)
        except KeyboardInterrupt:
            console.always(f"ddp-orch: interrupted; cancelling Slurm job {job.job_id}")
            job.cancel()
            return _not_run(plan, "cancelled while queued (Ctrl-C)", started, interrupted=True)
        if waited:
            return _not_run(plan, waited, started)
        self.streams = self._streams(self.dryrun)
        self.channels = self.streams
        try:
            resolved = backend._resolve(self.dryrun, job)
        except KeyboardInterrupt:
            job.cancel()
            return _not_run(plan, "cancelled while starting (Ctrl-C)", started, interrupted=True)
        if resolved is None:
            return backend._ended_early(plan, self.run, job, started)
        self.dryrun = resolved
        self.records = node_records(resolved, {"slurm_job": job.job_id})
        self.pending = False
        return None

    def settle(self, outcome: RunOutcome) -> RunOutcome:
        """Once the gang is over: the job gone from the queue, each node's end
        explained with Slurm's view."""
        job, plan = self.job, self.dryrun.plan
        if not job.wait_ended(self.backend.options.grace_s + 30):
            job.cancel()
            job.wait_ended(30)
        for stream in self.streams.values():
            stream.close()
        nodes = tuple(self.backend._explain(o, outcome.nodes, job) for o in outcome.nodes)
        return gang_outcome(plan.run_id, nodes, time.monotonic() - self.started,
                            interrupted=outcome.state is RunState.INTERRUPTED)

    def fetch(self, outcome: RunOutcome) -> dict | None:
        return self.backend._collect(self.dryrun, outcome, self.run)

    def close(self, left: bool = False) -> None:
        """Unless the job was left to Slurm (``--detach``, ``attach``): scancel
        what of it is still queued or running."""
        try:
            if not left and not self.job.ended:
                self.job.cancel()
                self.job.wait_ended(self.backend.options.grace_s + 60)
        finally:
            self.job.close()


def _gres_gpus(spec) -> int:
    """GPUs to ask Slurm for on each node: the count, or enough for the highest
    pinned index (CUDA_VISIBLE_DEVICES then names the user's GPUs in that set)."""
    if any(n.gpu_count for n in spec.nodes):
        return max(n.gpu_count or 0 for n in spec.nodes)
    pinned = [max(n.gpus) + 1 for n in spec.nodes if n.gpus]
    return max(pinned, default=0)


def _offset_of_last_lines(path: str, lines: int) -> int:
    try:
        with open(path, "rb") as fh:
            return offset_of_last_lines(fh, lines)
    except FileNotFoundError:
        return 0


def _job_of(record: RunRecord) -> str | None:
    for node in record.nodes:
        job_id = node.connection.get("slurm_job")
        if job_id:
            return str(job_id)
    return None


def _from_agents(record: RunRecord, detail: str) -> RunDescription:
    """The agents' own records (``node-K/supervisor.json``) of a run whose
    controller did not live to record its end; it ended when the last of
    them was written with its exit code."""
    nodes, ends = [], []
    for node in record.nodes:
        path = posixpath.join(node.run_dir, layout.SUPERVISOR_STATE)
        try:
            with open(path, encoding="utf-8") as fh:
                code = json.load(fh).get("exit_code")
            if code is not None:
                ends.append(os.path.getmtime(path))
        except (OSError, ValueError):
            code = None
        state = (NodeState.NOT_STARTED if code is None and not os.path.isdir(node.run_dir)
                 else NodeState.LOST if code is None
                 else NodeState.SUCCEEDED if code == 0 else NodeState.FAILED)
        nodes.append(NodeOutcome(node.node_rank, node.host, state, code,
                                 f"torchrun exited {code}" if code is not None else
                                 "no exit status on record", None))
    outcome = gang_outcome(record.run_id, tuple(nodes), 0.0, interrupted=False)
    return RunDescription(outcome.state, outcome.nodes, outcome.root_cause, detail,
                          ended=max(ends, default=None))


def _not_run(plan: RunPlan, why: str, started: float, *, interrupted: bool = False) -> RunOutcome:
    state = NodeState.NOT_STARTED if interrupted else NodeState.FAILED
    nodes = tuple(NodeOutcome(n.node_rank, n.host, state, None, why, None) for n in plan.nodes)
    return gang_outcome(plan.run_id, nodes, time.monotonic() - started, interrupted=interrupted)


def _read_capped(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _tail(path: str, lines: int = 5) -> str:
    data = _read_capped(path, 1 << 20) or b""
    kept = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def _copy_stream(node: NodePlan, run: RunDir) -> None:
    """What a node wrote before the job ended early, into its node log."""
    data = _read_capped(posixpath.join(node.run_dir, STREAM_FILE), 1 << 20)
    if data:
        with open(run.node_log(node.node_rank), "ab") as fh:
            fh.write(data)

