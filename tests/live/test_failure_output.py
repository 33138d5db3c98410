"""A workload's error shows its root cause once per rank, not a wall of
tracebacks (issue 22): the worker shim prints a ``WorkloadError`` as one
line, the console folds torchrun's report of the failed ranks into one
line (the node's log keeps it), and the summary says which ranks failed
the same way. The pieces have unit tests beside their code
(``test_shim.py``, ``test_relay.py``, and the reason in
``test_nodehandle.py``); here, a real run.
"""

from __future__ import annotations

import glob
import os

import pytest

from conftest import run_cli


@pytest.mark.live
def test_a_workload_error_on_three_ranks_is_one_line_each_and_the_root_cause(tmp_path):
    """``--data real`` without the dataset: only the ranks can know (the data
    is read from each node's working directory)."""
    result = run_cli("up", "--local", "--workload", "mnist", "--procs", "3",
                     "--arg", "data=real", "--arg", "num_workers=0",
                     "--runs-dir", str(tmp_path))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    assert "Traceback" not in out and "ChildFailedError" not in out, out
    said = [line for line in lines if "WorkloadError: --data real: no MNIST" in line]
    ranks = [line for line in said if "[rank" in line]
    assert len(ranks) <= 3 and all(line.count("[rank") == 1 for line in ranks), out
    assert len(said) == len(ranks) + 2, out  # and the summary's detail and root cause
    root = next(line for line in lines if line.startswith("root cause: "))
    assert "failed: WorkloadError: --data real: no MNIST" in root
    assert "; the same on rank" in root or len(ranks) == 1, out  # the others may be stopped first
    assert "torchrun: its report of the failed ranks" in out
    assert len(lines) <= 25, f"{len(lines)} lines:\n{out}"  # 186 before
    log = glob.glob(os.path.join(str(tmp_path), "*", "node-0.log"))
    with open(log[0], encoding="utf-8") as fh:
        assert "ChildFailedError" in fh.read()  # the log keeps torchrun's report
