"""``ddp-orch compare``'s runs: which specs, and launching or reusing them."""

from __future__ import annotations

import dataclasses
from typing import Any

from workloads import contract

from ..config.localmode import with_args
from ..config.spec import GPU_REQUESTS, ClusterSpec, NodeSpec
from ..errors import ConfigError, LaunchError
from ..records.outcome import RunState
from ..records.store import find_run
from ..report.compare import RunSummary, summarize

BASELINES = ("single", "dp")
DP_EXAMPLE = "ddp-orch compare --local --workload mlp --gpus 0,1 --baseline dp"


THREADS_VAR = "OMP_NUM_THREADS"


def one_thread_per_cpu_process(spec: ClusterSpec) -> ClusterSpec:
    """Each CPU process on one intra-op thread, unless its env sets ``OMP_NUM_THREADS``:
    torchrun gives a lone process every core, so the speed-up would measure threads,
    not processes (526% efficiency on a loaded 2-core machine)."""
    nodes = tuple(node if node.procs is None or THREADS_VAR in node.env else
                  dataclasses.replace(node, env={**node.env, THREADS_VAR: "1"})
                  for node in spec.nodes)
    return dataclasses.replace(spec, nodes=nodes)


def baseline_spec(spec: ClusterSpec, kind: str = "single") -> ClusterSpec:
    """The same job as one process on node 0's first GPU (or one CPU process);
    with ``kind`` ``dp``, as mlp's DataParallel over all of node 0's GPUs."""
    first = spec.nodes[0]
    if kind == "dp":
        check_dp_baseline(spec)
        node: NodeSpec = dataclasses.replace(first, one_process=True)
        return dataclasses.replace(with_args(spec, {"mode": "dp"}), nodes=(node,),
                                   name=f"{spec.name}-dp-baseline")
    if kind != "single":
        raise ConfigError(f"unknown baseline {kind!r}", path="--baseline",
                          source="command line", hint=" or ".join(BASELINES))
    on_gpu = first.on_gpus or first.gpu_count is not None
    single: NodeSpec = dataclasses.replace(
        first, gpus=first.gpus[:1] if first.gpus is not None else None,
        gpu_count=1 if first.gpu_count is not None else None,
        # GPUs chosen at launch: one, chosen by the same rule (least used first)
        gpu_request="free:1" if first.gpu_request is not None else None,
        procs=None if on_gpu else 1)
    return one_thread_per_cpu_process(
        dataclasses.replace(spec, nodes=(single,), name=f"{spec.name}-baseline"))


def node_spec(spec: ClusterSpec, kind: str = "single") -> ClusterSpec | None:
    """The job on node 0 alone; None where it would repeat the baseline or the cluster."""
    first = spec.nodes[0]
    if kind != "single" or len(spec.nodes) < 2 or first.nproc == 1:
        return None
    return one_thread_per_cpu_process(
        dataclasses.replace(spec, nodes=(first,), name=f"{spec.name}-node0"))


def ddp_spec(spec: ClusterSpec, kind: str = "single") -> ClusterSpec:
    """The cluster side; against a DataParallel baseline, mlp's ``mode`` set to ddp."""
    return with_args(spec, {"mode": "ddp"}) if kind == "dp" else one_thread_per_cpu_process(spec)


def check_dp_baseline(spec: ClusterSpec) -> None:
    """Refuse ``--baseline dp`` unless node 0 has two GPUs or more for mlp's ``--mode dp``."""
    where = "--baseline dp"
    if spec.workload.name != "mlp":
        given = spec.workload.name or spec.workload.module or spec.workload.script or "?"
        raise ConfigError(f"the DataParallel baseline is the mlp workload's --mode dp, but the "
                          f"workload here is {given}", path=where, source="command line",
                          hint=DP_EXAMPLE)
    first = spec.nodes[0]
    if first.gpu_request in GPU_REQUESTS:
        return  # all, free: how many only the node says; mlp refuses fewer than 2 itself
    gpus = first.gpu_count if first.gpu_count is not None else first.nproc \
        if first.on_gpus else 0
    if spec.device == "cpu" or gpus < 2:
        has = ("device: cpu" if spec.device == "cpu" and gpus else
               f"{gpus} GPU" if gpus == 1 else f"procs: {first.procs} (CPU processes)"
               if first.procs is not None else "no GPUs")
        raise ConfigError(f"nn.DataParallel needs at least 2 GPUs on node 0 "
                          f"({first.host}), which has {has}", path=where,
                          source="command line",
                          hint=f"on a machine with 2 or more GPUs: {DP_EXAMPLE}")


def load_run(label: str, run_id: str, runs_dir: str) -> RunSummary:
    """A finished run's result as the ``label`` side, loaded before anything launches."""
    record = find_run(runs_dir, run_id)
    result = record.run.result()
    if record.state is RunState.SUCCEEDED and not isinstance(result, dict):
        raise LaunchError(no_result(label, record.run_id, record.run.plan()))
    if record.state is not RunState.SUCCEEDED or not isinstance(result, dict):
        raise LaunchError(f"run {record.run_id} is {record.state} and has "
                          f"{'a' if isinstance(result, dict) else 'no'} result; "
                          "compare needs two succeeded runs")
    return summarize(label, record.run_id, result)


def launch_run(label: str, spec: ClusterSpec, launch: Any) -> RunSummary:
    """A fresh run of ``spec`` as the ``label`` side; ``LaunchError`` if it
    failed or wrote no result, so the other side does not run for nothing."""
    outcome, run = launch(spec)
    if outcome.ok and not outcome.result:
        raise LaunchError(no_result(label, outcome.run_id, run.plan()))
    if not outcome.ok or not outcome.result:
        raise LaunchError(f"the {label} run {outcome.run_id} {outcome.state}; see "
                          f"`ddp-orch status {outcome.run_id}`")
    return summarize(label, outcome.run_id, outcome.result)


def no_result(label: str, run_id: str, plan: Any) -> str:
    """Why a run that succeeded is no side: it wrote no result, as a user's script may not."""
    try:
        node0 = plan["nodes"][0]
        where = f" (for this run {node0['env'][contract.RESULT_FILE_ENV]} on node 0, " \
                f"{node0['host']})"
        program = f"`{plan['workload']}`"
    except (KeyError, IndexError, TypeError):
        where, program = "", "the program"
    return (f"the {label} run {run_id} succeeded, but {program} wrote no result: compare "
            f"reads the JSON object that rank 0 writes to the path in "
            f"${contract.RESULT_FILE_ENV}{where}\n"
            f"  hint: at the end of training, on rank 0: `from workloads.contract import "
            f"RESULT_FILE_ENV, write_json_atomic` then `write_json_atomic(os.environ["
            f"RESULT_FILE_ENV], {{\"world_size\": ..., \"timing\": {{\"samples_per_s\": ..., "
            f"\"avg_batch_s\": ..., \"train_s\": ...}}}})` (workloads.contract is on the "
            f"nodes' PYTHONPATH; docs/compare.md lists what compare reads)")
