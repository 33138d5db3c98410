"""A run's life on the controller, top to bottom: ``prepare`` takes the spec to its
backend, plan, refusals and dry-run, once; ``launch`` runs that very ``DryRun`` and
records the run only then, so refused input leaves no run behind; how it ended is
recorded whatever happens (a launch that raises: with its error)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from ..backends import choose
from ..backends.base import LaunchBackend
from ..engine.options import LaunchOptions
from ..config.spec import ClusterSpec
from ..console import Console
from ..errors import LaunchError, OrchestratorError
from ..plan.dryrun import DryRun
from ..plan.render import dryrun_to_dict
from ..records.rundir import RunDir, new_run_id
from ..report.gpus import rank_lines
from .refusals import refuse, refuse_resolved

if TYPE_CHECKING:
    from ..engine.run import RunHandle
    from ..records.outcome import RunOutcome


def prepare(spec: ClusterSpec, options: LaunchOptions, *, run_id: str, local_run_dir: str,
            backend: str | None = None) -> tuple[LaunchBackend, DryRun]:
    """The backend that runs ``spec`` (``backend`` over the file's) and its dry-run;
    ``ConfigError`` for what the launch would refuse."""
    chosen = choose(spec, options, backend)
    spec = chosen.require_spec()
    plan = chosen.plan(run_id, local_run_dir)
    refuse(spec, plan, options)
    info = chosen.dryrun(plan)
    return chosen, dataclasses.replace(info, notes=(*spec.all_warnings, *info.notes))


def up(spec: ClusterSpec, *, runs_dir: str, console: Console,
       options: LaunchOptions = LaunchOptions(),
       run_id: str | None = None) -> tuple[RunOutcome, RunDir]:
    """Prepare and launch ``spec``: the runs a command derives from its own
    (``compare``'s, the collective smoke test)."""
    run_id = run_id or new_run_id(spec.name)
    backend, info = prepare(spec, options, run_id=run_id,
                            local_run_dir=run_dir_of(runs_dir, run_id))
    return launch(backend, info, runs_dir=runs_dir, console=console)


def run_dir_of(runs_dir: str, run_id: str) -> str:
    """Where a launched run's records go: absolute, as the nodes' commands name it."""
    return os.path.abspath(os.path.join(runs_dir, run_id))


def launch(backend: LaunchBackend, info: DryRun, *, runs_dir: str,
           console: Console) -> tuple[RunOutcome, RunDir]:
    """Launch the dry-run ``prepare`` made and return how it ended, with its run directory."""
    # the engine and the records: for a launch, not a dry-run
    from ..engine.run import node_records
    from ..plan.secrets import stored_cluster_file
    from ..records.outcome import RunState
    from ..records.store import write_state

    spec, options, run_id = backend.require_spec(), backend.options, info.plan.run_id
    for warning in spec.all_warnings:
        console.info(warning)
    try:
        run = RunDir.create(runs_dir, run_id)
        run.write_text("cluster.yaml", stored_cluster_file(spec))
    except OSError as exc:
        raise unwritable(runs_dir, exc) from None
    nodes = node_records(info)
    started = time.time()
    running_since = None  # once every node runs: the wait for them is over

    def record(state: RunState, outcome: RunOutcome | None = None, error: str = "") -> None:
        """Into state.json; a full runs directory does not stop the run or hide its end."""
        try:
            write_state(run, run_id=info.plan.run_id, backend=backend.name, state=state,
                        started=started, nodes=nodes, outcome=outcome, owner=info.owner,
                        error=error, running_since=running_since)
        except OSError as exc:
            console.always(f"ddp-orch: could not record the run as {state} in "
                           f"{run.state_file()}: {exc.strerror or exc}")

    def on_running(handle: RunHandle) -> None:  # the job id, then the resolved run
        nonlocal nodes, running_since
        if handle.dryrun.plan.resolved and not info.plan.world_size_known:
            # The nodes chose their GPUs: the world size is known only now, and
            # a built-in's rules on it are checked before any rank starts.
            refuse_resolved(spec, handle.dryrun.plan, options)
        planned = dryrun_to_dict(handle.dryrun)
        run.write_plan(planned)
        nodes = handle.records
        if not handle.pending:
            running_since = time.time()
        # a scheduler's job waits in its queue for nodes first (``RunHandle.pending``)
        record(RunState.PENDING if handle.pending else RunState.RUNNING)
        if not handle.pending:  # where every rank went, once, in every view
            for line in rank_lines(planned):
                console.milestone(line)

    record(RunState.STARTING)
    outcome = None
    final = RunState.FAILED
    error = ""  # why there is no outcome: kept for `status` and `ps`
    try:
        outcome = backend.launch(info, run, console, on_running)
        final = outcome.state
        return outcome, run
    except KeyboardInterrupt:
        final = RunState.INTERRUPTED  # before the nodes started: nothing to tear down
        error = "interrupted (Ctrl-C or a signal) before the run started"
        raise
    except OrchestratorError as exc:  # a busy port, the upload cap, a node out of reach
        error = str(exc)
        raise
    except OSError as exc:  # the run directory's records (plan.json, the bundle), full
        failure = unwritable(run.path, exc)
        error = str(failure)
        raise failure from None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        record(final, outcome, error if outcome is None else "")


def unwritable(where: str, exc: OSError) -> LaunchError:
    """The launch's refusal when this machine cannot write the run's records."""
    return LaunchError(f"cannot write the run's records in {os.path.abspath(where)}: "
                       f"{exc.strerror or exc}; free space there, or choose another runs "
                       "directory (--runs-dir)")
