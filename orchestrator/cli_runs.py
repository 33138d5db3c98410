"""Commands about recorded runs: ``ps``, ``status``, ``logs``, ``down``."""

from __future__ import annotations

import sys
import time

import click

from .errors import ConfigError
from .records import find_run, list_runs, read_record, render_ps
from .runs import DEFAULT_RUNS_DIR, RunDir

runs_dir_option = click.option("--runs-dir", default=DEFAULT_RUNS_DIR, show_default=True,
                               type=click.Path(file_okay=False),
                               help="Where the local run directories are.")


@click.command()
@runs_dir_option
def ps(runs_dir: str) -> None:
    """List the runs recorded in the runs directory, newest first."""
    records = list(list_runs(runs_dir))
    if not records:
        click.echo(f"no runs in {runs_dir}")
        return
    click.echo(render_ps(records), nl=False)


@click.command()
@click.argument("run_id")
@runs_dir_option
def status(run_id: str, runs_dir: str) -> None:
    """Show one run: state, per-node outcomes, root cause and result."""
    record = find_run(runs_dir, run_id)
    click.echo(render_ps([record]), nl=False)
    state = record.run.read_json("state.json") or {}
    for outcome in state.get("outcomes") or []:
        click.echo(f"  node {outcome['node_rank']} ({outcome['host']}): {outcome['state']}, "
                   f"exit {outcome['exit_code']}: {outcome['reason']}")
    root = state.get("root_cause")
    if root:
        click.echo(f"root cause: node {root['node_rank']} ({root['host']}): {root['reason']}")
    result = record.run.read_json("result.json")
    if isinstance(result, dict):
        click.echo(f"result: {record.run.file('result.json')}")
        for key, value in (result.get("metrics") or {}).items():
            click.echo(f"  {key} = {value}")
    click.echo(f"run directory: {record.run.path}")


@click.command()
@click.argument("run_id")
@click.option("--node", "node_rank", type=int, help="Only this node's log.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing while the run is live.")
@runs_dir_option
def logs(run_id: str, node_rank: int | None, follow: bool, runs_dir: str) -> None:
    """Print a run's stored node logs (prefixed by node when there are several)."""
    record = find_run(runs_dir, run_id)
    nodes = list(range(len(record.hosts)))
    if node_rank is not None:
        if node_rank not in nodes:
            raise ConfigError(f"run {record.run_id} has nodes {nodes}, not {node_rank}",
                              path="--node", source="command line")
        nodes = [node_rank]
    _print_logs(record.run, nodes, follow)


def _print_logs(run: RunDir, nodes: list[int], follow: bool) -> None:
    offsets = {k: 0 for k in nodes}
    pending = {k: b"" for k in nodes}
    out = sys.stdout.buffer
    while True:
        grew = False
        for k in nodes:
            try:
                with open(run.node_log(k), "rb") as fh:
                    fh.seek(offsets[k])
                    data = fh.read()
            except FileNotFoundError:
                continue
            offsets[k] += len(data)
            grew = grew or bool(data)
            *lines, pending[k] = (pending[k] + data).split(b"\n")
            for line in lines:
                out.write((f"[node{k}] ".encode() if len(nodes) > 1 else b"") + line + b"\n")
        out.flush()
        record = read_record(run)
        if not follow or (not grew and (record is None or not record.live)):
            break
        time.sleep(0.2)
    for k in nodes:
        if pending[k]:
            out.write((f"[node{k}] ".encode() if len(nodes) > 1 else b"") + pending[k] + b"\n")
    out.flush()


@click.command()
@click.argument("run_id")
@click.option("--grace", default=5.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds between SIGTERM and SIGKILL on the nodes.")
@runs_dir_option
def down(run_id: str, grace: float, runs_dir: str) -> None:
    """End whatever of RUN_ID still runs, on every node, using its records."""
    from .down import down as run_down, render_down

    record = find_run(runs_dir, run_id)
    stopped, nodes = run_down(record, grace)
    click.echo(render_down(record, stopped, nodes), nl=False)
    sys.exit(1 if any(n.error for n in nodes) else 0)
