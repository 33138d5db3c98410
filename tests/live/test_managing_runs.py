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
from procscan import wait_gone
from runrecords import schema, state


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


# the runs directory, from anywhere ---------------------------------------------


# an ambiguous run id ------------------------------------------------------------


# attach --lines N -----------------------------------------------------------------


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
    for run_id in ("seen", "lines", "unseen"):  # each keeper exits right after its last write
        assert wait_gone(run_id, 30) == set(), run_id
    return runs


def keeper_end(runs: str, run_id: str) -> float:
    with open(os.path.join(runs, run_id, "node-0", "keeper.json"), encoding="utf-8") as fh:
        return json.load(fh)["updated"]


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
    # its own time, after its wait for its nodes (issue #45: ps showed them mixed)
    assert recorded["wall_s"] == pytest.approx(
        recorded["ended"] - recorded["started"] - recorded["waited_s"])
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
    # it never ran: it waited until its error, with no time of its own
    assert as_json["ended"] is not None and as_json["duration_s"] is None
    assert as_json["waited_s"] == pytest.approx(as_json["ended"] - as_json["started"])
    listed = assert_valid(run_cli("ps", "--runs-dir", runs, "--json").stdout, "ps")
    assert [r["error"] for r in listed["runs"]] == [as_json["error"]]


# the schemas -------------------------------------------------------------------------
