"""The commands that start nothing load only what they use (issue #31's
latency target, ``bench/cli_latency.py``).

Timing belongs in the bench; what a test can pin without a clock is which
modules each command imports. Each case below names modules that a
realistic edit (a module-level import moved back to the top of a file)
would pull in again, and that the command has no use for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from orchestrator.cli.main import DdpOrchGroup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(ROOT, "cluster.yaml.example")

# Print the modules loaded once the command is over (at exit: click exits).
PROBE = ("import atexit, json, sys\n"
         "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules))))\n"
         "sys.argv = ['ddp-orch', *json.loads(sys.argv[1])]\n"
         "from orchestrator.cli.main import main\n"
         "main()\n")


def modules_of(*argv: str, runs_dir: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, "DDP_ORCH_RUNS_DIR": runs_dir},
                          capture_output=True, text=True, timeout=60)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES ")]
    assert line, proc.stdout + proc.stderr
    return set(json.loads(line[-1][len("MODULES "):]))


# Never on these commands: the controller never imports torch, and SSH or the
# launch engine have no part in reading records or rendering a plan.
NEVER = {"torch", "paramiko", "cryptography", "orchestrator.engine.gang",
         "orchestrator.engine.nodehandle", "orchestrator.transport.ssh"}


@pytest.mark.parametrize("argv, unused", [
    # --help lists the run commands from DdpOrchGroup.LAZY, loading none of them
    (("--help",), {"orchestrator.cli.runs", "orchestrator.config.spec", "yaml",
                   "orchestrator.records.store", "orchestrator.engine.options"}),
    # ps reads records: no plan, no backend, no cluster-file parsing
    (("ps",), {"yaml", "orchestrator.backends.base", "orchestrator.plan.model",
               "orchestrator.config.loader", "socket", "hashlib"}),
    # a dry run renders a plan: no records to write, no bundle to tar or code directory to
    # scan (a built-in workload), no local GPUs to ask, no socket (the address rule and the
    # interface variables are pure), no worker shim, and no "did you mean" without a mistake
    (("up", EXAMPLE, "--dry-run"), {"orchestrator.records.store", "orchestrator.records.outcome",
                                    "tarfile", "orchestrator.engine.bundle",
                                    "orchestrator.agent.node.gpuclaim",
                                    "orchestrator.agent.node.gpulocks", "subprocess",
                                    "orchestrator.cli.runs", "socket",
                                    "orchestrator.agent.node.netroute",
                                    "orchestrator.agent.worker.shim", "difflib"}),
    # a Slurm job is written and submitted before `up` loads what follows it (the gang, its
    # nodes' relay), what checks a cluster or dumps stacks: that import overlaps the job's start
    (("up", "--dry-run", "--backend", "slurm", "--workload", "noop", "--local"),
     {"orchestrator.engine.preflight", "orchestrator.engine.stacks",
      "orchestrator.engine.checknet", "orchestrator.engine.keptgang", "statistics"}),
], ids=["help", "ps", "dry-run", "slurm-dry-run"])
def test_a_command_that_starts_nothing_loads_none_of_what_it_does_not_use(argv, unused, tmp_path):
    loaded = modules_of(*argv, runs_dir=str(tmp_path / "runs"))
    assert "orchestrator.cli.main" in loaded  # the probe ran the command
    assert not (NEVER | unused) & loaded, sorted((NEVER | unused) & loaded)


def test_the_lazy_commands_short_help_is_each_commands_own_first_paragraph():
    """``LAZY`` repeats each run command's first help paragraph so that
    ``--help`` need not import them: the two may not drift apart."""
    from orchestrator.cli import runs

    commands = {name for name in dir(runs) if isinstance(getattr(runs, name), click.Command)}
    assert set(DdpOrchGroup.LAZY) == commands
    for name, text in DdpOrchGroup.LAZY.items():
        own = " ".join(getattr(runs, name).help.split("\n\n")[0].split())
        assert text == own, name


@pytest.mark.parametrize("columns", ["60", "80", "120"])
def test_help_lists_the_lazy_commands_as_it_would_with_them_loaded(columns):
    """The listing from ``LAZY`` is click's own, word for word, at any width."""
    env = {**os.environ, "PYTHONPATH": ROOT, "COLUMNS": columns}
    lazy = subprocess.run([sys.executable, "-m", "orchestrator", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    loaded = subprocess.run([sys.executable, "-c",
                             "import click, sys\n"
                             "from orchestrator.cli.main import main\n"
                             "ctx = click.Context(main)\n"
                             "for name in main.LAZY: main.get_command(ctx, name)\n"
                             "sys.argv = ['ddp-orch', '--help']\n"
                             "main()\n"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert lazy.returncode == loaded.returncode == 0, lazy.stderr + loaded.stderr
    assert "  ps " in lazy.stdout and "  status " in lazy.stdout
    assert lazy.stdout == loaded.stdout
