"""The edges of ``setup: {when_changed}``'s stamp (``agent/node/setupstamp.py``)
that ``test_setupstamp.py`` leaves open: the path rule's words and bounds,
the canonical form the hashes are taken of, the lines said when a setup is
skipped or runs (their times included), the stamp's file name and content,
and ``NodeStamp`` as the supervisor uses it. Expected values come from
hashlib, json and time, never from the module."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time

import pytest

from orchestrator.agent.node import setupstamp
from orchestrator.agent.node.setupstamp import (NodeStamp, changed, fingerprint, forget,
                                                path_problem, read_stamp, stamp_path, verdict,
                                                write_stamp)

AT = 1795735627.0
WHEN = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(AT))
NOW = fingerprint({"requirements.txt": "a" * 64}, [["pip", "install", "-r", "r.txt"]],
                  {"HF_HOME": "/data/hf"}, ("/opt/venv/bin/python", "3.12.1"))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the path rule, word for word ------------------------------------------------------------------

@pytest.mark.parametrize("path, problem", [
    (None, "is not a path"),
    ("a\x1fb", "holds a control character"),
    ("\\\\server\\r.txt", "is an absolute path, outside the code root"),
    ("~user/r.txt", "starts with ~, outside the code root"),
    ("deps\\..\\..\\r.txt", "escapes the code root (..)"),
    ("req?.txt", "is a glob; when_changed takes file paths, each file listed"),
    ("./", "names the whole code root; list the files setup reads (requirements.txt)"),
    ("deps/", "names a directory; list the files in it that setup reads"),
])
def test_each_path_problem_in_its_words(path, problem):
    assert path_problem(path) == problem


@pytest.mark.parametrize("path", ["a b.txt", "X", "XX.txt", "r\x7f.txt"])
def test_a_space_a_file_named_x_and_characters_past_the_controls_are_paths(path):
    assert path_problem(path) == ""


# -- what is hashed ---------------------------------------------------------------------------------------

def test_the_hashes_are_of_compact_json_with_sorted_keys():
    assert setupstamp._canonical({"b": 1, "a": [1, "x"]}) == b'{"a":[1,"x"],"b":1}'
    assert NOW["commands"] == sha(b'[["pip","install","-r","r.txt"]]')
    assert NOW["env"] == sha(b'{"HF_HOME":"/data/hf"}')
    assert NOW["python"] == sha(b'["/opt/venv/bin/python","3.12.1"]')


def test_with_no_stamp_every_input_is_changed_files_first():
    assert changed(None, NOW) == ["requirements.txt", "commands", "env", "python"]


# -- the lines ----------------------------------------------------------------------------------------------

def stamp(**inputs) -> dict:
    return {"version": setupstamp.STAMP_VERSION, "at": AT, "inputs": {**NOW, **inputs}}


def test_the_skip_line_says_since_when_to_the_second():
    assert verdict(stamp(), NOW) == (True, (
        f"setup skipped: requirements.txt, commands, env and python unchanged since {WHEN} "
        "(the last successful setup here)"))
    bare = {**NOW, "files": {}}
    assert verdict(stamp(files={}), bare)[1].startswith(
        "setup skipped: the files, commands, env and python unchanged since ")


def test_the_run_line_names_what_changed_since_when():
    assert verdict(stamp(env="0" * 64), NOW) == (False, (
        f"setup runs: env changed since {WHEN} (the last successful setup here)"))
    undated = {**stamp(env="0" * 64), "at": "yesterday"}
    assert verdict(undated, NOW)[1] == ("setup runs: env changed since at an unknown time (the "
                                        "last successful setup here)")


def test_up_to_three_names_are_named_and_the_rest_counted():
    assert setupstamp._named(["a"]) == "a"
    assert setupstamp._named(["a", "b"]) == "a and b"
    assert setupstamp._named(["a", "b", "c"]) == "a, b and c"
    assert setupstamp._named(["a", "b", "c", "d"]) == "a, b, c and 1 more"


# -- the stamp on disk -----------------------------------------------------------------------------------

def test_the_stamps_name_is_24_hex_of_the_hash_of_its_host_and_python(tmp_path):
    path = stamp_path(str(tmp_path / "runs" / "r1" / "node-0"), "gpu-b", "/usr/bin/python3")
    key = sha(b'["gpu-b","/usr/bin/python3"]')[:24]
    assert path == str(tmp_path / "runs" / ".setup-stamps" / f"{key}.json")


def test_a_stamp_keeps_when_it_was_written_and_one_that_is_no_object_is_none(tmp_path):
    path = str(tmp_path / "s" / "x.json")
    assert write_stamp(path, NOW, AT) == ""
    assert read_stamp(path) == {"version": setupstamp.STAMP_VERSION, "at": AT, "inputs": NOW}
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[1, 2]")
    assert read_stamp(path) is None


def test_a_stamp_that_cannot_be_written_or_removed_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    path = str(tmp_path / "file" / "s" / "x.json")
    assert write_stamp(path, NOW, AT) == f"could not write the setup stamp {path}: Not a directory"
    assert os.listdir(tmp_path) == ["file"]
    (tmp_path / "dir.json").mkdir()
    assert forget(str(tmp_path / "dir.json")) == (
        f"could not remove the setup stamp {tmp_path / 'dir.json'}: Is a directory")


# -- NodeStamp --------------------------------------------------------------------------------------------

def test_a_node_stamp_is_this_hosts_and_pythons_and_weighs_what_when_changed_lists(tmp_path):
    run_dir = str(tmp_path / "runs" / "r1" / "node-0")
    (tmp_path / "requirements.txt").write_text("torch\n")
    env = {"HF_HOME": "/data/hf", "OTHER": "x"}
    commands = [["pip", "install", "-r", "requirements.txt"]]
    node = NodeStamp(run_dir, str(tmp_path), commands, {"paths": ["requirements.txt"]}, env)
    assert node.path == stamp_path(run_dir, socket.gethostname(), sys.executable)
    assert node.now == fingerprint({"requirements.txt": sha(b"torch\n")}, commands, {},
                                   (sys.executable, sys.version))
    named = NodeStamp(run_dir, str(tmp_path), commands, {"env": ["HF_HOME", "UNSET"]}, env)
    assert named.now == fingerprint({}, commands, {"HF_HOME": "/data/hf"},
                                    (sys.executable, sys.version))


def test_a_node_stamp_done_is_dated_now_and_a_check_that_cannot_forget_says_so(tmp_path):
    node = NodeStamp(str(tmp_path / "runs" / "r1" / "node-0"), str(tmp_path), [["true"]],
                     {"paths": ["r.txt"]}, {})
    before = time.time()
    assert node.done() == ""
    assert before <= read_stamp(node.path)["at"] <= time.time()
    assert node.check()[0] is True
    node.path = str(tmp_path / "stamp-dir")
    os.mkdir(node.path)
    skip, line = node.check()
    assert not skip and line == ("setup runs: no successful setup recorded here yet "
                                 f"(when_changed); could not remove the setup stamp {node.path}: "
                                 "Is a directory")
