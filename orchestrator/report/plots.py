"""PNG plots for ``ddp-orch compare`` (matplotlib, imported only here).

matplotlib is an optional extra (``pip install 'ddp-orch[report]'``); when
it is missing, compare still writes report.md and report.json and says so.
"""

from __future__ import annotations

import os
from typing import Any

COLORS = ("#4C72B0", "#DD8452")


def write_plots(report: dict[str, Any], directory: str) -> list[str]:
    """Write the three figures into ``directory``; returns their file names."""
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
    return names


def _save(fig: Any, directory: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(directory, name), dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
