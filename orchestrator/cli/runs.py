"""Commands about recorded runs: ``ps``, ``status``, ``logs``, ``down``, ``stacks``."""

from __future__ import annotations

import sys
import time

import click

from ..agent.protocol import LineBuffer
from ..errors import ConfigError
from ..records.rundir import DEFAULT_RUNS_DIR, RunDir
from ..records.store import find_run, list_runs, read_record
from ..report.runs import render_ps

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
    from ..backends import get_backend
    from ..backends.base import LaunchOptions
    from ..report.runs import render_status

    record = find_run(runs_dir, run_id)
    described = get_backend(record.backend, LaunchOptions()).describe(record)
    click.echo(render_status(record, described), nl=False)


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
    buffers = {k: LineBuffer() for k in nodes}
    heads = {k: f"[node{k}] ".encode() if len(nodes) > 1 else b"" for k in nodes}
    out = sys.stdout.buffer

    def emit(k: int, block: bytes) -> None:
        if block:
            lines = block[:-1] if block.endswith(b"\n") else block
            out.write(heads[k] + lines.replace(b"\n", b"\n" + heads[k]) + b"\n")

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
            emit(k, buffers[k].feed(data))
        out.flush()
        record = read_record(run)
        if not follow or (not grew and (record is None or not record.live)):
            break
        time.sleep(0.2)
    for k in nodes:
        emit(k, buffers[k].flush())
    out.flush()


@click.command()
@click.argument("run_id")
@click.option("--grace", default=5.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds between SIGTERM and SIGKILL on the nodes.")
@runs_dir_option
def down(run_id: str, grace: float, runs_dir: str) -> None:
    """End whatever of RUN_ID still runs, on every node, using its records."""
    from ..controller.down import down as run_down
    from ..report.runs import render_down

    record = find_run(runs_dir, run_id)
    stopped, nodes = run_down(record, grace,
                              note=lambda text: click.echo(f"ddp-orch down: {text}", err=True))
    click.echo(render_down(record, stopped, nodes), nl=False)
    sys.exit(1 if any(n.error or n.survivors for n in nodes) else 0)


@click.command()
@click.argument("run_id")
@click.option("--native", is_flag=True, help="With py-spy on the nodes: C/C++ frames too.")
@click.option("--json", "as_json", is_flag=True, help="The raw per-rank stacks as JSON.")
@runs_dir_option
def stacks(run_id: str, native: bool, as_json: bool, runs_dir: str) -> None:
    """Dump the Python stack of every rank of a live run, on every node at once.

    Uses py-spy where a node has it on its PATH, else the worker shim's
    faulthandler. Ranks are grouped by where their main thread is; ranks
    outside the largest group are marked with `!`. Every dump is kept in
    the run directory under stacks/<time>/.
    """
    import dataclasses
    import json

    from ..backends import get_backend
    from ..backends.base import LaunchOptions
    from ..report.stacks import keep

    record = find_run(runs_dir, run_id)
    if not record.state.live:
        raise ConfigError(f"run {record.run_id} is {record.state}: no rank is running",
                          hint="stacks are dumped from a live run; see `ddp-orch status`")
    result = get_backend(record.backend, LaunchOptions()).stacks(record, native=native)
    saved, text = keep(record.run.path, result, record.run_id)
    if as_json:
        click.echo(json.dumps({"run_id": record.run_id, "saved_in": saved,
                               "ranks": [dataclasses.asdict(s) for s in result.ranks],
                               "unreachable": [list(u) for u in result.unreachable]}, indent=2))
    else:
        click.echo(text, nl=False)
    if result.unreachable or not result.ranks:
        sys.exit(1)
