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


def test_a_restart_resumes_from_its_checkpoint_without_numpy(tmp_path):
    """The checkpoint travels from rank 0 to the others (and rank 0 says
    whether there is one): no ``broadcast_object_list``, which needs numpy.
    The second run is a gang restart, as ``up --max-restarts`` makes it."""
    blocker = tmp_path / "no-numpy"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_NUMPY)
    common = ("--data", "synthetic", "--train-samples", "32", "--test-samples", "8",
              "--global-batch-size", "8", "--num-workers", "0")
    env = {"PYTHONPATH": f"{blocker}:{ROOT}", "DDP_ORCH_MAX_RESTARTS": "1"}
    first = run_torchrun(tmp_path, "mnist", *common, "--epochs", "1", name="first",
                         env_extra=env)
    check_complete(first.check(), "mnist", 2)
    assert (tmp_path / "checkpoint.pt").exists()  # the default of a run that may restart
    again = run_torchrun(tmp_path, "mnist", *common, "--epochs", "2", name="again",
                         env_extra={**env, "DDP_ORCH_RESTART_COUNT": "1"})
    assert "Numpy is not available" not in again.stderr, again.stderr[-3000:]
    result = again.check()
    check_complete(result, "mnist", 2)
    assert result["resumed"] and result["metrics"]["start_epoch"] == 1
    assert "resuming from checkpoint.pt (epoch 1, step 4)" in again.stdout
