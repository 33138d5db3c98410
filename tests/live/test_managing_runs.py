"""Runs easy to find and to script (issue 22): one runs directory from
wherever a command runs, ``status`` of a detached run nobody watched,
``ps --json`` and ``status --json`` against their schemas, ``attach
--lines N``, a run's own duration, a failure before the start, and an
ambiguous run id."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time

import jsonschema
import pytest

from conftest import ROOT, local_job, run_cli
from orchestrator.agent.kept import daemon
from orchestrator.agent.wire.protocol import encode
from orchestrator.errors import ConfigError
from orchestrator.records.rundir import RunDir
from orchestrator.records.runsdir import MARKER, RUNS_DIR_ENV, locate
from orchestrator.records.store import find_run

SCHEMAS = os.path.join(ROOT, "schema")


def schema(name: str) -> dict:
    with open(os.path.join(SCHEMAS, f"{name}.schema.json"), encoding="utf-8") as fh:
        return json.load(fh)


def strict(node):
    """The schema with no key left undescribed: real outputs must not hold a
    key the schema does not document (the files themselves allow more, so
    that adding a key keeps older readers valid)."""
    node = copy.deepcopy(node)

    def walk(part):
        if isinstance(part, dict):
            if "properties" in part:
                part["additionalProperties"] = False
            for value in part.values():
                walk(value)
        elif isinstance(part, list):
            for value in part:
                walk(value)
    walk(node)
    return node


def assert_valid(output: str, name: str) -> dict:
    document = json.loads(output)
    jsonschema.Draft202012Validator(strict(schema(name))).validate(document)
    return document


def clean_env(tmp_path, **extra: str) -> dict:
    """An environment whose default runs directory lies under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if k != RUNS_DIR_ENV}
    # run_cli starts from os.environ, where conftest set XDG_DATA_HOME: an
    # empty value is unset to the XDG rule, so ~/.local/share applies.
    return {**env, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": "", **extra}


def record(runs_dir, run_id: str, started: float, state: str = "succeeded") -> None:
    run = RunDir.create(str(runs_dir), run_id)
    with open(run.file("state.json"), "w", encoding="utf-8") as fh:
        json.dump({"run_id": run_id, "backend": "local", "state": state, "started": started,
                   "ended": started + 2, "wall_s": 2.0, "nodes": []}, fh)


def ps_listing(result) -> list[str]:
    return [line.split()[0] for line in result.stdout.splitlines()[1:-1]]


# the runs directory, from anywhere ---------------------------------------------


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


def test_a_runs_directory_from_before_the_marker_is_found_by_its_runs(tmp_path):
    old = tmp_path / "runs" / "old-run"
    old.mkdir(parents=True)
    (old / "state.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "runs").mkdir()  # a runs/ of someone else's: no marker, no runs
    found = locate(None, cwd=str(tmp_path / "sub"), env={"HOME": str(tmp_path)})
    assert found.path == str(tmp_path / "runs")


# an ambiguous run id ------------------------------------------------------------


def test_an_ambiguous_run_id_prefix_lists_the_newest_matches_with_their_start(tmp_path):
    now = time.time()
    for k in range(12):
        record(tmp_path, f"linear-{k:02d}", now - 60 * k)
    record(tmp_path, "other", now)
    with pytest.raises(ConfigError) as caught:
        find_run(str(tmp_path), "linear")
    text = str(caught.value)
    assert text.startswith(f"command line: 12 runs matching 'linear' in {tmp_path}, newest "
                           "first:\n")
    listed = [line.split()[0] for line in text.splitlines()[1:11]]
    assert listed == [f"linear-{k:02d}" for k in range(10)]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now - 60))
    assert f"    linear-01  started {started}\n" in text
    assert "    ... and 2 more\n" in text
    assert text.endswith("hint: give more characters of the run id, enough for one run")
    assert find_run(str(tmp_path), "linear-03").run_id == "linear-03"


# attach --lines N -----------------------------------------------------------------


def test_the_last_n_lines_are_the_programs_not_the_agents_control_lines(tmp_path):
    stream = tmp_path / "agent.out"
    beat = encode({"event": "heartbeat", "progress": {}})
    stream.write_bytes(b"one\ntwo\n" + beat + b"three\n" + beat + beat + b"four\n"
                       + encode({"event": "exit", "code": 0, "reason": "torchrun exited",
                                 "failures": [], "last_lines": [], "duration_s": 1.0})
                       + encode({"event": "finished", "code": 0, "state": "succeeded"}))
    with open(stream, "rb") as fh:
        data = stream.read_bytes()
        shown = data[daemon.offset_of_last_lines(fh, 2):]
        assert [line for line in shown.splitlines() if not line.startswith(b"::")] == \
            [b"three", b"four"]
        assert shown.startswith(b"three\n")
        assert daemon.offset_of_last_lines(fh, 0) == len(data)
        assert daemon.offset_of_last_lines(fh, 9) == 0


# detached runs that ended while nobody watched -------------------------------------


@pytest.fixture(scope="module")
def ended_runs(tmp_path_factory):
    """Three tiny detached runs on this machine, started at once, that have
    all ended before any command about runs was run: nobody attached."""
    tmp = tmp_path_factory.mktemp("detached")
    cluster = local_job(tmp, "tiny", "steps.py", "[{host: localhost, procs: 1}]")
    runs = str(tmp / "runs")
    starts = [subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", cluster, "--runs-dir", runs, "--run-id",
         run_id, "--detach", "--quiet", "--arg", "steps=8", "--arg", "sleep=0.1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
        for run_id in ("seen", "lines", "unseen")]
    for proc in starts:
        assert proc.wait(timeout=180) == 0, proc.stdout.read()
    deadline = time.monotonic() + 180
    for run_id in ("seen", "lines", "unseen"):
        keeper = tmp / "runs" / run_id / "node-0" / "keeper.json"
        while json.loads(keeper.read_text()).get("state") == "running":
            assert time.monotonic() < deadline, f"run {run_id} did not end"
            time.sleep(0.2)
    time.sleep(1.0)  # each keeper exits right after its last write; attach comes later
    return runs


def keeper_end(runs: str, run_id: str) -> float:
    with open(os.path.join(runs, run_id, "node-0", "keeper.json"), encoding="utf-8") as fh:
        return json.load(fh)["updated"]


def state(runs: str, run_id: str) -> dict:
    with open(os.path.join(runs, run_id, "state.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.live  # three detached runs on this machine: seconds
def test_status_of_an_unwatched_detached_run_shows_its_end_and_says_attach(ended_runs):
    runs = ended_runs
    shown = run_cli("status", "seen", "--runs-dir", runs)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert " succeeded " in shown.stdout.splitlines()[1], shown.stdout
    assert "  node 0 (localhost): succeeded, exit 0: exited 0" in shown.stdout
    assert "result: not brought home yet: `ddp-orch attach seen` brings its results home " \
           "and prints the summary" in shown.stdout
    as_json = assert_valid(run_cli("status", "seen", "--runs-dir", runs, "--json").stdout,
                           "status")
    assert as_json["state"] == "succeeded" and as_json["exit_code"] == 0
    assert as_json["results_home"] is False and as_json["result"] is None
    assert as_json["next"] == "`ddp-orch attach seen` brings its results home and prints " \
                              "the summary"
    said = as_json["duration_s"]
    assert as_json["ended"] == keeper_end(runs, "seen")  # the nodes' end, not status's time

    attached = run_cli("attach", "seen", "--runs-dir", runs, "--quiet")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert f"run seen: SUCCEEDED in {said:.1f}s" in attached.stdout  # what status said
    after = assert_valid(run_cli("status", "seen", "--runs-dir", runs, "--json").stdout, "status")
    assert after["duration_s"] == said and after["results_home"] is True
    assert after["result"]["metrics"] == {"steps": 8, "restart_count": 0}
    assert after["next"] is None
    assert "not brought home" not in run_cli("status", "seen", "--runs-dir", runs).stdout


@pytest.mark.live
def test_attach_lines_n_shows_the_last_n_lines_of_the_program(ended_runs):
    attached = run_cli("attach", "lines", "--runs-dir", ended_runs, "--lines", "3")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    shown = [line for line in attached.stdout.splitlines() if "[rank0]:" in line]
    assert shown == [f"[node0 localhost] [rank0]: rank 0 step {k} attempt 0" for k in (5, 6, 7)]
    assert "run lines: SUCCEEDED" in attached.stdout


@pytest.mark.live
def test_attach_keeps_the_duration_the_nodes_recorded_not_the_time_until_attach(ended_runs):
    runs = ended_runs
    attached = run_cli("attach", "unseen", "--runs-dir", runs, "--quiet")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    recorded = state(runs, "unseen")
    assert recorded["ended"] == keeper_end(runs, "unseen")
    assert recorded["wall_s"] == pytest.approx(recorded["ended"] - recorded["started"])
    assert f"run unseen: SUCCEEDED in {recorded['wall_s']:.1f}s" in attached.stdout
    listed = assert_valid(run_cli("ps", "--runs-dir", runs, "--json").stdout, "ps")
    unseen = next(r for r in listed["runs"] if r["run_id"] == "unseen")
    assert unseen["duration_s"] == recorded["wall_s"] and unseen["results_home"] is True
    assert listed["runs_dir"] == runs and listed["runs_dir_source"] == "--runs-dir"


# a run that fails before it starts ----------------------------------------------------


@pytest.mark.live  # a real (local) agent finds the port taken; no torch starts
def test_a_run_that_fails_before_starting_records_why_for_status_and_ps(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = tmp_path / "busy.yaml"
        cluster.write_text(f"master: {{port: {port}}}\nnodes: [{{host: localhost, procs: 1}}]\n"
                           "workload: {name: noop}\n")
        runs = str(tmp_path / "runs")
        result = run_cli("up", str(cluster), "--runs-dir", runs, "--run-id", "busy")
    assert result.returncode == 1, result.stdout + result.stderr
    why = f"master port {port} on localhost (node 0) is already in use"
    assert why in result.stderr
    status = run_cli("status", "busy", "--runs-dir", runs)
    assert " failed " in status.stdout.splitlines()[1], status.stdout
    assert "error: connecting to the nodes failed:\n  " in status.stdout and why in status.stdout
    ps = run_cli("ps", "--runs-dir", runs)
    assert "connecting to the nodes failed: node 0 (localhost): master port" in ps.stdout
    as_json = assert_valid(run_cli("status", "busy", "--runs-dir", runs, "--json").stdout,
                           "status")
    assert why in as_json["error"] and as_json["exit_code"] == 1
    assert as_json["ended"] is not None and as_json["duration_s"] >= 0
    listed = assert_valid(run_cli("ps", "--runs-dir", runs, "--json").stdout, "ps")
    assert [r["error"] for r in listed["runs"]] == [as_json["error"]]


# the schemas -------------------------------------------------------------------------


def test_the_run_schemas_are_valid_and_status_holds_every_key_of_a_ps_run():
    ps, status = schema("ps"), schema("status")
    for document in (ps, status):
        jsonschema.Draft202012Validator.check_schema(document)
    run = ps["$defs"]["run"]
    assert set(run["required"]) <= set(status["required"])
    for key, described in run["properties"].items():
        assert status["properties"][key] == described, key
    assert status["$defs"]["node"] == ps["$defs"]["node"]
