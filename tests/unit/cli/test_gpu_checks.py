"""``scripts/gpu-checks --self-check``: the GPU checks cannot run here, but
their plan can be read. Which steps each GPU count runs, and every cluster
file a step writes, for 1, 2, 4 and 8 GPUs, loaded and planned by the real
loader with the world size the step expects."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def test_the_gpu_checks_plan_every_gpu_count_with_layouts_the_loader_takes():
    ran = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu-checks"),
                          "--self-check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    counts = {int(line.split()[0]): line for line in lines if "GPU(s):" in line}
    steps = [int(counts[n].split(": ")[1].split()[0]) for n in (1, 2, 4, 8)]
    # more GPUs, more steps: free:N, DataParallel, NCCL pairs, the hang from 2; 3+4 from 7
    assert steps[0] < steps[1] == steps[2] < steps[3], lines
    assert lines[-1] == "self-check: 22 layouts, 0 problem(s)", lines
