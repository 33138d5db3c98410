"""`ps`, `status` and `up --dry-run` find the runs directory from where they
are run, and the run schemas hold what `ps` and `status` print."""

from __future__ import annotations

import os
import time

import jsonschema

from conftest import run_cli
from orchestrator.records.runsdir import MARKER, RUNS_DIR_ENV
from runrecords import schema, record


def clean_env(tmp_path, **extra: str) -> dict:
    """An environment whose default runs directory lies under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if k != RUNS_DIR_ENV}
    # run_cli starts from os.environ, where conftest set XDG_DATA_HOME: an
    # empty value is unset to the XDG rule, so ~/.local/share applies.
    return {**env, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": "", **extra}


def ps_listing(result) -> list[str]:
    return [line.split()[0] for line in result.stdout.splitlines()[1:-1]]


def test_ps_from_a_subdirectory_finds_the_projects_runs_and_says_where(tmp_path):
    project = tmp_path / "project"
    record(project / "runs", "mine-1", time.time())
    assert (project / "runs" / MARKER).is_file()
    below = project / "src" / "deep"
    below.mkdir(parents=True)
    result = run_cli("ps", cwd=str(below), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert ps_listing(result) == ["mine-1"]
    assert result.stdout.splitlines()[-1] == (
        f"runs directory: {project / 'runs'} (the nearest runs/ of ddp-orch at or above the "
        "current directory)")
    status = run_cli("status", "mine", cwd=str(below), env=clean_env(tmp_path))
    assert status.returncode == 0 and " succeeded " in status.stdout.splitlines()[1]


def test_ps_from_an_unrelated_directory_reads_the_user_default_and_says_so(tmp_path):
    default = tmp_path / "home" / ".local" / "share" / "ddp-orch" / "runs"
    record(default, "elsewhere-1", time.time())
    record(tmp_path / "project" / "runs", "project-1", time.time())
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    result = run_cli("ps", cwd=str(unrelated), env=clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert ps_listing(result) == ["elsewhere-1"]
    assert result.stdout.splitlines()[-1] == (
        f"runs directory: {default} (the default: no runs/ of ddp-orch in {unrelated} or above "
        f"it; --runs-dir or ${RUNS_DIR_ENV} choose another)")
    chosen = run_cli("ps", cwd=str(unrelated),
                     env=clean_env(tmp_path, **{RUNS_DIR_ENV: str(tmp_path / "project" / "runs")}))
    assert ps_listing(chosen) == ["project-1"]
    assert f"(${RUNS_DIR_ENV}: no runs/ of ddp-orch in {unrelated}" in chosen.stdout
    given = run_cli("ps", "--runs-dir", str(default), cwd=str(tmp_path / "project"),
                    env=clean_env(tmp_path))
    assert ps_listing(given) == ["elsewhere-1"] and "(--runs-dir)" in given.stdout


def test_up_puts_its_run_where_ps_finds_it_from_a_subdirectory(tmp_path):
    (tmp_path / "project" / "runs").mkdir(parents=True)
    (tmp_path / "project" / "runs" / MARKER).write_text("")
    below = tmp_path / "project" / "src"
    below.mkdir()
    dry = run_cli("up", "--local", "--workload", "noop", "--procs", "1", "--dry-run",
                  "--run-id", "here", cwd=str(below), env=clean_env(tmp_path))
    assert dry.returncode == 0, dry.stderr
    assert f"  run dir  {tmp_path / 'project' / 'runs' / 'here' / 'node-0'}\n" in dry.stdout


def test_the_run_schemas_are_valid_and_status_holds_every_key_of_a_ps_run():
    ps, status = schema("ps"), schema("status")
    for document in (ps, status):
        jsonschema.Draft202012Validator.check_schema(document)
    run = ps["$defs"]["run"]
    assert set(run["required"]) <= set(status["required"])
    for key, described in run["properties"].items():
        assert status["properties"][key] == described, key
    assert status["$defs"]["node"] == ps["$defs"]["node"]
