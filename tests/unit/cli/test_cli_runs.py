"""`ps`, `status` and `up --dry-run` find the runs directory from where they
are run, and the run schemas hold what `ps` and `status` print."""

from __future__ import annotations

import json
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
    # every state a run can be recorded in, pending included (issue #31), and
    # the live ones are the ones the schema calls live
    from orchestrator.records.outcome import RunState

    assert run["properties"]["state"]["enum"] == [s.value for s in RunState]
    assert [s.value for s in RunState if s.live] == ["starting", "pending", "running"]
    assert run["properties"]["state"]["description"].startswith(
        "starting, pending (a scheduler's job waiting in its queue) and running are live")


def _run_with_logs(runs, run_id: str, started: float, detached: bool = False) -> None:
    """A recorded run of two nodes (ranks 0-1 on node 0, 2-3 on node 1)
    with a log each: rank lines and torchrun's own unprefixed lines."""
    record(runs, run_id, started)
    run = runs / run_id
    state = json.loads((run / "state.json").read_text())
    state.update(owner={"holder": "keepers" if detached else "controller",
                        "detached": detached}, nodes=[{"node_rank": k, "host": f"h{k}", "run_dir": f"/r/{k}"}
                                   for k in (0, 1)])
    (run / "state.json").write_text(json.dumps(state))
    (run / "plan.json").write_text(json.dumps({"world_size": 4, "nodes": [
        {"node_rank": 0, "ranks": [0, 1]}, {"node_rank": 1, "ranks": [2, 3]}]}))
    for k in (0, 1):
        lines = [f"[rank{2 * k + r}]: {run_id} step {s}" for s in range(3) for r in (0, 1)]
        (run / f"node-{k}.log").write_text("\n".join(["torchrun starting", *lines,
                                                      "torchrun done"]) + "\n")


def test_status_logs_and_attach_without_a_run_id_take_the_latest_and_say_which(tmp_path):
    runs = tmp_path / "runs"
    now = time.time()
    _run_with_logs(runs, "older-detached", now - 60, detached=True)
    _run_with_logs(runs, "newest", now)
    _run_with_logs(runs, "oldest", now - 120)
    env = clean_env(tmp_path)
    status = run_cli("status", "--runs-dir", str(runs), env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split()[0] == "newest"
    assert f"ddp-orch: run newest, the latest in {runs}" in status.stderr
    logs = run_cli("logs", "--runs-dir", str(runs), env=env)
    assert logs.returncode == 0, logs.stderr
    assert "[node1] [rank3]: newest step 2" in logs.stdout
    assert "older-detached" not in logs.stdout and "oldest" not in logs.stdout

    from orchestrator.cli.runs import the_run

    assert the_run(str(runs), None, attachable=True).run_id == "older-detached"
    assert the_run(str(runs), "oldest").run_id == "oldest"  # an id still wins


def test_attach_without_a_run_id_and_no_detached_run_says_so(tmp_path):
    runs = tmp_path / "runs"
    _run_with_logs(runs, "attached-only", time.time())
    result = run_cli("attach", "--runs-dir", str(runs), env=clean_env(tmp_path))
    assert result.returncode == 2
    assert f"no detached run in {runs}" in result.stderr


def test_logs_rank_and_lines_show_one_rank_and_the_tail(tmp_path):
    runs = tmp_path / "runs"
    _run_with_logs(runs, "r", time.time())
    env = clean_env(tmp_path)

    def logs(*args: str):
        return run_cli("logs", "r", *args, "--runs-dir", str(runs), env=env)

    rank3 = logs("--rank", "3")
    assert rank3.returncode == 0, rank3.stderr
    assert rank3.stdout.splitlines() == [f"[rank3]: r step {s}" for s in range(3)]
    assert logs("--rank", "3", "-n", "1").stdout.splitlines() == ["[rank3]: r step 2"]
    assert logs("--rank", "2", "--lines", "0").stdout == ""
    tails = logs("-n", "2").stdout.splitlines()
    assert tails == ["[node0] [rank1]: r step 2", "[node0] torchrun done",
                     "[node1] [rank3]: r step 2", "[node1] torchrun done"]
    assert logs("--node", "1", "--rank", "2").stdout.splitlines()[0] == "[rank2]: r step 0"
    wrong_node = logs("--node", "0", "--rank", "2")
    assert wrong_node.returncode == 2
    assert "rank 2 of run r is on node 1, not node 0" in wrong_node.stderr
    missing = logs("--rank", "4")
    assert missing.returncode == 2 and "run r has no rank 4 (ranks 0-3)" in missing.stderr


def test_a_runs_directory_made_in_a_git_project_ignores_itself(tmp_path):
    """git itself is the oracle: nothing under the runs directory is
    untracked, and a ``.gitignore`` the user changed later stays theirs."""
    import subprocess

    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    record(project / "runs", "first", time.time())
    (project / "train.py").write_text("print('hi')\n")
    untracked = subprocess.run(["git", "-C", str(project), "status", "--porcelain",
                                "--untracked-files=all"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert untracked == ["?? train.py"]
    (project / "runs" / ".gitignore").write_text("*.tar.gz\n")
    record(project / "runs", "second", time.time())
    assert (project / "runs" / ".gitignore").read_text() == "*.tar.gz\n"


DAMAGES = [  # what was done to a good state.json, and words the listing must say
    (lambda text: text[:len(text) // 2], "cannot be read: "),
    (lambda text: json.dumps({**json.loads(text), "owner": {"holder": "nobody"}}), "holder"),
    (lambda text: "[1, 2]", "holds a list, not a run's record"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "nodes"}
                             | {"nodes": [{"host": "a"}]}), "lacks 'node_rank'"),
    (lambda text: json.dumps({**json.loads(text), "state": "exploded"}), "'exploded'"),
    # a node outcome's worker failure without its time, and one with an unknown reason
    (lambda text: json.dumps({**json.loads(text), "outcomes": [
        {"node_rank": 0, "host": "h", "state": "failed", "why": "failed",
         "failures": [{"local_rank": 0, "message": "boom"}]}]}), "lacks 'timestamp'"),
    (lambda text: json.dumps({**json.loads(text), "outcomes": [
        {"node_rank": 0, "host": "h", "state": "failed", "why": "gremlins"}]}), "'gremlins'"),
]


def test_a_damaged_record_is_listed_as_damaged_with_why_and_pruned_only_when_told(tmp_path):
    """A state.json that cannot be read (cut short, edited by hand, an owner
    from another version) is listed as damaged, never dropped from ``ps``
    without a word (issue 43); ``status`` and ``down`` say so, exit 2; a
    plain ``prune`` keeps it, ``--forget-unreachable`` removes it here."""
    runs = tmp_path / "runs"
    now = time.time()
    record(runs, "good-1", now)
    for k, (damage, _) in enumerate(DAMAGES):
        record(runs, f"bad-{k}", now - k - 1)
        path = runs / f"bad-{k}" / "state.json"
        path.write_text(damage(path.read_text()))
    env = clean_env(tmp_path)
    listed = run_cli("ps", "--runs-dir", str(runs), env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:-1]}
    assert sorted(rows) == [f"bad-{k}" for k in range(len(DAMAGES))] + ["good-1"]
    assert " damaged " not in rows["good-1"]
    as_json = run_cli("ps", "--runs-dir", str(runs), "--json", env=env)
    shown = {r["run_id"]: r for r in json.loads(as_json.stdout)["runs"]}
    jsonschema.validate(json.loads(as_json.stdout), schema("ps"))
    for k, (_, words) in enumerate(DAMAGES):
        assert rows[f"bad-{k}"].split()[2] == "damaged", rows[f"bad-{k}"]
        assert shown[f"bad-{k}"]["state"] == "damaged"
        assert shown[f"bad-{k}"]["error"].startswith("its record is damaged: state.json ")
        assert words in shown[f"bad-{k}"]["error"], (words, shown[f"bad-{k}"]["error"])
    for command in (("status", "bad-1"), ("down", "bad-1")):
        said = run_cli(*command, "--runs-dir", str(runs), env=env)
        assert said.returncode == 2, said.stdout + said.stderr
        assert "run bad-1: its record is damaged: state.json " in said.stderr
        assert "`ddp-orch prune bad-1` removes it here" in said.stderr
        assert "Traceback" not in said.stderr
    kept = run_cli("prune", "bad-1", "--runs-dir", str(runs), env=env)
    assert kept.returncode == 1 and (runs / "bad-1").is_dir(), kept.stdout + kept.stderr
    assert "--forget-unreachable removes it here" in kept.stdout
    gone = run_cli("prune", "bad-1", "--forget-unreachable", "--runs-dir", str(runs), env=env)
    assert gone.returncode == 0 and not (runs / "bad-1").exists(), gone.stdout + gone.stderr


def test_top_of_a_live_attached_kept_run_shows_the_attempt_its_controller_keeps(tmp_path):
    """An attached run with gang restarts in its second attempt: its
    controller (here, this test's process) keeps the attempt in
    ``progress.json``, and ``top`` shows it, not the records' 0."""
    from orchestrator.agent.wire.owner import Holder, Owner
    from orchestrator.records.outcome import RunState
    from orchestrator.records.rundir import RunDir
    from orchestrator.records.store import NodeRecord, write_state

    runs = tmp_path / "runs"
    run = RunDir.create(str(runs), "kept")
    now = time.time()
    write_state(run, run_id="kept", backend="local", state=RunState.RUNNING, started=now - 30,
                nodes=[NodeRecord(0, "localhost", str(tmp_path / "node-0"), "python3")],
                owner=Owner(Holder.KEEPERS))
    run.write_progress({"updated": now, "attempt": 1, "ranks": {"0": {
        "node_rank": 0, "host": "localhost", "step": 9, "samples": None,
        "last_progress": now - 1, "last_step": now - 1, "last_output": None}}})
    top = run_cli("top", "kept", "--once", "--json", "--interval", "0.2", "--runs-dir",
                  str(runs), timeout=60)
    assert top.returncode == 0, top.stdout + top.stderr
    frame = json.loads(top.stdout)
    jsonschema.validate(frame, schema("top"))
    assert (frame["state"], frame["owner"], frame["attempt"]) == ("running", "keepers", 1)
    assert [r["step"] for r in frame["ranks"]] == [9]


def test_logs_of_a_detached_run_that_ended_unwatched_say_the_rest_is_on_its_nodes(tmp_path):
    """A detached run's logs here end where ``up`` left it. Once its end is
    recorded (``status`` asked its nodes) but ``attach`` has not brought the
    logs home, ``logs`` said nothing, and a run that went on for hours
    looked as if it stopped at its first minute."""
    runs = tmp_path / "runs"
    _run_with_logs(runs, "away", time.time(), detached=True)
    state = json.loads((runs / "away" / "state.json").read_text())
    (runs / "away" / "state.json").write_text(json.dumps({**state, "results_home": False}))
    env = clean_env(tmp_path)
    away = run_cli("logs", "away", "--runs-dir", str(runs), env=env)
    assert away.returncode == 0, away.stderr
    assert "[node1] [rank3]: away step 2" in away.stdout
    assert ("ddp-orch logs: run away ended on its nodes with no controller following it: "
            "these logs end where a controller last followed it; `ddp-orch attach away` "
            "brings the rest home, with its results") in away.stderr
    (runs / "away" / "state.json").write_text(json.dumps({**state, "results_home": True}))
    home = run_cli("logs", "away", "--runs-dir", str(runs), env=env)
    assert home.returncode == 0 and "ddp-orch logs:" not in home.stderr, home.stderr
