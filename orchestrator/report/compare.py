"""``ddp-orch compare``'s report: two runs' results side by side. A speed-up is
only a comparison when both sides solve the same learning problem, so the report
names every difference."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import LaunchError


# Configuration keys that are no learning choice, or that have rows of their own.
_NOT_COMPARED = frozenset({"result_file", "lr", "global_batch_size", "data", "mode"})


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
    workload: str | None = None
    lr: float | None = None  # the effective one, after lr_scaling
    lr_scaling: str | None = None
    global_batch: int | None = None
    data: str | None = None  # real / synthetic / generated
    data_source: str | None = None  # where from, or why synthetic
    mode: str | None = None  # mlp's ddp or dp
    dp_gpus: int = 0  # the GPUs a DataParallel process drove (0: not DataParallel)
    arguments: tuple[tuple[str, Any], ...] = ()  # the workload's arguments, by name
    avg_allreduce_s: float | None = None  # the all-reduce's exposed wait, within compute
    nodes: int = 1

    @property
    def devices(self) -> int:
        """Devices doing the work: the world size, or a DataParallel's GPUs."""
        return self.dp_gpus or self.world_size

    @property
    def title(self) -> str:
        if self.dp_gpus:
            return f"DataParallel (1 process, {self.dp_gpus} GPUs)"
        if self.label == "node":
            return f"node 0 alone ({self.world_size} processes)"
        return "baseline (1 process)" if self.label == "baseline" else "DDP"


def summarize(label: str, run_id: str, result: dict[str, Any]) -> RunSummary:
    """The numbers a comparison needs from a workload's result.json."""
    timing = result.get("timing") or {}
    metrics = result.get("metrics") or {}
    missing = [k for k in ("samples_per_s", "avg_batch_s") if k not in timing]
    if missing:
        raise LaunchError(f"run {run_id} has no training timing ({', '.join(missing)}): "
                          "compare needs a training workload such as linear, mlp or resnet, "
                          "or a result whose \"timing\" has samples_per_s and avg_batch_s")
    accuracy = next((metrics[k] for k in ("test_accuracy", "accuracy", "train_accuracy")
                     if isinstance(metrics.get(k), (int, float))), None)
    config = result.get("config") if isinstance(result.get("config"), dict) else {}
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
                              if isinstance(r, dict)),
        workload=_str(result.get("workload")), lr=_float(metrics.get("lr")),
        lr_scaling=_str(config.get("lr_scaling")),
        global_batch=config.get("global_batch_size")
        if isinstance(config.get("global_batch_size"), int) else None,
        data=_str(result.get("data")), data_source=_str(result.get("data_source")),
        mode=_str(result.get("mode")),
        dp_gpus=int(metrics.get("dp_gpus") or 0) if result.get("mode") == "dp" else 0,
        arguments=tuple(sorted((k, v) for k, v in config.items() if k != "result_file")),
        avg_allreduce_s=_float(timing.get("avg_allreduce_s")),
        nodes=int(result.get("nodes") or 1))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def differences(base: RunSummary, ddp: RunSummary) -> list[str]:
    """Each way the two sides differ as a learning problem, in words; empty if none."""
    out = []
    if base.workload != ddp.workload:
        out.append(f"workload: {base.workload} vs {ddp.workload}")
    if base.lr is not None and ddp.lr is not None and not _same(base.lr, ddp.lr):
        why = ""
        if "linear" in (base.lr_scaling, ddp.lr_scaling):
            why = (f": lr_scaling=linear multiplies lr by the world size ({base.world_size} vs "
                   f"{ddp.world_size}) although the global batch is the same, so each step is "
                   "a different update; set lr_scaling=none to compare one learning problem")
        out.append(f"learning rate: {base.lr:g} vs {ddp.lr:g}{why}")
    if base.global_batch != ddp.global_batch:
        out.append(f"global batch: {base.global_batch} vs {ddp.global_batch}")
    if base.data != ddp.data:
        out.append(f"data: {base.data} ({base.data_source or '-'}) vs {ddp.data} "
                   f"({ddp.data_source or '-'})")
    theirs = dict(ddp.arguments)
    for key, value in base.arguments:
        if key not in _NOT_COMPARED and key in theirs and theirs[key] != value:
            out.append(f"argument {key}: {value!r} vs {theirs[key]!r}")
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def comparison(base: RunSummary, ddp: RunSummary,
               node: RunSummary | None = None) -> dict[str, Any]:
    """report.json's content; ``node``: the run on node 0 alone, where there was one."""
    speedup = base.train_s / ddp.train_s if ddp.train_s > 0 else float("nan")
    runs = [base, *([node] if node is not None else []), ddp]
    differences_ = differences(base, ddp)
    if node is not None:
        differences_ += [f"{d} (node 0 alone)" for d in differences(base, node)
                         if d not in differences_]
    return {
        "baseline": _public(base), "ddp": _public(ddp),
        **({"node": _public(node)} if node is not None else {}),
        "speedup": speedup,
        "throughput_ratio": ddp.samples_per_s / base.samples_per_s if base.samples_per_s else None,
        # per device: a DataParallel baseline already drives several
        "scaling_efficiency": speedup * base.devices / ddp.devices,
        "same_samples": all(run.samples == base.samples for run in runs),
        "differences": differences_,
        "scaling": [scaling_row(base, run) for run in runs],
    }


def scaling_row(base: RunSummary, run: RunSummary) -> dict[str, Any]:
    """One run against the baseline; its step split into data, compute and exposed
    all-reduce wait (None where not measured), in seconds and as shares."""
    speedup = base.train_s / run.train_s if run.train_s > 0 else float("nan")
    allreduce = run.avg_allreduce_s
    compute = run.avg_compute_s - (allreduce or 0.0)
    step = run.avg_batch_s or float("nan")
    return {"label": run.label, "title": run.title, "run_id": run.run_id,
            "world_size": run.world_size, "nodes": run.nodes, "devices": run.devices,
            "speedup": speedup, "efficiency": speedup * base.devices / run.devices,
            "data_s": run.avg_data_s, "compute_s": compute, "allreduce_s": allreduce,
            "data_share": run.avg_data_s / step, "compute_share": compute / step,
            "allreduce_share": None if allreduce is None else allreduce / step}


def _public(run: RunSummary) -> dict[str, Any]:
    out = dataclasses.asdict(run)
    out["loss_curve"] = [list(p) for p in run.loss_curve]
    out["arguments"] = dict(run.arguments)
    out["title"], out["devices"] = run.title, run.devices
    return out


_ROWS = (("world size", "world_size", "{:d}"), ("learning rate", "lr", "{:g}"),
         ("global batch", "global_batch", "{:d}"), ("data", "data", "{}"),
         ("training time (s)", "train_s", "{:.2f}"),
         ("total time (s)", "total_s", "{:.2f}"), ("avg batch time (s)", "avg_batch_s", "{:.4f}"),
         ("  data (s)", "avg_data_s", "{:.4f}"), ("  compute+sync (s)", "avg_compute_s", "{:.4f}"),
         ("    of it the all-reduce's wait (s)", "avg_allreduce_s", "{:.4f}"),
         ("throughput (samples/s)", "samples_per_s", "{:.1f}"), ("steps", "steps", "{:d}"),
         ("samples", "samples", "{:d}"), ("final loss (last epoch's mean)", "final_loss", "{:.4f}"),
         ("accuracy", "accuracy", "{:.4f}"))


def runs_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's runs in order of size: baseline, node 0 alone (if run), DDP."""
    return [report["baseline"], *([report["node"]] if report.get("node") else []),
            report["ddp"]]


def render_table(report: dict[str, Any]) -> str:
    """The runs side by side, the scaling table, then the notes."""
    table, scaling, notes = _parts(report)
    return f"{table}\n\n{scaling}\n\n" + "\n".join(notes) + "\n"


def _parts(report: dict[str, Any]) -> tuple[str, str, list[str]]:
    runs = runs_of(report)
    lines = ["| metric | " + " | ".join(run.get("title", run["label"]) for run in runs) + " |",
             "| --- |" + " ---: |" * len(runs)]
    for title, key, fmt in _ROWS:
        cells = ["-" if run.get(key) is None else fmt.format(run[key]) for run in runs]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    base, ddp = report["baseline"], report["ddp"]
    if base.get("dp_gpus"):
        scale = (f"DDP on {ddp['world_size']} processes vs DataParallel on {base['dp_gpus']} "
                 f"GPUs, efficiency per device {report['scaling_efficiency']:.0%}")
    else:
        scale = (f"scaling efficiency {report['scaling_efficiency']:.0%} on "
                 f"{ddp['world_size']} processes")
    notes = [f"speed-up: **{report['speedup']:.2f}x**, throughput ratio "
             f"{report['throughput_ratio']:.2f}x, {scale}"]
    for row in report.get("scaling", ())[1:-1]:
        notes.append(f"on node 0 alone: speed-up {row['speedup']:.2f}x, scaling efficiency "
                     f"{row['efficiency']:.0%} on {row['world_size']} processes")
    for run in runs:
        if run.get("data_source"):
            notes.append(f"data of {run.get('title', run['label'])}: {run['data_source']}")
    for difference in report.get("differences", ()):
        notes.append(f"warning: the sides differ in {difference}")
    if not report["same_samples"]:
        notes.append("warning: the runs did not process the same number of samples")
    return "\n".join(lines), render_scaling(report), notes


def render_scaling(report: dict[str, Any]) -> str:
    lines = ["| run | world size | nodes | speed-up | efficiency | data | compute | all-reduce |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in report.get("scaling", ()):
        shares = ["-" if row.get(k) is None else f"{row[k]:.0%}"
                  for k in ("data_share", "compute_share", "allreduce_share")]
        lines.append(f"| {row['title']} | {row['world_size']} | {row['nodes']} | "
                     f"{row['speedup']:.2f}x | {row['efficiency']:.0%} | " + " | ".join(shares)
                     + " |")
    return "\n".join(lines)


def render_markdown(report: dict[str, Any], plots: list[str]) -> str:
    runs = runs_of(report)
    same = ("Same workload arguments, learning rate and data, so the same global batch and "
            "the same samples" if not report.get("differences") else
            "**The sides differ** (the warnings below the table say how), so their losses "
            "and accuracies are not one learning problem")
    ids = ", ".join(f"{run.get('title', run['label'])} `{run['run_id']}`" for run in runs)
    head = ["# DDP scaling report", "",
            f"Runs: {ids}. {same}; time is the training loop's, per-step figures are averages "
            "over all steps; the all-reduce is the step's wait for it after its own backward "
            "(what overlapping it with the backward did not hide).", "", ""]
    table, scaling, notes = _parts(report)
    notes_md = "".join(f"- {line}\n" for line in notes)  # one item each
    images = [f"![{name}]({name})" for name in plots]
    return ("\n".join(head) + table + "\n\n" + scaling + "\n\n" + notes_md
            + ("\n" + "\n\n".join(images) + "\n" if images else ""))


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
        fh.write("\n")


def write_report(report: dict[str, Any], directory: str) -> tuple[list[str], str]:
    """report.json, the plots and report.md; returns (plot names, a note)."""
    import os

    write_json(os.path.join(directory, "report.json"), report)
    try:
        from .plots import write_plots

        plots, note = write_plots(report, runs_of(report), directory), ""
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "matplotlib":
            raise
        node = report.get("node")
        plots, note = [], missing_matplotlib(report["baseline"]["run_id"], report["ddp"]["run_id"],
                                             node["run_id"] if node else None)
    with open(os.path.join(directory, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(render_markdown(report, plots))
    return plots, note


def missing_matplotlib(baseline_run: str, ddp_run: str, node_run: str | None = None) -> str:
    """What to do without matplotlib: install it, then plot these runs without training again."""
    return ("matplotlib is not installed, so the report has no plots; install it into the "
            f"Python running ddp-orch with `{sys.executable} -m pip install "
            f"'{_report_requirement()}'` (or, in a checkout of ddp-orch, pip install -e "
            f"'.[report]'), then `ddp-orch compare --baseline-run {baseline_run} "
            + (f"--node-run {node_run} " if node_run else "")
            + f"--ddp-run {ddp_run}` draws them from these runs without training again")


def _report_requirement() -> str:
    """The ``report`` extra's matplotlib requirement, from installed metadata if any."""
    try:
        from importlib.metadata import PackageNotFoundError, requires

        for req in requires("ddp-orch") or ():
            if req.startswith("matplotlib") and 'extra == "report"' in req:
                return req.split(";")[0].strip()
    except (ImportError, PackageNotFoundError):
        pass
    return "matplotlib>=3.7"
