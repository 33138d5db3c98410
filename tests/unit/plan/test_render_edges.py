"""The golden dry-runs (``tests/golden``), rendered in this process.

``unit/cli/test_cli.py`` and ``unit/backends/test_slurm_plan.py`` compare
them through a ``python -m orchestrator`` subprocess; the same comparison
in-process lets ``scripts/mutation`` see a mutant of ``plan/render.py`` or
``plan/shell.py`` change a golden file's word. The expected text is the
reviewed golden files, not the code under test."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from conftest import ROOT
from dryrun import golden_shell
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.cli import main
from orchestrator.plan.render import dryrun_from_dict, dryrun_to_dict, render

GOLDEN = os.path.join(ROOT, "tests", "golden")


def dry_run(*args: str) -> str:
    """``up ARGS --dry-run`` in this process, as ``python -m orchestrator``
    runs it (``sys.argv[0]``: the package's ``__main__.py``)."""
    old, argv = os.getcwd(), sys.argv
    os.chdir(ROOT)
    sys.argv = [os.path.join(ROOT, "orchestrator", "__main__.py")]
    try:
        result = CliRunner().invoke(main, ["up", *args, "--dry-run"], catch_exceptions=False)
    finally:
        os.chdir(old)
        sys.argv = argv
    assert result.exit_code == 0, result.output
    return result.output


def golden(name: str) -> str:
    with open(os.path.join(GOLDEN, name), encoding="utf-8") as fh:
        return golden_shell(fh.read())


@pytest.mark.parametrize("fmt", ["text", "json", "shell"])
def test_the_example_s_dry_run_matches_golden_in_process(fmt):
    assert dry_run("cluster.yaml.example", "--run-id", "resnet-demo-golden", "--runs-dir", "runs",
                   "--format", fmt) == golden(f"example.{fmt}.txt")


@pytest.mark.parametrize("fmt,runs", [("text", "runs"), ("shell", "/shared/runs")])
def test_the_slurm_dry_run_matches_golden_in_process(fmt, runs):
    assert dry_run("tests/golden/slurm.yaml", "--run-id", "slurm-golden", "--runs-dir", runs,
                   "--format", fmt) == golden(f"slurm.{fmt}.txt")


def test_the_json_record_reads_back_to_the_same_json():
    """``dryrun.json`` as a run keeps it: read back (``dryrun_from_dict``)
    and written again, the golden JSON comes out unchanged, every field."""
    data = json.loads(golden("example.json.txt"))
    info = dryrun_from_dict(data)
    assert dryrun_to_dict(info) == data
    assert render(info, "json") == golden("example.json.txt")


def test_a_record_s_owner_restarts_and_extras_read_back():
    data = json.loads(golden("example.json.txt"))
    data.update(owner={"holder": "keepers", "detached": True},
                max_restarts=3, extras={"batch script": "#!/bin/sh"})
    info = dryrun_from_dict(data)
    assert (info.owner, info.max_restarts, dict(info.extras)) == (
        Owner(Holder.KEEPERS, detached=True), 3, {"batch script": "#!/bin/sh"})
    for key in ("max_restarts", "extras"):
        del data[key]
    info = dryrun_from_dict(data)
    assert (info.max_restarts, dict(info.extras)) == (0, {})


def test_a_plan_recorded_before_owners_is_not_read_as_a_guess():
    """plan.json of a run launched before owners said a ``liveness`` word,
    which did not tell a detached Slurm job from a detached run its keepers
    held; it is refused (its run reads as damaged: ``store.other_version``)."""
    data = {**json.loads(golden("example.json.txt")), "liveness": "detached"}
    del data["owner"]
    with pytest.raises(KeyError):
        dryrun_from_dict(data)
