"""The built-in workloads on a node with torch alone, as the README promises.

A ``sitecustomize`` on every process's path blocks ``import numpy`` (torch
then runs as it does without numpy: ``.numpy()`` and
``all_gather_object`` raise "Numpy is not available"), and each workload
runs under torchrun with 2 CPU processes, to its result.
"""

from __future__ import annotations

import pytest

from wl_support import ROOT, check_complete, run_torchrun

pytestmark = pytest.mark.live

NO_NUMPY = ("import sys\n"
            "sys.modules['numpy'] = None  # `import numpy` raises ImportError\n")


@pytest.mark.parametrize("workload, args", [
    ("linear", ("--epochs", "1", "--samples", "256")),
    ("toy", ("--epochs", "1")),
    ("mnist", ("--epochs", "1", "--max-steps", "2")),
])
def test_a_builtin_workload_runs_without_numpy(tmp_path, workload, args):
    blocker = tmp_path / "no-numpy"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_NUMPY)
    run = run_torchrun(tmp_path, workload, *args,
                       env_extra={"PYTHONPATH": f"{blocker}:{ROOT}"})
    assert "Numpy is not available" not in run.stderr, run.stderr[-3000:]
    check_complete(run.check(), workload, 2)
