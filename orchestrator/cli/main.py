"""The ``ddp-orch`` command line. The only place that prints errors and exits.

Library code raises typed errors (``errors.py``); ``main`` turns them into
one clear message on stderr and an exit code (2 for bad input), with no
traceback for user mistakes.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable

import click

from .. import __version__
from ..config.limits import (BACKENDS, COLLECTIVE_BOUND_S, MAX_GPU_WAIT, MAX_HANG_TIMEOUT,
                             MAX_RESTARTS, MIN_HANG_TIMEOUT)
from ..console import Console
from ..errors import ConfigError, OrchestratorError, Signalled
from ..records.rundir import DEFAULT_RUNS_DIR, RunDir, new_run_id, valid_run_id
from ..records.runsdir import locate
from .options import runs_dir_option

if TYPE_CHECKING:  # built by the commands that launch or plan, not by --help
    from ..engine.options import LaunchOptions


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OrchestratorError as exc:
            click.echo(f"ddp-orch: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("ddp-orch: interrupted", err=True)
            sys.exit(130)
    return wrapper


def friendly_errors_command(command: click.Command) -> click.Command:
    """Wrap an imported command's callback with ``friendly_errors``."""
    command.callback = friendly_errors(command.callback)
    return command


class DdpOrchGroup(click.Group):
    """click, with usage mistakes reported like every other bad input:
    one ``ddp-orch: error:`` line and a hint, exit code 2.

    The run-management commands (``runs.py``) load only when named, so
    ``up`` and ``--dry-run`` do not pay for their imports, and ``--help``
    lists them from ``LAZY``: the first paragraph of each one's help, as its
    docstring says it (tests/unit/cli/test_cli_lazy.py keeps the two equal).
    """

    LAZY = {
        "ps": "List the runs recorded in the runs directory, newest first, and say "
              "which runs directory that is.",
        "status": "Show one run (default: the latest): state, per-node outcomes, root "
                  "cause and result.",
        "logs": "Print a run's stored node logs (default: the latest run), prefixed by "
                "node when there are several.",
        "down": "End whatever of RUN_ID still runs, on every node, using its records.",
        "stacks": "Dump the Python stack of every rank of a live run, on every node at once.",
        "attach": "Follow a detached run (`up --detach`; default: the latest), or a Slurm "
                  "job whose `up` is gone, from its nodes until it ends.",
        "prune": "Remove ended runs here and their run directories on their nodes.",
        "top": "Every rank of a live run on one screen (default: the latest live run).",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's command list, with each not-yet-loaded command's short help
        taken from ``LAZY`` rather than by importing ``runs.py``."""
        listed = {name: self.commands.get(name) or click.Command(name, help=self.LAZY[name])
                  for name in self.list_commands(ctx)}
        limit = formatter.width - 6 - max(len(name) for name in listed)
        rows = [(name, cmd.get_short_help_str(limit)) for name, cmd in listed.items()
                if not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY and name not in self.commands:
            from . import runs
            self.add_command(friendly_errors_command(getattr(runs, name)), name)
        return super().get_command(ctx, name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "ddp-orch"
            click.echo(f"ddp-orch: error: {exc.format_message()}\n"
                       f"  hint: see `{where} --help`", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"ddp-orch: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("ddp-orch: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


class ProgramCommand(click.Command):
    """A command that takes a program after ``--``, as torchrun does:
    ``ddp-orch up FILE [OPTIONS] -- train.py --lr 0.1`` or ``-- -m pkg.train``.

    Everything after the first ``--`` is the program's, verbatim (never read
    as ddp-orch's options), in ``ctx.meta[PROGRAM_META]``; None without ``--``.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        program = None
        if "--" in args:
            cut = args.index("--")
            args, program = args[:cut], tuple(args[cut + 1:])
        ctx.meta[PROGRAM_META] = program
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if "unexpected extra argument" in exc.message:
                exc.message += ("; a program and its arguments go after --: "
                                f"ddp-orch {self.name} FILE -- train.py --lr 0.1")
            raise

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- PROGRAM ARGS...]"]


PROGRAM_META = "ddp_orch.program"


@click.group(cls=DdpOrchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddp-orch")
def main() -> None:
    """Launch PyTorch DDP jobs with torchrun on a few machines."""


def _parse_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--arg epochs=2`` → {"epochs": 2}; values are read as YAML scalars or lists.

    A value YAML cannot read (or reads as a mapping) stays the plain string,
    so ``--arg note=a: b`` passes through; the workload's argument check
    then says whether the value fits.
    """
    from ..config.yamlsrc import parse

    args: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"{pair!r} is not KEY=VALUE", path="--arg", source="command line")
        try:
            value = parse(raw, "command line").value() if raw.strip() else raw
        except ConfigError:
            value = raw
        args[key] = raw if isinstance(value, dict) else value
    return args


def _options(*decorators: Callable[..., Any]) -> Callable[..., Any]:
    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn
    return apply


class BackendName(click.ParamType):
    """A backend's name: a built-in one at once, else an installed plugin's
    (``ddp_orch.backends`` entry points, read only then)."""

    name = "backend"

    def get_metavar(self, param, ctx=None) -> str:
        return "[" + "|".join(BACKENDS) + "|PLUGIN]"

    def convert(self, value, param, ctx):
        if value in BACKENDS:
            return value
        from ..config.limits import backend_names

        names = backend_names()
        if value not in names:
            self.fail(f"{value!r} is not one of {', '.join(names)} "
                      f"(`ddp-orch backends` lists them)", param, ctx)
        return value


backend_option = click.option(
    "--backend", type=BackendName(),
    help="Launch backend, over the file's `backend:` (default: local when every host "
         "is localhost, else ssh).")

# What to run: shared by `up` and `compare`.
job_options = _options(
    backend_option,
    click.option("--local", is_flag=True, help="Run on this machine only, without SSH."),
    click.option("--workload", help="With --local: a built-in workload instead of the file's."),
    click.option("--gpus", help="With --local: GPU indices, e.g. 0,1 (one process each), or "
                                "all, free, free:N (chosen at launch)."),
    click.option("--procs", type=click.IntRange(1, 1024), help="With --local: N CPU processes."),
    click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]),
                 help="With --local: override the file's device."),
    click.option("--arg", "arg_pairs", multiple=True, metavar="KEY=VALUE",
                 help="Workload argument over the file's, repeatable: --arg epochs=2."),
)

# How to launch it: shared by `up` and `compare`.
launch_options = _options(
    runs_dir_option,
    click.option("--accept-new-host-keys", is_flag=True,
                 help="Trust (and record) the key of a host seen for the first time; "
                      "a changed key is still refused."),
    click.option("--start-timeout", default=300.0, show_default=True,
                 type=click.FloatRange(1, 86400),
                 help="Seconds for every node to join the rendezvous before the run fails "
                      "(under Slurm: from the moment the job runs)."),
    click.option("--queue-timeout", type=click.FloatRange(1, 30 * 86400), default=None,
                 help="Slurm: seconds the job may wait in the queue before it is cancelled "
                      "(default: no limit)."),
    click.option("--hang-timeout", type=click.FloatRange(MIN_HANG_TIMEOUT, MAX_HANG_TIMEOUT),
                 default=None,
                 help="Seconds without progress from any rank (a line of output, or a "
                      "step heartbeat) after which the run counts as hung: every rank's "
                      "stack is dumped, the odd rank named, the run stopped (default: "
                      "the file's hang_timeout, else off)."),
    click.option("--grace", default=10.0, show_default=True, type=click.FloatRange(0.5, 600),
                 help="Seconds a node gets to stop gracefully before it is killed."),
    click.option("--wait-gpus", type=click.FloatRange(0, MAX_GPU_WAIT), default=None,
                 metavar="SECONDS",
                 help="Wait up to SECONDS for enough free GPUs, saying every 30 s who holds "
                      "them (default: the file's gpu_policy.wait, else refuse at once)."),
    click.option("--allow-busy-gpus", is_flag=True,
                 help="Launch on listed GPUs that someone else's process uses (never on "
                      "GPUs another ddp-orch run holds)."),
)


@main.command(cls=ProgramCommand)
@click.argument("cluster_file", required=False, type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the plan (ranks, env, commands); run nothing.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "shell"]), default=None,
              help="With --dry-run: text (the default), machine-readable json, or shell "
                   "lines that start the run by hand.")
@job_options
@click.option("--run-id", help="Use this run id instead of a generated one.")
@click.option("--rank0-only", is_flag=True, help="Show only rank 0's output (logs keep all).")
@click.option("--quiet", "-q", is_flag=True, help="Show only ddp-orch's messages and the summary.")
@click.option("--detach", "-d", is_flag=True,
              help="Return once every node has started; the nodes keep the run (and its "
                   "gang) without this controller. Follow it with `ddp-orch attach RUN`.")
@click.option("--max-restarts", type=click.IntRange(0, MAX_RESTARTS), default=None,
              help="Restart the whole gang this many times after a failure, on a fresh "
                   "port, with DDP_ORCH_RESTART_COUNT raised (default: the file's "
                   "max_restarts, else 0). Not after an error that recurs, down or Ctrl-C.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="An environment variable for every rank, over the file's env:, "
                   "repeatable: --env NCCL_DEBUG=INFO.")
@click.option("--preflight", type=click.Choice(["collective"]), default=None,
              help="collective: first run the collective smoke test on the run's layout "
                   f"(`check --collective`, {COLLECTIVE_BOUND_S} s a pair); launch only if "
                   "every pair and the gang pass.")
@launch_options
@friendly_errors
def up(cluster_file: str | None, dry_run: bool, fmt: str | None, backend: str | None, local: bool,
       workload: str | None, gpus: str | None, procs: int | None, device: str | None,
       arg_pairs: tuple[str, ...], run_id: str | None, runs_dir: str | None, rank0_only: bool,
       quiet: bool, detach: bool, max_restarts: int | None, env_pairs: tuple[str, ...],
       preflight: str | None,
       accept_new_host_keys: bool, start_timeout: float, queue_timeout: float | None, hang_timeout: float | None,
       grace: float, wait_gpus: float | None, allow_busy_gpus: bool) -> None:
    """Launch the job in CLUSTER_FILE on its nodes (or here, with --local).

    After --, PROGRAM ARGS replaces the file's workload, as you would type it
    after torchrun in your project: train.py --config configs/x.yaml (a
    script, relative to the workload's code directory) or -m pkg.train ...;
    the arguments reach every rank verbatim.
    """
    program = click.get_current_context().meta.get(PROGRAM_META)
    if fmt is not None and not dry_run:
        raise ConfigError(f"{fmt} is a form of the dry-run's output; without --dry-run, up "
                          "launches the run and prints nothing in it",
                          path="--format", source="command line",
                          hint=f"add --dry-run to see the plan: ddp-orch up ... --dry-run "
                               f"--format {fmt}; or drop --format to launch")
    spec = _spec_from_options(cluster_file, local, workload, gpus, procs, device,
                              arg_pairs, program)
    if env_pairs:
        from ..config.localmode import with_env

        spec = with_env(spec, env_pairs)
    runs_dir = locate(runs_dir).path
    if run_id is not None and not valid_run_id(run_id):
        raise ConfigError(f"{run_id!r} is not a valid run id", path="--run-id", source="command line",
                          hint="letters, digits, '.', '_' and '-'")
    from ..engine.options import LaunchOptions

    options = LaunchOptions(grace_s=grace, start_timeout_s=start_timeout,
                            accept_new_host_keys=accept_new_host_keys,
                            queue_timeout_s=queue_timeout,
                            hang_timeout_s=hang_timeout if hang_timeout is not None
                            else spec.hang_timeout, detach=detach,
                            max_restarts=max_restarts if max_restarts is not None
                            else spec.max_restarts, wait_gpus_s=wait_gpus,
                            allow_busy_gpus=allow_busy_gpus)
    if dry_run and run_id is not None:
        RunDir.refuse_taken(runs_dir, run_id)  # what `up --run-id` would refuse
    from ..controller.session import launch, prepare, run_dir_of

    # Prepared once: the dry-run shows what the launch runs. Its shell lines
    # `cd` on the nodes, so there the local run directory is absolute.
    run_id = run_id or new_run_id(spec.name)
    shown_dir = f"{runs_dir.rstrip('/')}/{run_id}"
    chosen, info = prepare(spec, options, backend=backend, run_id=run_id, local_run_dir=(
        shown_dir if dry_run and fmt != "shell" else run_dir_of(runs_dir, run_id)))
    if dry_run:
        _dry_run(info, shown_dir, fmt or "text",
                 _job_words(cluster_file, backend, local, workload, gpus, procs, device,
                            arg_pairs, program))
        return
    if preflight == "collective":
        _preflight_collective(chosen.require_spec(), options, runs_dir)
    with Console("quiet" if quiet else "rank0" if rank0_only else "all") as console:
        signal.signal(signal.SIGTERM, _interrupt)  # `ddp-orch down`, kill: tear down like Ctrl-C
        outcome, run = launch(chosen, info, runs_dir=runs_dir, console=console)
        from ..records.outcome import RunState  # the summary's modules: once the run is over
        from ..report.summary import render_summary

        if outcome.state is RunState.RUNNING:
            from ..report.runs import render_detached

            console.always(render_detached(outcome, run.path))
        else:
            console.always(render_summary(outcome, run.path, run.plan(), run.outputs(),
                                          run.progress()))
    sys.exit(0 if outcome.ok or outcome.state is RunState.RUNNING
             else 130 if outcome.state is RunState.INTERRUPTED else 1)


def _preflight_collective(spec: Any, options: Any, runs_dir: str) -> None:
    """``up --preflight collective``: the smoke test's rows, then the launch;
    exit 1 without launching where a pair of nodes or the gang failed."""
    from ..controller.collective import run_smoke, smoke_options
    from ..engine.checkresult import Preflight
    from ..report.runs import render_check

    click.echo(f"ddp-orch: preflight: the collective smoke test on the run's layout "
               f"({COLLECTIVE_BOUND_S} s a pair)")
    rows = run_smoke(spec, _launcher(runs_dir, Console("quiet"),
                                     smoke_options(options, COLLECTIVE_BOUND_S)))
    report = Preflight(tuple(rows))
    click.echo(render_check(report), nl=False)
    if not report.ok:
        click.echo("ddp-orch: the collective smoke test failed: nothing launched")
        sys.exit(1)


def _launcher(runs_dir: str, console: Console, options: LaunchOptions) -> Callable[..., Any]:
    """``launch(spec, run_id=None) -> (outcome, run)`` with the CLI's settings."""
    from ..controller.session import up as launch_up  # the launch path loads more modules

    signal.signal(signal.SIGTERM, _interrupt)  # `ddp-orch down`, kill: tear down like Ctrl-C
    return functools.partial(launch_up, runs_dir=runs_dir, console=console, options=options)


@main.command()
@click.argument("cluster_file", required=False, type=click.Path(dir_okay=False))
@job_options
@click.option("--baseline", "baseline_kind", type=click.Choice(["single", "dp"]),
              default="single", show_default=True,
              help="single: one process on node 0's first device; dp: the mlp workload's "
                   "nn.DataParallel, one process over all of node 0's GPUs (2 or more).")
@click.option("--baseline-run", help="Use this finished run as the baseline.")
@click.option("--node-run", help="Use this finished run as the run on node 0 alone.")
@click.option("--ddp-run", help="Use this finished run as the DDP run.")
@click.option("--show-output", is_flag=True, help="Show rank 0's output of the runs.")
@launch_options
@friendly_errors
def compare(cluster_file: str | None, backend: str | None, local: bool, workload: str | None,
            gpus: str | None, procs: int | None, device: str | None, arg_pairs: tuple[str, ...],
            baseline_kind: str, baseline_run: str | None, node_run: str | None,
            ddp_run: str | None, show_output: bool, runs_dir: str | None, accept_new_host_keys: bool,
            start_timeout: float, queue_timeout: float | None, hang_timeout: float | None,
            grace: float, wait_gpus: float | None, allow_busy_gpus: bool) -> None:
    """Run the job as 1 process, on node 0 alone, and on the whole cluster;
    report the speed-up.

    Node 0 alone runs where the cluster has more nodes and node 0 more than
    one device. Same workload arguments for every run (so the same global
    batch and samples); the report shows each run's learning rate, global
    batch and data, and warns of any difference. Writes report.md,
    report.json and PNG plots into a new run directory.
    """
    from ..controller import compare as runs
    from ..report import compare as cmp

    if baseline_kind != "single" and baseline_run is not None:
        raise ConfigError("--baseline chooses the baseline compare runs, but --baseline-run "
                          "reuses a finished one", path="--baseline", source="command line",
                          hint="drop one of them (a reused DataParallel run is labelled so)")
    runs_dir = locate(runs_dir).path
    spec = base_spec = one_node = None
    if baseline_run is None or ddp_run is None:
        spec = _spec_from_options(cluster_file, local, workload, gpus, procs, device,
                                  arg_pairs)
    from ..engine.options import LaunchOptions

    options = LaunchOptions(
        grace_s=grace, start_timeout_s=start_timeout, accept_new_host_keys=accept_new_host_keys,
        queue_timeout_s=queue_timeout, wait_gpus_s=wait_gpus, allow_busy_gpus=allow_busy_gpus,
        hang_timeout_s=hang_timeout if hang_timeout is not None or spec is None
        else spec.hang_timeout)
    if spec is not None:
        from ..backends import fit

        spec = fit(spec, options, backend)
        base_spec = runs.baseline_spec(spec, baseline_kind)  # refuses before anything runs
        one_node = runs.node_spec(spec, baseline_kind)
        spec = runs.ddp_spec(spec, baseline_kind)
    with Console("rank0" if show_output else "quiet") as console:
        launch = _launcher(runs_dir, console, options)
        # Reused runs first: one that cannot serve is said before anything runs.
        reused = {label: runs.load_run(label, run_id, runs_dir)
                  for label, run_id in (("baseline", baseline_run), ("node", node_run),
                                        ("ddp", ddp_run)) if run_id}
        base = reused.get("baseline") or runs.launch_run("baseline", base_spec, launch)
        node = reused.get("node") or (runs.launch_run("node", one_node, launch)
                                      if one_node is not None else None)
        ddp = reused.get("ddp") or runs.launch_run("ddp", spec, launch)
    report = cmp.comparison(base, ddp, node)
    out = RunDir.create(runs_dir, new_run_id("compare"))
    plots, note = cmp.write_report(report, out.path)
    click.echo(cmp.render_table(report), nl=False)
    if note:
        click.echo(f"note: {note}")
    click.echo(f"report: {out.file('report.md')}")


def _spec_from_options(cluster_file: str | None, local: bool,
                       workload: str | None, gpus: str | None, procs: int | None,
                       device: str | None, arg_pairs: tuple[str, ...],
                       program: tuple[str, ...] | None = None) -> Any:
    """The spec ``up`` and ``compare`` run: the file, or --local's one node;
    ``program``, the words after ``--``, replaces its workload."""
    from ..config.loader import load_cluster_file
    from ..config.localmode import local_spec, with_args, with_program

    spec = load_cluster_file(cluster_file) if cluster_file else None
    args = _parse_args(arg_pairs)
    if program is not None and args:
        raise ConfigError("--arg and a program after -- together", path="--arg",
                          source="command line",
                          hint="put every argument after the program: -- train.py --epochs 2")
    if local:
        spec = local_spec(spec, workload=workload, gpus=gpus, procs=procs, device=device,
                          args=args, program=program)
    elif spec is None:
        raise ConfigError("give a cluster file, or --local to run on this machine",
                          source="command line", hint="ddp-orch up cluster.yaml.example --dry-run")
    elif workload or gpus or procs or device:
        raise ConfigError("--workload, --gpus, --procs and --device go with --local",
                          source="command line", hint="edit the cluster file for a cluster run")
    else:
        spec = with_program(spec, program) if program is not None else with_args(spec, args)
    return spec


def _interrupt(signum: int, _frame: Any) -> None:
    raise Signalled(signum)


def _dry_run(info: Any, local_run_dir: str, fmt: str, job_words: list[str]) -> None:
    """Print the dry-run. Its shell lines write the bundle on this machine
    with this very ddp-orch (``self_argv``: a bare ``ddp-orch`` is not on
    PATH after ``.venv/bin/ddp-orch``) and this command's own job options."""
    from ..plan.render import render

    bundle_path = f"{local_run_dir}/{BUNDLE_FILE}"
    shell = {"bundle": (*self_argv(), "bundle", "--output", bundle_path, *job_words),
             "bundle_path": bundle_path} if fmt == "shell" else {}
    click.echo(render(info, fmt, **shell), nl=False)


def self_argv() -> tuple[str, ...]:
    """The argv that runs this ddp-orch again from a shell, wherever PATH
    points: the script that started it, absolute (``.venv/bin/ddp-orch``
    as typed, or as found on PATH), else, under ``python -m orchestrator``
    (``argv[0]`` is then the package's ``__main__.py``, which cannot run as
    a script) or in-process, this interpreter with ``-m orchestrator``."""
    script = sys.argv[0] if sys.argv else ""
    if (script and os.path.basename(script) != "__main__.py" and os.path.isfile(script)
            and os.access(script, os.X_OK)):
        return (os.path.abspath(script),)
    return (sys.executable or "python3", "-m", "orchestrator")


def _job_words(cluster_file: str | None, backend: str | None, local: bool, workload: str | None,
               gpus: str | None, procs: int | None, device: str | None,
               arg_pairs: tuple[str, ...], program: tuple[str, ...] | None) -> list[str]:
    """The job options as given (``job_options``, the file, ``-- PROGRAM``),
    for a command that takes the same ones (``ddp-orch bundle``)."""
    words = [cluster_file] if cluster_file else []
    for flag, value in (("--backend", backend), ("--workload", workload), ("--gpus", gpus),
                        ("--procs", procs), ("--device", device)):
        if value is not None:
            words += [flag, str(value)]
    words = (["--local"] if local else []) + words
    for pair in arg_pairs:
        words += ["--arg", pair]
    return words + (["--", *program] if program is not None else [])


BUNDLE_FILE = "bundle.tar.gz"  # in the local run directory, where `up` writes it too


@main.command(cls=ProgramCommand)
@click.argument("cluster_file", required=False, type=click.Path(dir_okay=False))
@job_options
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="The file to write (a .tar.gz); its directory is created.")
@friendly_errors
def bundle(cluster_file: str | None, backend: str | None, local: bool, workload: str | None,
           gpus: str | None, procs: int | None, device: str | None,
           arg_pairs: tuple[str, ...], output: str) -> None:
    """Write the code bundle `up` uploads to every node, to start a run by hand.

    The built-in workloads, the worker shim and the workload's code
    directory, exactly as `up` builds it for the same options;
    `up --dry-run --format shell` prints this command and the lines that
    unpack it into each node's run directory.
    """
    from ..controller.session import prepare
    from ..engine.bundle import build_bundle, human_size, stand_ins
    from ..engine.options import LaunchOptions

    program = click.get_current_context().meta.get(PROGRAM_META)
    chosen, info = prepare(_spec_from_options(cluster_file, local, workload, gpus, procs, device,
                                              arg_pairs, program), LaunchOptions(),
                           backend=backend, run_id="bundle",  # the same checks as up
                           local_run_dir=os.path.dirname(os.path.abspath(output)))
    os.makedirs(os.path.dirname(os.path.abspath(output)), mode=0o700, exist_ok=True)
    size = build_bundle(output, info.plan.code, stand_ins(chosen.require_spec()))
    click.echo(f"wrote {output} ({human_size(size)})")


@main.command()
@click.argument("cluster_file", type=click.Path(dir_okay=False))
@backend_option
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds each remote check may take.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="Trust (and record) the key of a host seen for the first time.")
@click.option("--collective", is_flag=True,
              help="Then run the collective smoke test: a tiny all-reduce between every pair "
                   "of nodes and across the gang, on the run's own layout, backend and env "
                   "(a run of its own in the runs directory).")
@click.option("--bound", type=click.IntRange(1, 3600), default=COLLECTIVE_BOUND_S,
              show_default=True, metavar="SECONDS",
              help="With --collective: seconds each pair, and then the gang, may take.")
@runs_dir_option
@friendly_errors
def check(cluster_file: str, backend: str | None, timeout: float,
          accept_new_host_keys: bool, collective: bool, bound: int,
          runs_dir: str | None) -> None:
    """Check every node of CLUSTER_FILE before a launch, in parallel.

    Reach (SSH) and the node agent, the python path, torch (and the same
    version everywhere), the listed GPUs, the interface each node's ranks
    use, a free master port on node 0 reachable from every node, and a TCP
    connection from every node to every other on its ranks' address.
    Warnings (a host name on loopback, clock skew, CUDA or NCCL versions
    that differ) pass; exits 1 if anything fails.
    """
    from ..backends import choose
    from ..config.loader import load_cluster_file
    from ..engine.options import LaunchOptions
    from ..report.runs import render_check

    options = LaunchOptions(accept_new_host_keys=accept_new_host_keys, check_timeout_s=timeout)
    chosen = choose(load_cluster_file(cluster_file), options, backend)
    spec = chosen.require_spec()
    report = chosen.check(chosen.plan("check", os.path.abspath(
        os.path.join(DEFAULT_RUNS_DIR, "check"))))
    if collective:
        report = _with_collective(report, spec, options, locate(runs_dir).path, bound)
    click.echo(render_check(report), nl=False)
    sys.exit(0 if report.ok else 1)


def _with_collective(report: Any, spec: Any, options: Any, runs_dir: str, bound: int) -> Any:
    """``report`` with the collective smoke test's rows (run whatever the
    checks found: it names what they only suspect, a pair of nodes by its
    collective)."""
    import dataclasses

    from ..controller.collective import run_smoke, smoke_options

    console = Console("quiet", stream=sys.stderr)  # the smoke run's own lines: stdout is the table
    launch = _launcher(runs_dir, console, smoke_options(options, bound))
    return dataclasses.replace(report, results=report.results + tuple(
        run_smoke(spec, launch, bound)))


@main.command()
def schema() -> None:
    """Print the JSON Schema of the cluster file (for editors: yaml-language-server)."""
    import json

    from ..config.schema import cluster_schema

    click.echo(json.dumps(cluster_schema(), indent=2))


@main.command("backends")
def list_backends() -> None:
    """List the launch backends: built in or from an installed plugin, and what each can do."""
    from ..backends import backend_class, origin_of
    from ..config.limits import backend_names

    for name in backend_names():
        click.echo(f"{name:<10} {origin_of(name)}")
        try:
            cls = backend_class(name)
        except OrchestratorError as exc:  # a broken plugin: said, and the rest still listed
            click.echo(f"    cannot be used: {exc}\n")
            continue
        can = cls.can
        owner = (f"a run is its scheduler's job ({can.scheduler_does})" if can.scheduler else
                 "a run is held by `up`, or by the nodes' keepers (--detach, --max-restarts)")
        click.echo(f"    {owner}")
        click.echo(f"    queue: {can.queue_wait} (--queue-timeout)" if can.queue else
                   "    no queue: a run starts at once")
        click.echo("    gang restarts (--max-restarts)" if can.restarts else
                   f"    no gang restarts: {can.instead_of_restarts}")
        click.echo("    every node on this machine" if can.this_machine else
                   "    nodes on other hosts")
        click.echo("")


@main.command("workloads")
def list_workloads() -> None:
    """List the built-in workloads and their arguments."""
    from ..config.catalog import builtin

    for info in builtin().workloads.values():
        click.echo(f"{info.name:<8} {info.summary}  (seed {info.seed}, python -m {info.module})")
        for arg in info.args:
            choices = f" [{'|'.join(map(str, arg.choices))}]" if arg.choices else ""
            default = "-" if arg.default is None else str(arg.default)
            click.echo(f"    {arg.flag:<22} {arg.type.__name__:<5} default {default:<8}"
                       f" {arg.help}{choices}")
        click.echo("")


if __name__ == "__main__":
    main()
