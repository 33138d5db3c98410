"""``setup:``, ``outputs:`` and ``prune``, unit by unit (issue 21, items 4-8).

The loader and the plan (the keys, their errors, the dry-run showing each
command and the timeout; ``setup: {commands, when_changed}`` from the file to
every node's supervisor spec, the stamp itself in ``test_setupstamp.py``), the node side (``agent/node/nodesetup.py`` running the
commands, ``agent/node/outputs.py`` deciding what may come home,
``agent/node/prune.py`` refusing what it must), and the controller's side of
outputs (``backends/results.fetch_outputs``) with a hostile listing. The
live runs are in ``tests/test_project_runs.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.agent.node import nodesetup as setup
from orchestrator.agent.node import outputs, prune
from orchestrator.agent.kept.attempts import compact
from orchestrator.agent.kept.keeper import attempt_spec
from orchestrator.agent.kept.restarts import setup_failed
from orchestrator.agent.node.spec import SupervisorSpec
from orchestrator.config.loader import load_cluster_text
from orchestrator.controller.prune import parse_duration
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan
from orchestrator.plan.render import dryrun_from_dict, dryrun_to_dict, render_text
from orchestrator.plan.shell import render_shell
from orchestrator.records.rundir import RunDir
from procscan import worker_pids

NODES = "nodes: [{host: a, procs: 1}, {host: b, procs: 2}]\nworkload: {name: linear}\n"


def spec_of(extra: str):
    return load_cluster_text(NODES + textwrap.dedent(extra), source="c.yaml")


def dryrun_of(extra: str):
    from orchestrator.backends import choose
    from orchestrator.engine.options import LaunchOptions

    spec = spec_of(extra)
    backend = choose(spec, LaunchOptions())
    return backend.dryrun(backend.plan("r1", "/tmp/runs/r1"))


# -- the cluster file -----------------------------------------------------------


def test_setup_takes_a_string_a_list_of_strings_and_argv_lists():
    spec = spec_of("""\
        setup:
          - pip install -r requirements.txt
          - [python3, -m, pip, install, --target, deps, 1]
        setup_timeout: 120
        """)
    assert spec.setup == ("pip install -r requirements.txt",
                          ("python3", "-m", "pip", "install", "--target", "deps", "1"))
    assert spec.setup_timeout == 120
    one = spec_of("setup: |\n  echo one\n  echo two\n")
    assert one.setup == ("echo one\necho two\n",)
    assert one.setup_timeout == 1800  # the README's default
    assert spec_of("").setup == () and spec_of("").outputs == ()


@pytest.mark.parametrize("text, path, message", [
    ("setup: [{pip: install}]", "setup[0]", "must be a string or a list, got a mapping"),
    ("setup: 3", "setup", "must be a string or a list, got int 3"),
    ("setup: [true]", "setup[0]", "must be a string or a list, got bool"),
    ("setup: ['  ']", "setup[0]", "the command is empty"),
    ("setup: [[]]", "setup[0]", "the command is empty"),
    ("setup: [[pip, [x]]]", "setup[0][1]", "expected a word of the command, got a list"),
    ("setup: [[pip, null]]", "setup[0][1]", "expected a word of the command"),
    ("setup_timeout: 0", "setup_timeout", "out of range"),
    ("setup_timeout: 1.5", "setup_timeout", "expected a whole number"),
    ("outputs: ['../x']", "outputs[0]", "escapes the code root"),
    ("outputs: ['out/../../x/*.json']", "outputs[0]", "escapes the code root"),
    ("outputs: /etc/passwd", "outputs", "absolute path"),
    ("outputs: ['~/x']", "outputs[0]", "starts with ~"),
    ("outputs: ['.']", "outputs[0]", "names the whole code root"),
    ("outputs: [{a: 1}]", "outputs[0]", "expected a single value"),
    ("outputs: [3]", "outputs[0]", "expected a non-empty string"),
])
def test_bad_setup_and_outputs_are_named_at_their_field(text, path, message):
    with pytest.raises(ConfigError) as info:
        spec_of(text + "\n")
    assert info.value.path == path, str(info.value)
    assert message in str(info.value)


def test_the_schema_takes_and_refuses_what_the_loader_does():
    import jsonschema

    from orchestrator.config.schema import cluster_schema

    validator = jsonschema.Draft202012Validator(cluster_schema())
    base = {"nodes": [{"host": "a", "procs": 1}], "workload": {"name": "linear"}}
    good = [{"setup": "pip install x"}, {"setup": ["a", ["b", "-c", 1]]},
            {"setup_timeout": 60}, {"outputs": "out/"}, {"outputs": ["out/*.json", "a/**/b"]},
            {"setup": {"commands": "make", "when_changed": ["requirements.txt", "a/b.lock"]}},
            {"setup": {"commands": ["make", ["b", 1]], "when_changed": "./r.txt"}},
            {"setup": {"commands": "make"}}]
    bad = [{"setup": 3}, {"setup": [{"a": 1}]}, {"setup": [[]]}, {"setup_timeout": 0},
           {"outputs": ["../x"]}, {"outputs": "/etc"}, {"outputs": ["a/../../b"]},
           {"outputs": ["~/x"]}]
    bad += [{"setup": {"commands": "make", "when_changed": [path]}}
            for path in ("../r", "/r", "~/r", "a/../../r", "r*.txt", "r[1].txt", ".", "./",
                         "deps/", "a\nb", "")]
    bad += [{"setup": {"when_changed": ["r.txt"]}}, {"setup": {"commands": [{"a": 1}]}},
            {"setup": {"commands": "make", "when_changed": []}},
            {"setup": {"commands": "make", "when_changed": ["r", "r"]}},
            {"setup": {"commands": "make", "when_chnaged": ["r"]}}]
    for extra in good:
        assert not list(validator.iter_errors({**base, **extra})), extra
    for extra in bad:
        assert list(validator.iter_errors({**base, **extra})), extra


def project_spec(tmp_path, setup: str, files=("requirements.txt",)):
    """A cluster file in ``tmp_path`` running ``proj/train.py``, with ``setup``."""
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "train.py").write_text("print(1)\n")
    for name in files:
        (proj / name).parent.mkdir(parents=True, exist_ok=True)
        (proj / name).write_text("torch\n")
    text = ("nodes: [{host: a, procs: 1}, {host: b, procs: 1, env: {NODE_ONLY: x}}]\n"
            "workload: {script: proj/train.py}\nenv: {HF_HOME: /data/hf}\n"
            + textwrap.dedent(setup))
    return load_cluster_text(text, source="c.yaml", base_dir=str(tmp_path))


def test_setup_as_a_mapping_takes_its_commands_and_when_changed(tmp_path):
    spec = project_spec(tmp_path, """\
        setup:
          commands: pip install -r requirements.txt
          when_changed: [requirements.txt, env/lock.txt]
        """, files=("requirements.txt", "env/lock.txt"))
    assert spec.setup == ("pip install -r requirements.txt",)
    assert spec.setup_when_changed == ("requirements.txt", "env/lock.txt")
    assert spec.warnings == ()
    one = project_spec(tmp_path, "setup: {commands: [make, [python3, x.py]], "
                                 "when_changed: requirements.txt}\n")
    assert one.setup == ("make", ("python3", "x.py")) and one.setup_when_changed == \
        ("requirements.txt",)
    plain = project_spec(tmp_path, "setup: {commands: make}\n")
    assert plain.setup == ("make",) and plain.setup_when_changed == ()
    assert project_spec(tmp_path, "setup: make\n").setup_when_changed == ()


@pytest.mark.parametrize("setup, path, line, message, hint", [
    ("setup: {commands: make, when_changed: ['../r.txt']}", "setup.when_changed[0]", 4,
     "'../r.txt' escapes the code root (..)", "relative to the code root"),
    ("setup:\n  commands: make\n  when_changed:\n    - requirements.txt\n    - /etc/r.txt",
     "setup.when_changed[1]", 8, "is an absolute path", "relative to the code root"),
    ("setup: {commands: make, when_changed: '~/r.txt'}", "setup.when_changed", 4,
     "starts with ~", ""),
    ("setup: {commands: make, when_changed: ['req*.txt']}", "setup.when_changed[0]", 4,
     "is a glob", ""),
    ("setup: {commands: make, when_changed: [deps/]}", "setup.when_changed[0]", 4,
     "names a directory", ""),
    ("setup: {commands: make, when_changed: [proj]}", "setup.when_changed[0]", 4,
     "'proj' is a directory in the code directory", "list the files in it"),
    ("setup: {commands: make, when_changed: []}", "setup.when_changed", 4,
     "no files are listed", "without when_changed the setup runs on every run"),
    ("setup: {commands: make, when_changed: [requirements.txt, requirements.txt]}",
     "setup.when_changed[1]", 4, "'requirements.txt' is listed twice", ""),
    ("setup: {commands: make, when_changed: [{a: 1}]}", "setup.when_changed[0]", 4,
     "expected a", ""),
    ("setup: {commands: make, when_chnaged: [requirements.txt]}", "setup.when_chnaged", 4,
     "unknown key 'when_chnaged'", "did you mean 'when_changed'?"),
    ("setup: {when_changed: [requirements.txt]}", "setup", 4, "missing 'commands'",
     "setup: {commands: [pip install -r requirements.txt], when_changed: [requirements.txt]}"),
    ("setup: {commands: [{a: 1}], when_changed: [requirements.txt]}", "setup.commands[0]", 4,
     "must be a string or a list, got a mapping", ""),
])
def test_a_bad_when_changed_is_named_at_its_field_and_line(tmp_path, setup, path, line, message,
                                                            hint):
    (tmp_path / "proj" / "proj").mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        project_spec(tmp_path, setup + "\n")
    assert (info.value.path, info.value.line) == (path, line), str(info.value)
    assert message in info.value.message and hint in info.value.hint, str(info.value)


def test_a_listed_file_the_code_lacks_is_a_warning_at_its_line(tmp_path):
    spec = project_spec(tmp_path, "setup:\n  commands: make\n  when_changed:\n"
                                  "    - requirements.txt\n    - lock.txt\n")
    assert spec.setup_when_changed == ("requirements.txt", "lock.txt")
    assert spec.warnings == (
        f"warning: c.yaml:8: setup.when_changed[1]: lock.txt is not in the code directory "
        f"{tmp_path / 'proj'}; it is weighed as missing, so setup runs again once it is there",)
    builtin = spec_of("setup: {commands: make, when_changed: requirements.txt}\n")
    assert builtin.warnings[0].startswith("warning: c.yaml:3: setup.when_changed: a built-in "
                                          "workload's code root is ddp-orch's code/")


# -- the plan and its dry-run ----------------------------------------------------


def test_the_plan_and_dry_run_carry_when_changed_to_every_nodes_supervisor(tmp_path):
    from orchestrator.backends import choose
    from orchestrator.engine.nodespec import supervisor_spec
    from orchestrator.engine.options import LaunchOptions

    spec = project_spec(tmp_path, "setup:\n  commands: pip install -r requirements.txt\n"
                                  "  when_changed: [requirements.txt]\n")
    backend = choose(spec, LaunchOptions())
    info = backend.dryrun(backend.plan("r1", "/tmp/runs/r1"))
    assert info.plan.setup_when_changed == ("requirements.txt",)
    text = render_text(info)
    assert ("setup      1 command on every node in its code root before torchrun starts, once "
            "per run; timeout 1800s (setup_timeout)\n"
            "           when_changed: requirements.txt: skipped on a node where these files, the "
            "commands, env and python are as at its last successful setup\n") in text
    data = dryrun_to_dict(info)
    assert data["setup_when_changed"] == ["requirements.txt"]
    back = dryrun_from_dict(json.loads(json.dumps(data)))
    assert back.plan.setup_when_changed == ("requirements.txt",)
    assert back.nodes[1].setup_when_changed == ("requirements.txt",)
    # each node weighs the env the file gives it, not ddp-orch's own (new every run)
    for k, names in ((0, ["HF_HOME"]), (1, ["HF_HOME", "NODE_ONLY"])):
        sup = supervisor_spec(info.nodes[k], "r1", 29500, 5.0)
        assert sup.setup["when_changed"] == {"paths": ["requirements.txt"], "env": names}
        assert SupervisorSpec.from_dict(json.loads(json.dumps(sup.to_dict()))).setup == sup.setup
    # without when_changed: nothing of it anywhere
    plain = dryrun_of("setup: make\n")
    assert "when_changed" not in render_text(plain)
    assert "setup_when_changed" not in dryrun_to_dict(plain)
    assert "when_changed" not in supervisor_spec(plain.nodes[0], "r1", 1, 5.0).setup


@pytest.mark.parametrize("when_changed", [
    {"paths": ["r.txt"]}, {"paths": [], "env": []}, {"paths": "r.txt", "env": []},
    {"paths": ["r.txt"], "env": [1]}, {"paths": ["r.txt"], "env": [], "x": 1}, ["r.txt"],
])
def test_a_supervisor_spec_with_a_bad_when_changed_is_refused(when_changed):
    from orchestrator.agent.node.spec import SpecError

    good = SupervisorSpec(run_id="r", node_rank=0, run_dir="/r/node-0", argv=("torchrun",),
                          env={}, setup={"commands": [["true"]], "cwd": "/r", "timeout_s": 5,
                                         "when_changed": {"paths": ["r.txt"], "env": ["A"]}})
    wire = good.to_dict()
    assert SupervisorSpec.from_dict(wire).setup == good.setup
    wire["setup"] = {**wire["setup"], "when_changed": when_changed}
    with pytest.raises(SpecError):
        SupervisorSpec.from_dict(wire)


def test_the_plan_holds_each_command_as_the_argv_every_node_runs():
    plan = build_plan(spec_of("setup: [pip install x, [python3, -c, 'print(1)']]\n"
                              "outputs: [out/]\n"), run_id="r1", local_run_dir="/tmp/runs/r1")
    assert plan.setup == (("sh", "-c", "pip install x"), ("python3", "-c", "print(1)"))
    assert plan.setup_timeout_s == 1800
    assert plan.outputs == ("out/",)
    assert build_plan(spec_of(""), run_id="r1", local_run_dir="/x").setup == ()


def test_the_dry_run_shows_setup_its_timeout_and_where_it_runs():
    info = dryrun_of("""\
        setup:
          - pip install -r requirements.txt
          - [python3, -m, pip, install, "it's here"]
        setup_timeout: 600
        outputs: [out/metrics.json, "out/*.png"]
        """)
    text = render_text(info)
    assert ("setup      2 commands on every node in its code root before torchrun starts, "
            "once per run; timeout 600s (setup_timeout)") in text
    assert "outputs    out/metrics.json, out/*.png (node 0's code root)" in text
    for node in info.nodes:
        block = text.split(f"node {node.node_rank}  ")[1]
        assert f"  setup    in {node.node.code_root}, 600s in all\n" \
               "    sh -c 'pip install -r requirements.txt'\n" \
               "    python3 -m pip install 'it'\"'\"'s here'\n  command\n" in block
    # json: what launch consumes, and what `attach` reads back
    data = dryrun_to_dict(info)
    assert data["setup"] == [["sh", "-c", "pip install -r requirements.txt"],
                             ["python3", "-m", "pip", "install", "it's here"]]
    assert data["setup_timeout_s"] == 600 and data["outputs"] == ["out/metrics.json", "out/*.png"]
    assert data["nodes"][1]["code_root"] == info.nodes[1].node.code_root
    back = dryrun_from_dict(json.loads(json.dumps(data)))
    assert back.plan.setup == info.plan.setup and back.plan.outputs == info.plan.outputs
    assert back.nodes[0].setup == info.nodes[0].setup
    assert back.nodes[0].setup_timeout_s == 600
    assert back.nodes[0].node.code_root == info.nodes[0].node.code_root
    # shell: in the code root, the setup commands first, then torchrun
    line = render_shell(info).splitlines()[-1]
    home = '"$HOME"'
    assert line.startswith("cd " + info.nodes[1].node.code_root.replace("~", home, 1) + " && ")
    assert line.index("pip install -r requirements.txt") < line.index("torch.distributed.run")


def test_a_file_without_setup_or_outputs_shows_neither():
    text = render_text(dryrun_of(""))
    assert "setup" not in text and "outputs" not in text


def test_the_supervisor_spec_carries_setup_in_the_code_root():
    from orchestrator.engine.nodespec import supervisor_spec

    info = dryrun_of("setup: [make]\nsetup_timeout: 30\n")
    spec = supervisor_spec(info.nodes[1], "r1", 29500, 5.0)
    assert spec.setup == {"commands": [["sh", "-c", "make"]],
                             "cwd": info.nodes[1].node.code_root, "timeout_s": 30.0,
                             "path_first": None}
    python = dryrun_of("python: /opt/venv/bin/python\nsetup: make\n")
    assert supervisor_spec(python.nodes[0], "r1", 1, 5.0).setup["path_first"] == \
        "/opt/venv/bin"
    assert ", /opt/venv/bin first on PATH\n" in render_text(python)
    assert supervisor_spec(dryrun_of("").nodes[0], "r1", 29500, 5.0).setup is None


def test_setup_runs_once_per_run_and_its_failure_is_never_restarted():
    spec = SupervisorSpec(run_id="r", node_rank=0, run_dir="/r/node-0",
                          argv=("python", "-m", "torch.distributed.run"), env={},
                          setup={"commands": [["true"]], "cwd": "/r", "timeout_s": 5},
                          bundle="bundle.tar.gz")
    assert attempt_spec(spec, 0, 1).setup == spec.setup
    assert attempt_spec(spec, 1, 2).setup is None and attempt_spec(spec, 1, 2).bundle is None
    assert attempt_spec(dataclasses.replace(spec, setup=None), 1, 2).bundle == "bundle.tar.gz"
    record = compact({"code": 3, "duration_s": 1, "setup_failed": True, "reason": "setup failed"})
    assert record["setup_failed"] is True
    assert "node 1's setup failed" in setup_failed({0: {"code": 143}, 1: record})
    assert setup_failed({0: {"code": 1}}) == ""


# -- the node's setup ------------------------------------------------------------


def _run(commands, tmp_path, timeout_s=10.0, stopped=lambda: False):
    out = []
    done = setup.run_setup(commands, str(tmp_path), dict(os.environ, X_SETUP="here"),
                           timeout_s, out.append, stopped)
    return done, b"".join(out).decode()


def test_setup_commands_run_in_turn_in_the_code_root_with_the_env(tmp_path):
    done, text = _run([["sh", "-c", "pwd; echo $X_SETUP"], ["sh", "-c", "printf 'no newline'"]],
                      tmp_path)
    assert done["ok"], text
    assert f"[setup]: {tmp_path}\n[setup]: here\n" in text
    assert "[setup]: no newline\n" in text
    assert "ddp-orch: setup 1/2 in" in text and "ddp-orch: setup done in" in text


def test_a_failing_command_is_named_with_its_last_lines_and_ends_the_setup(tmp_path):
    done, text = _run([["sh", "-c", "echo one; echo two; echo boom >&2; exit 3"],
                       ["sh", "-c", "touch never"]], tmp_path)
    assert not done["ok"] and not done["stopped"] and done["code"] == 3
    assert done["message"] == ("setup failed: `sh -c 'echo one; echo two; echo boom >&2; "
                               "exit 3'` exited 3; last lines: one | two | boom")
    assert done["last_lines"] == ["one", "two", "boom"]
    assert not (tmp_path / "never").exists()
    done, _ = _run([["/no/such/program"]], tmp_path)
    assert not done["ok"] and "could not start" in done["message"]


def test_a_long_failure_message_keeps_the_command_and_cuts_the_lines(tmp_path):
    message = setup.failure_message("pip install -r requirements.txt", "exited 1",
                                    ["x" * 500, "ERROR: no matching distribution"])
    assert len(message) <= setup.REPORT_CHARS
    assert message.startswith("setup failed: `pip install -r requirements.txt` exited 1; ")
    assert message.endswith("ERROR: no matching distribution")


def test_a_setup_past_its_timeout_is_ended_with_what_it_started(tmp_path):
    began = time.monotonic()
    done, _ = _run([["sh", "-c", "sleep 30 & sleep 30"]], tmp_path, timeout_s=0.5)
    assert time.monotonic() - began < 10
    assert not done["ok"] and done["code"] == setup.TIMEOUT_CODE
    assert "timed out after 0.5s (setup_timeout)" in done["message"]


def test_a_stop_ends_the_setup_at_once(tmp_path):
    began = time.monotonic()
    done, _ = _run([["sleep", "30"]], tmp_path, stopped=lambda: time.monotonic() - began > 0.3)
    assert time.monotonic() - began < 10
    assert not done["ok"] and done["stopped"]


# -- the node's outputs ----------------------------------------------------------


def _tree(root):
    (root / "out" / "sub").mkdir(parents=True)
    (root / "out" / "metrics.json").write_text('{"acc": 1}')
    (root / "out" / "plot.png").write_bytes(b"\x89PNG")
    (root / "out" / "sub" / "deep.txt").write_text("deep")
    (root / "big.bin").write_bytes(b"x" * 2000)
    (root / "secret.txt").write_text("outside")
    os.symlink("/etc/passwd", root / "out" / "passwd")
    os.symlink(str(root / "out" / "sub"), root / "linked")
    os.mkfifo(root / "out" / "fifo")


def test_outputs_bring_regular_files_under_the_root_and_refuse_the_rest(tmp_path):
    _tree(tmp_path)
    found = outputs.collect(str(tmp_path), ["out/*.json", "out/", "linked/*", "nothing/*",
                                            "../x", "/etc/passwd", "big.bin"],
                            max_file=1000, max_total=10000)
    assert found["ok"]
    assert {f["path"]: f["size"] for f in found["files"]} == {
        "out/metrics.json": 10, "out/plot.png": 4, "out/sub/deep.txt": 4}
    refused = {r["path"]: r["why"] for r in found["refused"]}
    assert refused["out/passwd"].startswith("a symbolic link")
    assert refused["linked/deep.txt"].startswith("a symbolic link")
    assert refused["out/fifo"].startswith("not a regular file")
    assert refused["../x"].startswith("escapes the code root")
    assert refused["/etc/passwd"] == "is an absolute path, outside the code root"
    assert "more than the 1000" in refused["big.bin"]
    assert found["unmatched"] == ["nothing/*"]


def test_outputs_are_capped_in_total(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(b"y" * 400)
    found = outputs.collect(str(tmp_path), ["f*"], max_file=1000, max_total=1000)
    assert [f["path"] for f in found["files"]] == ["f0", "f1"]
    assert found["refused"] == [{"path": "f2", "why": "over the 1000 bytes all outputs may "
                                                     "have together"}]
    assert outputs.collect(str(tmp_path / "none"), ["x"], 1, 1)["ok"] is False


def test_a_get_with_a_root_refuses_a_path_whose_links_lead_out(tmp_path):
    _tree(tmp_path)
    assert outputs.inside(str(tmp_path), str(tmp_path / "out" / "metrics.json"))
    assert not outputs.inside(str(tmp_path), str(tmp_path / "out" / "passwd"))
    assert not outputs.inside(str(tmp_path / "out"), str(tmp_path / "secret.txt"))


def test_fetch_outputs_writes_below_outputs_only_whatever_the_node_says(tmp_path):
    from orchestrator.engine.results import OUTPUTS_RECORD, fetch_outputs, outputs_lines

    info = dryrun_of("outputs: [out/]\nenv: {HF_TOKEN: hf_abcdefghijkl}\n")
    run = RunDir(str(tmp_path / "run"))
    os.makedirs(run.path)
    hostile = {"ok": True, "files": [{"path": "out/a.txt", "size": 3},
                                     {"path": "../escape.txt", "size": 1},
                                     {"path": "/etc/x", "size": 1}, {"path": "out//b", "size": 1},
                                     {"path": "out/sec.txt", "size": 20}, "junk"],
               "refused": [{"path": "out/link", "why": "a symbolic link"}],
               "unmatched": ["x/*"]}
    data = {"out/a.txt": b"abc", "out/sec.txt": b"token=hf_abcdefghijkl"}
    record = fetch_outputs(info, run, lambda **request: hostile,
                           lambda path, limit: data[path.split(info.nodes[0].node.code_root
                                                               + "/", 1)[1]])
    assert sorted(os.listdir(run.file("outputs/out"))) == ["a.txt", "sec.txt"]
    assert not os.path.exists(tmp_path / "escape.txt")
    assert open(run.file("outputs/out/sec.txt"), "rb").read() == b"token=********"
    assert json.load(open(run.file(OUTPUTS_RECORD)))["files"] == record["files"]
    refused = {r["path"] for r in record["refused"]}
    assert {"../escape.txt", "/etc/x", "out//b", "out/link"} <= refused
    lines = outputs_lines(record, run.path)
    assert lines[0].startswith(f"outputs: 2 file(s), ") and f"in {run.path}/outputs/" in lines[0]
    assert any("no match on node 0: x/*" in line for line in lines)
    assert fetch_outputs(dryrun_of(""), run, None, None) is None


# -- prune -----------------------------------------------------------------------


def test_durations_for_older_than():
    assert parse_duration("90s") == 90 and parse_duration("1d12h") == 36 * 3600
    assert parse_duration("2w") == 14 * 86400 and parse_duration("1.5h") == 5400
    for bad in ("", "7", "3x", "-1d", "d"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_the_node_removes_only_a_run_node_directory_and_never_a_live_one(tmp_path):
    run_id = f"prune-{os.getpid()}-{time.time_ns()}"  # no other test's run
    node_dir = tmp_path / "runs" / run_id / "node-1"
    (node_dir / "code").mkdir(parents=True)
    (node_dir / "code" / "f").write_bytes(b"z" * 100)
    assert not prune.prune(str(node_dir), run_id + "x", 1)["ok"]
    assert not prune.prune(str(node_dir), run_id, 0)["ok"]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env=dict(os.environ, DDP_ORCH_RUN_ID=run_id, DDP_ORCH_NODE_RANK="1"))
    try:
        deadline = time.monotonic() + 10  # until its environment shows (exec is done)
        while not worker_pids(run_id) and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = prune.prune(str(node_dir), run_id, 1)
        assert refused["live"] and not refused["ok"] and node_dir.exists(), refused
    finally:
        live.kill()
        live.wait()
    done = prune.prune(str(node_dir), run_id, 1)
    assert done == {"ok": True, "freed": 100, "path": str(node_dir)}
    assert not (tmp_path / "runs" / run_id).exists()
    assert prune.prune(str(node_dir), run_id, 1)["gone"]
    link = tmp_path / "runs" / "run-3"
    link.mkdir()
    os.symlink(str(tmp_path), link / "node-0")
    assert "not a directory" in prune.prune(str(link / "node-0"), "run-3", 0)["error"]


def test_a_sibling_directory_sharing_the_roots_name_is_not_inside(tmp_path):
    """``node-10`` (or ``node-1.old``) is not inside ``node-1``, nor is what a
    link inside the root points to there."""
    root = tmp_path / "node-1"
    for name in ("node-1", "node-10", "node-1.old"):
        (tmp_path / name / "out").mkdir(parents=True)
        (tmp_path / name / "out" / "metrics.json").write_text("{}")
    (root / "out" / "sibling").symlink_to(tmp_path / "node-10" / "out")
    assert outputs.inside(str(root), str(root / "out" / "metrics.json"))
    assert outputs.inside(str(root) + "/", str(root / "out" / "metrics.json"))
    assert not outputs.inside(str(root), str(tmp_path / "node-10" / "out" / "metrics.json"))
    assert not outputs.inside(str(root), str(tmp_path / "node-1.old" / "out" / "metrics.json"))
    assert not outputs.inside(str(root), str(root / ".." / "node-10" / "out" / "metrics.json"))
    assert not outputs.inside(str(root), str(root / "out" / "sibling" / "metrics.json"))
    assert not outputs.inside(str(root), str(tmp_path / "node-10"))
    assert not outputs.inside(str(root), str(root))  # the root itself is no file in it
