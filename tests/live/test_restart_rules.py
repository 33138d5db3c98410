"""Which failures `--max-restarts` restarts, live on the SSH lab
(docs/long-runs.md): none for a usage error (exit 2) before the first step.
The other cases share their runs with the kept-run suite, in
tests/live/test_long_runs.py: no restart once a node's keeper is lost, even
with restarts left
(test_a_sigkilled_keeper_ends_a_detached_run_everywhere_with_restarts_left_unused),
a restart for an ImportError after the first step, which may depend on the
data (test_max_restarts_restarts_an_import_error_after_the_first_step_until_an_attempt_succeeds),
none for one before it (test_an_import_error_is_not_restarted); there too,
the built-in workloads resuming from their checkpoints. The rule itself:
orchestrator/agent/kept/restarts.py (unit tests: tests/unit/agent/test_kept.py)."""

from __future__ import annotations

import pytest

from labhome import lab_job
from procscan import wait_gone
from test_long_runs import ONE_EACH, up  # the kept-run suite's own helpers

pytestmark = pytest.mark.live


def test_a_usage_error_before_the_first_step_is_not_restarted(ssh_lab, tmp_path):
    env, cluster = lab_job(ssh_lab, tmp_path, "usage", "steps.py", ONE_EACH,
                           args="{no-such-flag: 1}")
    done = up(env, tmp_path, cluster, "usage", "--max-restarts", "2")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "failed: exitcode 2: steps.py: error: unrecognized arguments: --no-such-flag 1" in out
    assert "attempts: 1" in out, out
    assert "exited with a usage error (exit 2) before the first step, which a restart meets " \
           "again" in out
    assert wait_gone("usage", 15, labs=[ssh_lab]) == set()
