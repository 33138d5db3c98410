"""Commands about recorded runs: ``ps``, ``status``, ``logs``, ``down``, ``stacks``,
``attach``, ``prune``, ``top``."""

from __future__ import annotations

import json
import sys
import time

import click

from ..agent.wire.protocol import LineBuffer
from ..console import visible
from ..errors import ConfigError
from ..records.rundir import RunDir
from ..records.runsdir import locate
from ..records.store import (find_run, kept_without_controller, latest_run, list_runs,
                             read_record)
from ..report.runs import render_ps
from .options import runs_dir_option

json_option = click.option("--json", "as_json", is_flag=True,
                           help="As JSON, for scripts (schema/ps.schema.json, "
                                "schema/status.schema.json).")
# RUN_ID, a unique prefix of one; without it the latest run (``the_run``).
latest_run_argument = click.argument("run_id", required=False)


def the_run(runs_dir: str | None, run_id: str | None, *, attachable: bool = False):
    """The run a command names, or without a name the latest one, as
    ``sky logs`` and ``docker logs $(docker ps -lq)`` habits expect; for
    ``attach`` the latest one it can follow. Which one was taken is said on
    stderr, so a script's stdout stays the command's own."""
    where = locate(runs_dir)
    if run_id is not None:
        return find_run(where.path, run_id)
    if attachable:
        record = latest_run(where.path, lambda r: r.owner.detached
                            or kept_without_controller(r), "detached run")
    else:
        record = latest_run(where.path)
    click.echo(f"ddp-orch: run {record.run_id}, the latest{' detached' if attachable else ''} "
               f"in {where.shown}", err=True)
    return record


@click.command()
@runs_dir_option
@json_option
def ps(runs_dir: str | None, as_json: bool) -> None:
    """List the runs recorded in the runs directory, newest first, and say
    which runs directory that is."""
    where = locate(runs_dir)
    records = [_settled(r) if kept_without_controller(r) else r
               for r in list_runs(where.path)]
    if as_json:
        from ..report.runsjson import ps_json

        click.echo(json.dumps(ps_json(records, where), indent=2))
    elif not records:
        click.echo(f"no runs in {where.shown} ({where.source})")
    else:
        click.echo(visible(render_ps(records, where)), nl=False)


def _described(record):
    from ..backends import backend_of
    from ..engine.options import LaunchOptions

    return backend_of(record, LaunchOptions()).describe(record)


def _settled(record, described=None):
    """A run kept without its controller (``kept_without_controller``: a
    detached run, a Slurm job whose controller is gone) as its nodes or its
    scheduler say it is now; once they say it is over, that is recorded in
    ``state.json``, so they are asked only once."""
    from ..errors import OrchestratorError
    from ..records.outcome import RunOutcome
    from ..records.store import record_end

    try:
        described = described or _described(record)
    except OrchestratorError:
        return record
    if described.state.live:
        return record
    record_end(record, RunOutcome(record.run_id, described.state,
                                  _since_start(record, described.ended), described.nodes,
                                  described.root_cause, None, described.attempts),
               ended=described.ended, results_home=False)
    return read_record(record.run) or record


def _since_start(record, until: float | None = None) -> float:
    """A recorded run's own time, from when it started after its wait for
    its nodes, to ``until`` (default: now)."""
    since = record.running_since
    return max(0.0, (until or time.time()) - since) if since is not None else 0.0


def _run_end(record, backend) -> tuple[float | None, float]:
    """When a detached run that ``attach`` followed to its end ended, and how
    long it ran: as ``status`` or ``ps`` recorded it already, else as its
    nodes recorded it (``describe``: node 0's keeper, the Slurm agents),
    else (nodes silent) until now. Never the time until ``attach``."""
    from ..errors import OrchestratorError

    if not record.live and record.ended is not None and record.wall_s is not None:
        return record.ended, record.wall_s
    deadline = time.monotonic() + RECORD_END_WAIT_S
    ended = None
    try:
        while True:
            described = backend.describe(record)
            if not described.state.live or time.monotonic() > deadline:
                ended = described.ended
                break
            time.sleep(0.2)  # a node's end record may land just after its last line
    except OrchestratorError:
        pass
    return ended, _since_start(record, ended)


RECORD_END_WAIT_S = 5.0


@click.command()
@latest_run_argument
@runs_dir_option
@json_option
def status(run_id: str | None, runs_dir: str | None, as_json: bool) -> None:
    """Show one run (default: the latest): state, per-node outcomes, root
    cause and result.

    A detached run that ended while nobody followed it shows how it ended,
    from its nodes' records; `ddp-orch attach RUN` then brings its results
    home and prints the summary.
    """
    from ..report.runs import render_status

    record = the_run(runs_dir, run_id)
    described = _described(record)
    if kept_without_controller(record):
        record = _settled(record, described)
    if as_json:
        from ..report.runsjson import status_json

        click.echo(json.dumps(status_json(record, described), indent=2))
        return
    click.echo(visible(render_status(record, described)), nl=False)


@click.command()
@latest_run_argument
@click.option("--node", "node_rank", type=int, help="Only this node's log.")
@click.option("--rank", "rank", type=click.IntRange(0), help="Only this rank's lines.")
@click.option("--lines", "-n", "last", type=click.IntRange(0, 100000), default=None,
              help="Only the last N lines of each node (with --follow: then what comes).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing while the run is live.")
@runs_dir_option
def logs(run_id: str | None, node_rank: int | None, rank: int | None, last: int | None,
         follow: bool, runs_dir: str | None) -> None:
    """Print a run's stored node logs (default: the latest run), prefixed by
    node when there are several."""
    record = the_run(runs_dir, run_id)
    nodes = list(range(len(record.hosts)))
    if node_rank is not None and node_rank not in nodes:
        raise ConfigError(f"run {record.run_id} has nodes {nodes}, not {node_rank}",
                          path="--node", source="command line")
    if rank is not None:
        holder = _node_of_rank(record, rank)
        if node_rank is not None and node_rank != holder:
            raise ConfigError(f"rank {rank} of run {record.run_id} is on node {holder}, "
                              f"not node {node_rank}", path="--rank", source="command line",
                              hint="give --rank alone")
        node_rank = holder
    if follow and kept_without_controller(record):  # the nodes have the live log
        from ..backends import backend_of
        from ..engine.options import LaunchOptions
        from ..console import Console

        with Console("all", rank=rank) as console:
            backend_of(record, LaunchOptions()).attach(record, console, lines=last)
        return
    if kept_without_controller(record):
        click.echo(f"ddp-orch logs: run {record.run_id} goes on without its controller: "
                   f"these logs end where a controller last followed it; "
                   f"`ddp-orch logs {record.run_id} --follow` streams it from its nodes",
                   err=True)
    elif record.owner.detached and not record.results_home:
        click.echo(f"ddp-orch logs: run {record.run_id} ended on its nodes with no controller "
                   f"following it: these logs end where a controller last followed it; "
                   f"`ddp-orch attach {record.run_id}` brings the rest home, with its results",
                   err=True)
    _print_logs(record.run, nodes if node_rank is None else [node_rank], follow,
                rank=rank, last=last)
    _say_outputs(record.run)


def _node_of_rank(record, rank: int) -> int:
    """The node that runs global ``rank``, from the recorded plan's rank
    ranges (``[first, last]`` per node)."""
    plan = record.run.plan() or {}
    for node in plan.get("nodes") or ():
        first, final = (node.get("ranks") or (None, None))[:2]
        if isinstance(first, int) and isinstance(final, int) and first <= rank <= final:
            return int(node["node_rank"])
    world = plan.get("world_size")
    raise ConfigError(f"run {record.run_id} has no rank {rank}"
                      + (f" (ranks 0-{world - 1})" if isinstance(world, int) else ""),
                      path="--rank", source="command line")


def _say_outputs(run: RunDir) -> None:
    """Where a run's ``outputs:`` came home, on stderr (stdout is the log)."""
    from ..engine.results import outputs_lines

    for line in outputs_lines(run.outputs(), run.path):
        click.echo(f"ddp-orch logs: {visible(line.strip())}", err=True)


def _print_logs(run: RunDir, nodes: list[int], follow: bool, rank: int | None = None,
                last: int | None = None) -> None:
    """Each of ``nodes``' log as it is on disk (``follow``: and as it grows);
    with ``rank``, only that rank's lines (torchrun's ``[rankN]:`` prefix);
    with ``last``, from the last ``last`` lines (of that rank) of each."""
    offsets = {k: 0 for k in nodes}
    buffers = {k: LineBuffer() for k in nodes}
    heads = {k: f"[node{k}] ".encode() if len(nodes) > 1 else b"" for k in nodes}
    prefix = f"[rank{rank}]:".encode() if rank is not None else None
    out = sys.stdout.buffer
    tails: dict[int, int | None] = {k: last for k in nodes}  # None once the tail is out

    def emit(k: int, block: bytes) -> None:
        lines = block.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        if prefix is not None:
            lines = [line for line in lines if line.startswith(prefix)]
        if tails[k] is not None:  # the first block: only its last lines
            lines = lines[len(lines) - tails[k]:] if tails[k] else []
            tails[k] = None
        if lines:
            text = visible(b"\n".join(lines).decode("utf-8", "replace")).encode()
            out.write(heads[k] + text.replace(b"\n", b"\n" + heads[k]) + b"\n")

    while True:
        grew = False
        for k in nodes:
            try:
                with open(run.node_log(k), "rb") as fh:
                    fh.seek(offsets[k])
                    data = fh.read()
            except FileNotFoundError:
                data = b""
            offsets[k] += len(data)
            grew = grew or bool(data)
            block = buffers[k].feed(data)
            emit(k, block if follow else block + buffers[k].flush())
        out.flush()
        record = read_record(run)
        # A run kept without its controller (a Slurm job whose `up` was
        # killed) has nobody writing these logs any more.
        if not follow or (not grew and (record is None or not record.live
                                        or kept_without_controller(record))):
            break
        time.sleep(0.2)
    for k in nodes:
        emit(k, buffers[k].flush())
    out.flush()
    if follow and record is not None and kept_without_controller(record):
        click.echo(f"ddp-orch logs: run {record.run_id} goes on without its controller; "
                   f"`ddp-orch logs {record.run_id} --follow` streams it from its nodes",
                   err=True)


@click.command()
@click.argument("run_id")
@click.option("--grace", default=5.0, show_default=True, type=click.FloatRange(0, 600),
              help="Seconds between SIGTERM and SIGKILL on the nodes.")
@runs_dir_option
def down(run_id: str, grace: float, runs_dir: str | None) -> None:
    """End whatever of RUN_ID still runs, on every node, using its records."""
    from ..controller.down import down as run_down
    from ..report.runs import render_down

    record = find_run(locate(runs_dir).path, run_id)
    stopped, nodes = run_down(record, grace,
                              note=lambda text: click.echo(f"ddp-orch down: {text}", err=True))
    click.echo(visible(render_down(record, stopped, nodes)), nl=False)
    sys.exit(1 if any(n.error or n.survivors for n in nodes) else 0)


@click.command()
@click.argument("run_id")
@click.option("--native", is_flag=True, help="With py-spy on the nodes: C/C++ frames too.")
@click.option("--json", "as_json", is_flag=True, help="The raw per-rank stacks as JSON.")
@runs_dir_option
def stacks(run_id: str, native: bool, as_json: bool, runs_dir: str | None) -> None:
    """Dump the Python stack of every rank of a live run, on every node at once.

    Uses py-spy where a node has it on its PATH, else the worker shim's
    faulthandler. Ranks are grouped by where their main thread is; ranks
    outside the largest group are marked with `!`. Every dump is kept in
    the run directory under stacks/<time>/.
    """
    import dataclasses
    import json

    from ..backends import backend_of
    from ..engine.options import LaunchOptions
    from ..engine.stacks import save_stacks

    record = find_run(locate(runs_dir).path, run_id)
    if not record.state.live:
        raise ConfigError(f"run {record.run_id} is {record.state}: no rank is running",
                          hint="stacks are dumped from a live run; see `ddp-orch status`")
    result = backend_of(record, LaunchOptions()).stacks(record, native=native)
    saved, text = save_stacks(record.run.path, result, record.run_id)
    if as_json:
        click.echo(json.dumps({"run_id": record.run_id, "saved_in": saved,
                               "ranks": [dataclasses.asdict(s) for s in result.ranks],
                               "unreachable": [list(u) for u in result.unreachable]}, indent=2))
    else:
        click.echo(visible(text), nl=False)
    if result.unreachable or not result.ranks:
        sys.exit(1)


@click.command()
@latest_run_argument
@click.option("--from-start", is_flag=True,
              help="Stream each node's output from its start (the default).")
@click.option("--lines", "-n", type=click.IntRange(0, 100000), default=None,
              help="Start from the last N lines of each node instead.")
@click.option("--rank0-only", is_flag=True, help="Show only rank 0's output.")
@click.option("--quiet", "-q", is_flag=True, help="Show only ddp-orch's messages and the summary.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Trust (and record) the key of a host seen for the first time.")
@runs_dir_option
def attach(run_id: str | None, from_start: bool, lines: int | None, rank0_only: bool, quiet: bool,
           accept_new_host_keys: bool, runs_dir: str | None) -> None:
    """Follow a detached run (`up --detach`; default: the latest), or a
    Slurm job whose `up` is gone, from its nodes until it ends.

    Streams every node's output, then brings the results home and prints the
    summary, exiting with the run's code. Ctrl-C leaves the run running;
    `ddp-orch down RUN` stops it.
    """
    import dataclasses

    from ..backends import backend_of
    from ..engine.options import LaunchOptions
    from ..console import Console
    from ..records.outcome import RunState
    from ..report.runs import render_detached
    from ..report.summary import render_summary

    if from_start and lines is not None:
        raise ConfigError("--from-start and --lines are two places to start; give one",
                          path="--lines", source="command line")
    record = the_run(runs_dir, run_id, attachable=True)
    if not record.owner.detached and not kept_without_controller(record):
        raise ConfigError(f"run {record.run_id} was not detached (its controller owned it)",
                          source="command line",
                          hint=f"`ddp-orch logs {record.run_id}` shows what it printed")
    with Console("quiet" if quiet else "rank0" if rank0_only else "all") as console:
        backend = backend_of(record, LaunchOptions(
            accept_new_host_keys=accept_new_host_keys))
        outcome = backend.attach(record, console, lines=lines)
        if outcome.state is RunState.RUNNING:
            console.always(f"ddp-orch: left run {record.run_id}; it goes on on its nodes\n"
                           + render_detached(outcome, record.run.path))
            sys.exit(130)
        from ..records.store import record_end

        ended, wall_s = _run_end(read_record(record.run) or record, backend)
        outcome = dataclasses.replace(outcome, wall_s=wall_s)  # the run's, not attach's
        record_end(record, outcome, ended=ended, results_home=True)
        console.always(render_summary(outcome, record.run.path, record.run.plan(),
                                      record.run.outputs(), record.run.progress()))
        sys.exit(0 if outcome.ok else 130 if outcome.state is RunState.INTERRUPTED else 1)


@click.command()
@click.argument("run_ids", nargs=-1)
@click.option("--older-than", "older_than", metavar="DURATION",
              help="Only runs that ended at least this long ago: 30m, 12h, 7d, 2w, 1d12h.")
@click.option("--forget-unreachable", is_flag=True,
              help="Remove a run here even where a node cannot be reached; what it left on "
                   "that node stays, and is named.")
@runs_dir_option
def prune(run_ids: tuple[str, ...], older_than: str | None, forget_unreachable: bool,
          runs_dir: str | None) -> None:
    """Remove ended runs here and their run directories on their nodes.

    RUN_IDS (unique prefixes are enough) or, without them, every run in the
    runs directory; never a live one (a detached run's nodes and a Slurm
    job's queue are asked first, and each node checks again). Says how much
    it freed. A node that cannot be reached keeps the run for a later prune
    (unless --forget-unreachable); a run refused before it started needs
    none of its nodes. An unknown RUN_ID is named, and the others go on.
    """
    from ..controller.prune import Pruned, parse_duration, prune_run, render_pruned

    older_than_s = parse_duration(older_than) if older_than is not None else None
    named = bool(run_ids)
    where = locate(runs_dir)
    results: list = []
    records = []
    for run_id in dict.fromkeys(run_ids):
        try:
            records.append(find_run(where.path, run_id))
        except ConfigError as exc:  # one unknown id does not stop the others
            results.append(Pruned(run_id, False, exc.message))
    if not named:
        records = list(list_runs(where.path))
    if not records and not results:
        click.echo(f"no runs in {where.shown} ({where.source})")
        return
    results += [prune_run(record, older_than_s, forget_unreachable=forget_unreachable)
                for record in records]
    click.echo(visible(render_pruned(results)), nl=False)
    troubled = any(not r.removed and not r.why_kept.startswith(("live", "ended"))
                   for r in results)
    sys.exit(1 if troubled or (named and not all(r.removed for r in results)) else 0)


@click.command()
@latest_run_argument
@click.option("--interval", type=click.FloatRange(0.2, 3600), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True,
              help="Print one frame and exit: 0 while the run is live; once it has ended, "
                   "0 for a success and 1 otherwise. It looks twice, --interval apart, so "
                   "that the frame has rates.")
@click.option("--json", "as_json", is_flag=True,
              help="Each frame as one line of JSON (schema/top.schema.json).")
@click.option("--sort", type=click.Choice(["rank", "slowness"]), default="rank",
              show_default=True, help="Row order: by rank, or the slowest first.")
@runs_dir_option
def top(run_id: str | None, interval: float, once: bool, as_json: bool, sort: str,
        runs_dir: str | None) -> None:
    """Every rank of a live run on one screen (default: the latest live run).

    A row per rank: its node and host, GPU and model, step, steps/s and
    samples/s over the last seconds, time since its last progress, time per
    step outside collectives, and its GPU's use; the rank that holds the gang
    back is marked, with why. It refreshes until the run ends (a final frame
    says how), `q` or Ctrl-C. Attached runs are read from their controller's
    records, detached ones from their nodes' keepers, Slurm jobs from their
    nodes' streams.
    """
    from ..backends import backend_of
    from ..engine.options import LaunchOptions
    from ..report.pace import PaceWindow
    from ..report.runs import final_progress, live_attempt, live_progress
    from ..report.top import build_frame

    where = locate(runs_dir)
    record = find_run(where.path, run_id) if run_id is not None else \
        latest_run(where.path, lambda r: r.live, "live run")
    tty = sys.stdout.isatty()
    window, rows, looked_at, looks = PaceWindow(), [], None, 0
    watch = backend_of(record, LaunchOptions()).watch()
    try:
        with _Keys(tty and not once and not as_json) as keys:
            while True:
                record = find_run(where.path, record.run_id)
                described = watch.look(record) if record.live else None
                if described is not None and kept_without_controller(record):
                    record = _settled(record, described)
                now = time.time()
                if record.live:
                    rows, looked_at = live_progress(record, described), now
                else:  # ended: its ranks as last recorded, with their means over the run
                    rows = final_progress(record) or rows
                # an ended run: else its ranks as the last look saw them, at that time
                frame = build_frame(record, rows, window, looked_at or now,
                                    described.attempts if described else (),
                                    live_attempt(record, described))
                looks += 1
                if once and frame.live and looks < 2:
                    time.sleep(interval)
                    continue
                _draw(_slowest_first(frame) if sort == "slowness" else frame, as_json,
                      redraw=tty and not once)
                if once or not frame.live:
                    sys.exit(0 if frame.live or frame.state == "succeeded" else 1)
                if not tty and not as_json:
                    click.echo()  # plain frames one after another, a blank line between
                if keys.quit_within(interval):
                    return
    except KeyboardInterrupt:
        sys.exit(0)
    finally:
        watch.close()


class _Keys:
    """``q`` quits ``top`` drawing on a terminal (``active``): its stdin in
    cbreak mode (no echo, no line buffering) for the life of ``top``, read
    between frames; elsewhere the wait is a plain sleep."""

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self) -> "_Keys":
        self.saved = None
        if self.active and sys.stdin.isatty():
            import termios
            import tty

            self.fd = sys.stdin.fileno()
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def quit_within(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as ``q`` is pressed."""
        if self.saved is None:
            time.sleep(seconds)
            return False
        import os
        import select

        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.fd], [], [], left)[0] and os.read(self.fd, 1) in (b"q", b"Q"):
                return True
        return False

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


def _draw(frame, as_json: bool, redraw: bool) -> None:
    """One frame: a line of JSON, or its text (over the last frame with
    ``redraw``, on a terminal); colour only on a terminal without ``NO_COLOR``."""
    import os
    import shutil

    from ..report.top import render

    if as_json:
        click.echo(json.dumps(frame.to_json(), separators=(",", ":")))
        return
    size = shutil.get_terminal_size()
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    text = render(frame, size.columns, size.lines,
                  (lambda s: click.style(s, fg="red", bold=True)) if colour else (lambda s: s))
    click.echo(("\x1b[H\x1b[2J" if redraw else "") + text, nl=False)


def _slowest_first(frame):
    """The frame's ranks, the stragglers first (the worst first), then the
    oldest progress, silent ranks last."""
    import dataclasses

    order = {s: i for i, s in enumerate(r.rank for r in frame.ranks if r.straggler)}
    if frame.slowest is not None:
        order[frame.slowest.rank] = -1
    ranks = sorted(frame.ranks, key=lambda r: (
        order.get(r.rank, len(order)), r.silent,
        -(r.last_progress_s_ago or 0.0), r.rank))
    return dataclasses.replace(frame, ranks=tuple(ranks))
