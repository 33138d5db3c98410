"""PNG plots for ``ddp-orch compare``. matplotlib is an optional extra, imported
only here; without it, compare still writes report.md and report.json."""

from __future__ import annotations

import os
from typing import Any

COLORS = ("#4C72B0", "#DD8452", "#937860")


def write_plots(report: dict[str, Any], runs: list[dict[str, Any]],
                directory: str) -> list[str]:
    """Write the figures into ``directory``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    ddp = report["ddp"]
    rows = report.get("scaling") or []
    labels = [_label(run) for run in runs]
    colors = [COLORS[i % len(COLORS)] for i in range(len(runs))]
    names = []

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.bar(labels, [run["train_s"] for run in runs], color=colors)
    left.set_title(f"training time (speed-up {report['speedup']:.2f}x)")
    left.set_ylabel("seconds")
    right.bar(labels, [run["samples_per_s"] for run in runs], color=colors)
    right.set_title("throughput")
    right.set_ylabel("samples / s")
    names.append(_save(fig, directory, "time_and_throughput.png"))

    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(runs) + 2), 3.6))
    data = [run["avg_data_s"] for run in runs]
    allreduce = [run.get("avg_allreduce_s") or 0.0 for run in runs]
    compute = [run["avg_compute_s"] - a for run, a in zip(runs, allreduce)]
    ax.bar(labels, data, label="data loading", color="#55A868")
    ax.bar(labels, compute, bottom=data, label="compute", color="#C44E52")
    ax.bar(labels, allreduce, bottom=[d + c for d, c in zip(data, compute)],
           label="all-reduce (exposed)", color="#8172B2")
    ax.set_ylabel("seconds per step")
    ax.set_title("average time per step")
    ax.legend()
    names.append(_save(fig, directory, "time_breakdown.png"))

    if rows:  # seed 001's result: speed-up and efficiency against the devices
        fig, ax = plt.subplots(figsize=(6, 3.6))
        devices = [row["devices"] for row in rows]
        ax.plot(devices, [row["speedup"] for row in rows], "o-", color=COLORS[0],
                label="speed-up")
        ax.plot(devices, devices, ":", color="grey", label="ideal")
        ax.set_xlabel("devices (world size)")
        ax.set_ylabel("speed-up over 1")
        eff = ax.twinx()
        eff.plot(devices, [100 * row["efficiency"] for row in rows], "s--", color=COLORS[1],
                 label="efficiency")
        eff.set_ylabel("efficiency (%)")
        eff.set_ylim(0, max(110, 10 + max(100 * row["efficiency"] for row in rows)))
        ax.set_xticks(devices)
        ax.set_title("scaling")
        handles = ax.get_legend_handles_labels()
        more = eff.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper left")
        names.append(_save(fig, directory, "scaling.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for run, label, color in zip(runs, labels, colors):
        if run["loss_curve"]:
            steps, losses = zip(*run["loss_curve"])
            ax.plot(steps, losses, label=label, color=color)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title("loss")
    ax.legend()
    names.append(_save(fig, directory, "loss_curves.png"))

    ranks = ddp.get("rank_step_times") or []
    if ranks:  # stragglers: each rank's mean step time, p95 as a whisker
        fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(ranks) + 2), 3.6))
        means = [r["mean_s"] * 1000 for r in ranks]
        p95 = [max(0.0, r["p95_s"] * 1000 - m) for r, m in zip(ranks, means)]
        slowest = max(range(len(ranks)), key=lambda i: means[i])
        colors = [COLORS[1] if i == slowest else COLORS[0] for i in range(len(ranks))]
        ax.bar([f"{r['rank']}\nn{r['node_rank']}" for r in ranks], means, color=colors,
               yerr=[[0] * len(ranks), p95], capsize=3)
        ax.set_xlabel("rank (node)")
        ax.set_ylabel("ms per step (mean; whisker: p95)")
        ax.set_title(f"step time per rank (slowest: rank {ranks[slowest]['rank']})")
        names.append(_save(fig, directory, "rank_step_times.png"))
    return names


def _label(run: dict[str, Any]) -> str:
    if run["label"] == "baseline":
        return "1 process"
    where = "node 0" if run["label"] == "node" else "DDP"
    return f"{where} x{run['world_size']}"


def _save(fig: Any, directory: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
