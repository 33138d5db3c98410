"""``setup: {commands, when_changed}`` on the node (``agent/node/setupstamp.py``).

The decision as pure functions (the same inputs skip; each input changed,
no stamp or a stamp of another shape runs), what a listed file weighs
(its content; a missing one as missing), where the stamp lives and what it
keeps (no env value), and the supervisor's use of it: a setup whose inputs
are as at its last success is not run, a setup that runs forgets the stamp
first, and only a successful one writes it. (The live run is in
``tests/live/test_setup_outputs_live.py``.)
"""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from orchestrator.agent.node import setupstamp
from orchestrator.agent.node import supervisor as supervisor_module
from orchestrator.agent.node.setupstamp import (changed, file_digest, fingerprint, stamp_path,
                                                verdict, write_stamp)
from orchestrator.agent.node.spec import SupervisorSpec
from orchestrator.agent.node.supervisor import Supervisor
from orchestrator.agent.wire.protocol import CONTROL_PREFIX, decode

REQ = "a" * 64  # a file's digest, as file_digest gives it
BASE = dict(files={"requirements.txt": REQ}, commands=[["sh", "-c", "pip install -r r.txt"]],
            env={"HF_HOME": "/data/hf", "TOKEN": "s3cret"}, python=("/opt/venv/bin/python", "3.12.1"))
AT = 1795735627.0


def stamp_of(**inputs) -> dict:
    return {"version": setupstamp.STAMP_VERSION, "at": AT,
            "inputs": fingerprint(**{**BASE, **inputs})}


def test_the_same_inputs_skip_and_the_line_names_what_was_weighed():
    skip, line = verdict(stamp_of(), fingerprint(**BASE))
    assert skip
    assert line.startswith("setup skipped: requirements.txt, commands, env and python unchanged "
                           "since ")
    assert line.endswith(" (the last successful setup here)")
    many = {f"req-{i}.txt": REQ for i in range(5)}
    skip, line = verdict(stamp_of(files=many), fingerprint(**{**BASE, "files": many}))
    assert skip and "setup skipped: req-0.txt, req-1.txt, req-2.txt and 2 more, commands" in line


@pytest.mark.parametrize("change, named", [
    ({"files": {"requirements.txt": "b" * 64}}, "requirements.txt"),
    ({"files": {"requirements.txt": "missing"}}, "requirements.txt"),
    ({"files": {"requirements.txt": REQ, "lock.txt": "missing"}}, "lock.txt"),
    ({"files": {}}, "when_changed"),  # a file no longer listed
    ({"commands": [["sh", "-c", "pip install -r r.txt -U"]]}, "commands"),
    ({"commands": [["sh", "-c", "pip install -r r.txt"], ["true"]]}, "commands"),
    ({"env": {"HF_HOME": "/data/hf", "TOKEN": "other"}}, "env"),  # a secret's value
    ({"env": {"HF_HOME": "/data/hf"}}, "env"),  # a name gone
    ({"env": {"HF_HOME": "/data/hf", "TOKEN": "s3cret", "NEW": ""}}, "env"),
    ({"python": ("/opt/other/bin/python", "3.12.1")}, "python"),
    ({"python": ("/opt/venv/bin/python", "3.12.2")}, "python"),
])
def test_each_input_changed_runs_and_the_line_names_it(change, named):
    skip, line = verdict(stamp_of(), fingerprint(**{**BASE, **change}))
    assert not skip
    assert line.startswith(f"setup runs: {named} changed since "), line
    assert changed(stamp_of(), fingerprint(**{**BASE, **change})) == [named]


@pytest.mark.parametrize("stamp", [
    None, {}, {"version": 0, "at": AT, "inputs": fingerprint(**BASE)},
    {"version": setupstamp.STAMP_VERSION, "at": AT, "inputs": "x"},
    {"version": setupstamp.STAMP_VERSION, "at": AT, "inputs": {"files": []}},
])
def test_no_stamp_or_one_of_another_shape_runs(stamp):
    skip, line = verdict(stamp, fingerprint(**BASE))
    assert not skip and line.startswith("setup runs: ")
    if stamp is None:
        assert line == "setup runs: no successful setup recorded here yet (when_changed)"


def test_a_file_weighs_its_content_and_a_missing_one_weighs_as_missing(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==2.1\n")
    (tmp_path / "sub").mkdir()
    os.mkfifo(tmp_path / "fifo")  # would block an open: weighed as missing, unopened
    one = file_digest(str(tmp_path), "requirements.txt")
    assert len(one) == 64 and one != "missing"
    (tmp_path / "requirements.txt").write_text("torch==2.2\n")
    assert file_digest(str(tmp_path), "requirements.txt") not in (one, "missing")
    for absent in ("nothing.txt", "sub", "fifo", "../requirements.txt", "/etc/hostname"):
        assert file_digest(str(tmp_path), absent) == "missing", absent


@pytest.mark.parametrize("path, problem", [
    ("requirements.txt", ""), ("env/lock.txt", ""), ("./r.txt", ""),
    ("", "is not a path"), ("/etc/r.txt", "absolute path"), ("~/r.txt", "starts with ~"),
    ("a/../../r.txt", "escapes the code root"), ("req*.txt", "is a glob"),
    ("r[12].txt", "is a glob"), (".", "names the whole code root"),
    ("deps/", "names a directory"), ("a\nb", "control character"),
])
def test_the_path_rule(path, problem):
    assert (setupstamp.path_problem(path) == "") == (problem == "")
    assert problem in setupstamp.path_problem(path)


def test_one_stamp_per_host_and_python_in_the_runs_directory_and_no_env_value_in_it(tmp_path):
    run_dir = str(tmp_path / "runs" / "r1" / "node-1")
    path = stamp_path(run_dir, "gpu-b", "/opt/venv/bin/python")
    assert os.path.dirname(path) == str(tmp_path / "runs" / ".setup-stamps")
    assert path == stamp_path(str(tmp_path / "runs" / "r2" / "node-0"), "gpu-b",
                              "/opt/venv/bin/python")  # the next run finds it
    assert path != stamp_path(run_dir, "gpu-c", "/opt/venv/bin/python")  # a Slurm job's other node
    assert path != stamp_path(run_dir, "gpu-b", "/usr/bin/python3")
    assert write_stamp(path, fingerprint(**BASE), AT) == ""
    text = open(path).read()
    assert "s3cret" not in text and "/data/hf" not in text and "TOKEN" not in text
    assert json.loads(text)["inputs"] == fingerprint(**BASE)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no temporary left


# -- the supervisor --------------------------------------------------------------


def supervisor(tmp_path, monkeypatch, run: str, command: str, files: dict[str, str],
               env: dict | None = None) -> tuple[Supervisor, io.BytesIO]:
    """A supervisor of run ``run`` with ``setup: {commands: [command],
    when_changed: [files]}``, before its torchrun: its output in the buffer."""
    code = tmp_path / "runs" / run / "node-0" / "project"
    code.mkdir(parents=True)
    for name, text in files.items():
        (code / name).write_text(text)
    spec = SupervisorSpec(
        run_id=run, node_rank=0, run_dir=str(code.parent), argv=("torchrun",),
        env=env or {"HF_HOME": "/data/hf"}, bundle=None, grace_s=1.0,
        setup={"commands": [["sh", "-c", command]], "cwd": str(code), "timeout_s": 30,
               "path_first": None,
               "when_changed": {"paths": ["requirements.txt"], "env": ["HF_HOME"]}})
    sup = Supervisor(spec, stdin=io.BytesIO())
    out = io.BytesIO()
    sup.out = out
    sup.setup_barrier = lambda s: None  # every node's setup is done at once
    monkeypatch.setattr(sup, "teardown", lambda pid, grace_s=None: 0)
    monkeypatch.setattr(supervisor_module.guardian, "release", lambda g: None)
    monkeypatch.setattr(sup, "write_state", lambda *a, **k: None)
    return sup, out


def lines_of(out: io.BytesIO) -> list[str]:
    return [line for line in out.getvalue().decode().splitlines()
            if not line.startswith(CONTROL_PREFIX.decode())]


def events_of(out: io.BytesIO) -> list[dict]:
    return [decode(line) for line in out.getvalue().splitlines(keepends=True)
            if line.startswith(CONTROL_PREFIX)]


def test_the_supervisor_skips_an_unchanged_setup_and_runs_a_changed_one(tmp_path, monkeypatch):
    count = tmp_path / "count"  # outside every run directory, as a pip install's effect
    append = f"echo ran >> {count}"
    req = {"requirements.txt": "torch==2.1\n"}

    first, out = supervisor(tmp_path, monkeypatch, "r1", append, req)
    assert first.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\n"
    assert "ddp-orch: setup runs: no successful setup recorded here yet (when_changed)" \
        in lines_of(out)

    second, out = supervisor(tmp_path, monkeypatch, "r2", append, req)
    assert second.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\n", "an unchanged setup ran again"
    said = lines_of(out)
    assert said[0].startswith("ddp-orch: setup skipped: requirements.txt, commands, env and "
                              "python unchanged since "), said
    assert not any("setup 1/1" in line for line in said)
    assert events_of(out)[-1] == {"event": "setup", "ok": True}  # torchrun may start

    third, out = supervisor(tmp_path, monkeypatch, "r3", append, {"requirements.txt": "torch==2.2\n"})
    assert third.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\nran\n"
    assert lines_of(out)[0].startswith("ddp-orch: setup runs: requirements.txt changed since ")

    fourth, out = supervisor(tmp_path, monkeypatch, "r4", append, {"requirements.txt": "torch==2.2\n"},
                             env={"HF_HOME": "/data/other"})
    assert fourth.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\nran\nran\n"
    assert lines_of(out)[0].startswith("ddp-orch: setup runs: env changed since ")


def test_a_failed_setup_leaves_no_stamp_so_the_next_run_sets_up_again(tmp_path, monkeypatch):
    count = tmp_path / "count"
    req = {"requirements.txt": "torch==2.1\n"}
    ok, _ = supervisor(tmp_path, monkeypatch, "r1", f"echo ran >> {count}", req)
    assert ok.prepare(dict(os.environ), 0.0)
    stamps = tmp_path / "runs" / ".setup-stamps"
    assert len(os.listdir(stamps)) == 1

    # the same inputs but another command: it runs, half-changes the node, fails
    failing, out = supervisor(tmp_path, monkeypatch, "r2", f"echo half >> {count}; exit 3", req)
    assert not failing.prepare(dict(os.environ), 0.0)
    assert failing.last_exit["setup_failed"] is True
    assert os.listdir(stamps) == [], "a failed setup left a stamp (or kept the old one)"

    # so the first command's run, though its inputs match the first stamp, runs again
    again, out = supervisor(tmp_path, monkeypatch, "r3", f"echo ran >> {count}", req)
    assert again.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\nhalf\nran\n"
    assert lines_of(out)[0] == "ddp-orch: setup runs: no successful setup recorded here yet " \
                               "(when_changed)"


def test_a_setup_that_succeeded_here_but_not_on_another_node_leaves_no_stamp(tmp_path,
                                                                            monkeypatch):
    """Two nodes on one host share a stamp: node 0's success, with node 1's
    setup failed (the gang's barrier ends in a stop), must not stand for both."""
    count = tmp_path / "count"
    req = {"requirements.txt": "torch==2.1\n"}
    here, _ = supervisor(tmp_path, monkeypatch, "r1", f"echo ran >> {count}", req)
    here.setup_barrier = lambda sup: sup.request_stop("node 1 failed: setup failed")
    assert not here.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\n"
    assert not list((tmp_path / "runs").glob(".setup-stamps/*"))
    again, out = supervisor(tmp_path, monkeypatch, "r2", f"echo ran >> {count}", req)
    assert again.prepare(dict(os.environ), 0.0)
    assert count.read_text() == "ran\nran\n"


def test_a_setup_without_when_changed_keeps_no_stamp(tmp_path, monkeypatch):
    sup, _ = supervisor(tmp_path, monkeypatch, "r1", "true", {})
    sup.spec.setup.pop("when_changed")
    assert sup.prepare(dict(os.environ), 0.0)
    assert not (tmp_path / "runs" / ".setup-stamps").exists()


def test_the_stamp_weighs_the_agents_python(monkeypatch):
    assert setupstamp.this_python() == (sys.executable, sys.version)
