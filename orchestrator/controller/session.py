"""A run's life on the controller: spec -> plan -> backend -> record.

``prepare`` is what ``--dry-run`` shows: the backend's ``DryRun`` of the
plan, built with no I/O. ``up`` runs that same object: it creates the run
directory, records the run, hands the dry-run to the backend's ``launch``
and records how it ended, whatever happens. Nothing here knows which
backend it holds.
"""

from __future__ import annotations

import os
import time

from ..backends import backend_for
from ..backends.base import LaunchBackend, LaunchOptions
from ..config.spec import ClusterSpec
from ..console import Console
from ..plan.dryrun import DryRun
from ..plan.render import dryrun_to_dict
from ..plan.secrets import stored_cluster_file
from ..records.outcome import RunOutcome, RunState
from ..records.rundir import RunDir, new_run_id
from ..records.store import write_state


def prepare(spec: ClusterSpec, options: LaunchOptions, *, run_id: str,
            local_run_dir: str) -> tuple[LaunchBackend, DryRun]:
    """The backend for ``spec`` and its dry-run of the plan (no I/O)."""
    backend = backend_for(spec, options)
    return backend, backend.dryrun(backend.plan(run_id, local_run_dir))


def up(spec: ClusterSpec, *, runs_dir: str, console: Console,
       options: LaunchOptions = LaunchOptions(),
       run_id: str | None = None) -> tuple[RunOutcome, RunDir]:
    """Launch ``spec`` and return how it ended, with its run directory."""
    run = RunDir.create(runs_dir, run_id or new_run_id(spec.name))
    run.write_text("cluster.yaml", stored_cluster_file(spec))
    backend, info = prepare(spec, options, run_id=os.path.basename(run.path),
                            local_run_dir=run.path)
    nodes = backend.node_records(info.plan)
    started = time.time()

    rule = info.liveness  # attached, detached, or a scheduler's

    def record(state: RunState, outcome: RunOutcome | None = None) -> None:
        write_state(run, run_id=info.plan.run_id, backend=backend.name, state=state,
                    started=started, nodes=nodes, outcome=outcome, rule=rule)

    def on_running(resolved: DryRun) -> None:
        nonlocal nodes
        run.write_json("plan.json", dryrun_to_dict(resolved))
        nodes = backend.node_records(resolved.plan)
        record(RunState.RUNNING)

    record(RunState.STARTING)
    outcome = None
    final = RunState.FAILED
    try:
        outcome = backend.launch(info, run, console, on_running)
        final = outcome.state
        return outcome, run
    except KeyboardInterrupt:
        final = RunState.INTERRUPTED  # before the nodes started: nothing to tear down
        raise
    finally:
        record(final, outcome)
