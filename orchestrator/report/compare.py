"""``ddp-orch compare``: one process vs the whole cluster, same job, side by side.

Seed 001's experiment as a command: the file's workload runs once as a
single process on node 0's first device (the baseline) and once on the
full cluster, with the same workload arguments, so the same global batch
and the same number of samples. The report gives total and per-step time,
the data vs compute(+sync) split, throughput, speed-up, scaling efficiency
(speed-up / world size) and the final loss/accuracy of each run.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..config.spec import ClusterSpec, NodeSpec
from ..errors import LaunchError
from ..records.outcome import RunState


@dataclass(frozen=True)
class RunSummary:
    label: str
    run_id: str
    world_size: int
    train_s: float
    total_s: float
    avg_batch_s: float
    avg_data_s: float
    avg_compute_s: float
    samples_per_s: float
    steps: int
    samples: int
    final_loss: float | None
    accuracy: float | None
    loss_curve: tuple[tuple[float, float], ...]
    rank_step_times: tuple[dict, ...] = ()  # per rank: rank, node_rank, host, mean_s, p50_s, p95_s


def baseline_spec(spec: ClusterSpec) -> ClusterSpec:
    """The same job as one process on node 0's first GPU (or one CPU process)."""
    first = spec.nodes[0]
    on_gpu = first.gpus is not None or first.gpu_count is not None
    single: NodeSpec = dataclasses.replace(
        first, gpus=first.gpus[:1] if first.gpus is not None else None,
        gpu_count=1 if first.gpu_count is not None else None,
        procs=None if on_gpu else 1)
    return dataclasses.replace(spec, nodes=(single,), name=f"{spec.name}-baseline")


def summarize(label: str, run_id: str, result: dict[str, Any]) -> RunSummary:
    """The numbers a comparison needs from a workload's result.json."""
    timing = result.get("timing") or {}
    metrics = result.get("metrics") or {}
    missing = [k for k in ("samples_per_s", "avg_batch_s") if k not in timing]
    if missing:
        raise LaunchError(f"run {run_id} has no training timing ({', '.join(missing)}): "
                          "compare needs a training workload such as linear, mlp or resnet")
    accuracy = next((metrics[k] for k in ("test_accuracy", "accuracy", "train_accuracy")
                     if isinstance(metrics.get(k), (int, float))), None)
    return RunSummary(
        label=label, run_id=run_id, world_size=int(result.get("world_size", 1)),
        train_s=float(timing.get("train_s", timing.get("total_s", 0.0))),
        total_s=float(timing.get("total_s", 0.0)),
        avg_batch_s=float(timing["avg_batch_s"]), avg_data_s=float(timing.get("avg_data_s", 0.0)),
        avg_compute_s=float(timing.get("avg_compute_s", 0.0)),
        samples_per_s=float(timing["samples_per_s"]), steps=int(timing.get("steps", 0)),
        samples=int(timing.get("samples", 0)), final_loss=metrics.get("final_loss"),
        accuracy=accuracy,
        loss_curve=tuple((float(s), float(l)) for s, l in result.get("loss_curve") or ()),
        rank_step_times=tuple(r for r in result.get("rank_step_times") or ()
                              if isinstance(r, dict)))


def comparison(base: RunSummary, ddp: RunSummary) -> dict[str, Any]:
    """report.json's content: both runs and the derived ratios."""
    speedup = base.train_s / ddp.train_s if ddp.train_s > 0 else float("nan")
    return {
        "baseline": _public(base), "ddp": _public(ddp),
        "speedup": speedup,
        "throughput_ratio": ddp.samples_per_s / base.samples_per_s if base.samples_per_s else None,
        "scaling_efficiency": speedup / ddp.world_size,
        "same_samples": base.samples == ddp.samples,
    }


def _public(run: RunSummary) -> dict[str, Any]:
    out = dataclasses.asdict(run)
    out["loss_curve"] = [list(p) for p in run.loss_curve]
    return out


_ROWS = (("world size", "world_size", "{:d}"), ("training time (s)", "train_s", "{:.2f}"),
         ("total time (s)", "total_s", "{:.2f}"), ("avg batch time (s)", "avg_batch_s", "{:.4f}"),
         ("  data (s)", "avg_data_s", "{:.4f}"), ("  compute+sync (s)", "avg_compute_s", "{:.4f}"),
         ("throughput (samples/s)", "samples_per_s", "{:.1f}"), ("steps", "steps", "{:d}"),
         ("samples", "samples", "{:d}"), ("final loss", "final_loss", "{:.4f}"),
         ("accuracy", "accuracy", "{:.4f}"))


def render_table(report: dict[str, Any]) -> str:
    base, ddp = report["baseline"], report["ddp"]
    lines = ["| metric | baseline (1 process) | DDP |", "| --- | ---: | ---: |"]
    for title, key, fmt in _ROWS:
        cells = ["-" if run[key] is None else fmt.format(run[key]) for run in (base, ddp)]
        lines.append(f"| {title} | {cells[0]} | {cells[1]} |")
    lines += ["", f"speed-up: **{report['speedup']:.2f}x**, throughput ratio "
              f"{report['throughput_ratio']:.2f}x, scaling efficiency "
              f"{report['scaling_efficiency']:.0%} on {ddp['world_size']} processes"]
    if not report["same_samples"]:
        lines.append("warning: the two runs did not process the same number of samples")
    return "\n".join(lines) + "\n"


def render_markdown(report: dict[str, Any], plots: list[str]) -> str:
    base, ddp = report["baseline"], report["ddp"]
    head = ["# DDP scaling report", "",
            f"Baseline run `{base['run_id']}`, DDP run `{ddp['run_id']}`. Same workload "
            "arguments, so the same global batch and the same samples; time is the "
            "training loop's, per-step figures are averages over all steps.", ""]
    images = [f"![{name}]({name})" for name in plots]
    return "\n".join(head) + render_table(report) + ("\n" + "\n\n".join(images) + "\n" if images else "")


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")


def run_or_load(label: str, spec: ClusterSpec | None, run_id: str | None, *, runs_dir: str,
                launch: Any) -> RunSummary:
    """An existing run's result (``run_id``), or a fresh run of ``spec``."""
    from ..records.store import find_run

    if run_id is not None:
        record = find_run(runs_dir, run_id)
        result = record.run.read_json("result.json")
        if record.state is not RunState.SUCCEEDED or not isinstance(result, dict):
            raise LaunchError(f"run {record.run_id} is {record.state} and has "
                              f"{'a' if isinstance(result, dict) else 'no'} result; "
                              "compare needs two succeeded runs")
        return summarize(label, record.run_id, result)
    assert spec is not None
    outcome, _run = launch(spec)
    if not outcome.ok or not outcome.result:
        raise LaunchError(f"the {label} run {outcome.run_id} {outcome.state}; see "
                          f"`ddp-orch status {outcome.run_id}`")
    return summarize(label, outcome.run_id, outcome.result)


def write_report(report: dict[str, Any], directory: str) -> tuple[list[str], str]:
    """report.json, the plots and report.md; returns (plot names, a note)."""
    import os

    write_json(os.path.join(directory, "report.json"), report)
    try:
        from .plots import write_plots

        plots, note = write_plots(report, directory), ""
    except ImportError:
        plots, note = [], "matplotlib is not installed: no plots (pip install 'ddp-orch[report]')"
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(render_markdown(report, plots))
    return plots, note
