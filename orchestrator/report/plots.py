"""PNG plots for ``ddp-orch compare`` (matplotlib, imported only here).

matplotlib is an optional extra (``pip install 'ddp-orch[report]'``); when
it is missing, compare still writes report.md and report.json and says so.
"""

from __future__ import annotations

import os
from typing import Any

COLORS = ("#4C72B0", "#DD8452")


def write_plots(report: dict[str, Any], directory: str) -> list[str]:
    """Write the figures into ``directory`` (three, and the per-rank step times
    when the DDP run reported them); returns their file names."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    base, ddp = report["baseline"], report["ddp"]
    labels = ["1 process", f"DDP x{ddp['world_size']}"]
    names = []

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.bar(labels, [base["train_s"], ddp["train_s"]], color=COLORS)
    left.set_title(f"training time (speed-up {report['speedup']:.2f}x)")
    left.set_ylabel("seconds")
    right.bar(labels, [base["samples_per_s"], ddp["samples_per_s"]], color=COLORS)
    right.set_title("throughput")
    right.set_ylabel("samples / s")
    names.append(_save(fig, directory, "time_and_throughput.png"))

    fig, ax = plt.subplots(figsize=(5, 3.6))
    data = [base["avg_data_s"], ddp["avg_data_s"]]
    compute = [base["avg_compute_s"], ddp["avg_compute_s"]]
    ax.bar(labels, data, label="data loading", color="#55A868")
    ax.bar(labels, compute, bottom=data, label="compute + sync", color="#C44E52")
    ax.set_ylabel("seconds per step")
    ax.set_title("average time per step")
    ax.legend()
    names.append(_save(fig, directory, "time_breakdown.png"))

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for run, label, color in ((base, labels[0], COLORS[0]), (ddp, labels[1], COLORS[1])):
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


def _save(fig: Any, directory: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
