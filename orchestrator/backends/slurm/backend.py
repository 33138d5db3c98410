"""The Slurm backend: ``sbatch`` one job, ``srun`` one node agent per node, with
``--kill-on-bad-exit`` so the other nodes stop when one fails, even with the
controller gone. With ``nodes: {count: N}`` node K is the allocation's K-th host."""

from __future__ import annotations

import json
import os
import posixpath
import time
from typing import TYPE_CHECKING, Mapping

from ...agent.layout import STREAM as STREAM_FILE
from ...agent.node.jobfile import Placement
from ...agent.node.procs import own_marker
from ...config.blocks.slurm import SlurmSpec
from ...plan.dryrun import ByHand
from ...plan.model import NodePlan, RunPlan
from ...plan.shell import shell_join
from ...records.rundir import RunDir
from ..base import Capabilities
from ..scheduler.backend import (AGENT_FILE, JOB_FILE, SchedulerBackend, agent_argv, job_dir,
                                 read_capped)
from . import ctl as slurmctl

if TYPE_CHECKING:  # `up` submits before it loads what follows, checks or dumps a run
    from ...engine.checkresult import Preflight
    from ...engine.stacks import StacksResult

PLACEMENT = Placement(scheduler="Slurm", node_name="SLURMD_NODENAME", node_index="SLURM_NODEID",
                      gpus="SLURM_STEP_GPUS", whole_node="slurm: {extra: [--exclusive]}",
                      cpus="SLURM_CPUS_PER_TASK")
SCRIPT_FILE = "job.sbatch"


class Backend(SchedulerBackend):
    name = "slurm"
    can = Capabilities(
        scheduler=True, scheduler_does="Slurm keeps the job",
        queue=True, queue_wait="how long a job may wait in Slurm's queue",
        restarts=False, instead_of_restarts=(
            "under Slurm, resubmit (the built-in workloads resume from --checkpoint with "
            "--resume), or use sbatch's --requeue"))
    placement = PLACEMENT
    job_key = "slurm_job"
    stops_the_rest = "srun --kill-on-bad-exit"

    # -- the job as Slurm sees it -----------------------------------------------

    def submit_job(self, plan: RunPlan, run: RunDir, env: dict[str, str]) -> str:
        run.write_text(SCRIPT_FILE, self.batch_script(plan))
        os.chmod(run.file(SCRIPT_FILE), 0o700)
        return slurmctl.submit(self.sbatch_argv(plan), env)

    def job_state(self, job_id: str) -> slurmctl.JobState | None:
        return slurmctl.job_state(job_id)

    def cancel_job(self, job_id: str, signal: str | None = None) -> None:
        slurmctl.cancel(job_id, signal)

    def accounted(self, job_id: str) -> str:
        accounted = slurmctl.accounting(job_id)
        return "" if accounted is None else f"{accounted[0]} (exit {accounted[1]}, from sacct)"

    def job_output(self, job_id: str, run: RunDir) -> str:
        return _tail(run.file(f"slurm-{job_id}.out"))

    def job_extras(self, plan: RunPlan) -> Mapping[str, str]:
        directory = job_dir(plan)
        return {f"sbatch (from {directory})": shell_join(self.sbatch_argv(plan)),
                f"batch script ({directory}/{SCRIPT_FILE})": self.batch_script(plan)}

    def where(self, node: NodePlan) -> str:
        if self.require_spec().placed and node.host.startswith("<"):
            return f"srun task on the allocation's node {node.node_rank}"
        return f"srun task on Slurm node {node.host}"

    def placed_note(self, plan: RunPlan) -> str:
        return ("hosts      chosen by Slurm when the job starts"
                + ("; GPUs from its GRES allocation (CUDA_VISIBLE_DEVICES set by Slurm)"
                   if plan.device != "cpu" and plan.nodes[0].gpus is None
                   and "CUDA_VISIBLE_DEVICES" not in plan.nodes[0].env else ""))

    def sbatch_argv(self, plan: RunPlan) -> list[str]:
        """``sbatch --parsable ...``: every option one argv word, never shell text."""
        directory = job_dir(plan)
        # --no-requeue: a requeued job would rerun over this run's files.
        return ["sbatch", "--parsable", f"--job-name=ddp-orch-{plan.name}",
                f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1", "--no-requeue",
                "--export=ALL", f"--output={directory}/slurm-%j.out", f"--chdir={directory}",
                *self._resources(plan), f"{directory}/{SCRIPT_FILE}"]

    def _resources(self, plan: RunPlan) -> list[str]:
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
        """The shell dry-run's way in: ``salloc``, an ``srun`` step per node, and node
        0's host name where the job picks the master address."""
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
                      master_host=(*step[0], "hostname")
                      if plan.master_addr == PLACEMENT.addr_slot else ())

    def _cpu_procs(self) -> int:
        """CPUs per node a CPU-process job asks for (0: a GPU job)."""
        return max((n.procs for n in self.require_spec().nodes if n.procs is not None),
                   default=0)

    def batch_script(self, plan: RunPlan) -> str:
        cpus = self._cpu_procs()
        srun = ["srun", f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1",
                # since 22.05 a step does not inherit the job's --cpus-per-task
                *([f"--cpus-per-task={cpus}"] if cpus else []),
                "--kill-on-bad-exit=1", *agent_argv(plan)]
        return (f"#!/bin/sh\n"
                f"# ddp-orch run {plan.run_id}: {plan.world_size} processes on "
                f"{len(plan.nodes)} node(s).\n"
                f"# One node agent per node. Each finds its node in {JOB_FILE}, starts torchrun\n"
                f"# for it, and writes its output to node-K/{STREAM_FILE} in this directory.\n"
                f"exec {shell_join(srun)}\n")

    # -- stacks and check ----------------------------------------------------------

    def job_stacks(self, job_id: str, nodes, run_id: str, native: bool = False) -> StacksResult:
        """One more step in the running job (``srun --overlap``): each node's
        agent dumps its ranks into the shared directory."""
        from ...engine.stacks import STACKS_TIMEOUT_S, StacksResult, rank_stacks

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
            data = read_capped(path, 64 << 20)
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

    def check(self, plan: RunPlan) -> Preflight:
        from ...engine.checkresult import Preflight
        from .check import slurm_checks

        return Preflight(tuple(slurm_checks(self.require_spec(), plan, job_dir(plan))))


def _gres_gpus(spec) -> int:
    """GPUs to ask for per node: the count, or enough for the highest pinned index."""
    if any(n.gpu_count for n in spec.nodes):
        return max(n.gpu_count or 0 for n in spec.nodes)
    pinned = [max(n.gpus) + 1 for n in spec.nodes if n.gpus]
    return max(pinned, default=0)


def _tail(path: str, lines: int = 5) -> str:
    data = read_capped(path, 1 << 20) or b""
    kept = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
