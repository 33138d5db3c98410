"""``engine/results.py``: what a finished run brings home, and what the
summary says of it; every expected value is written out by hand."""

from __future__ import annotations

import json
import os
import stat
import textwrap

import pytest

from orchestrator.config.loader import load_cluster_text
from orchestrator.engine import results
from orchestrator.engine.results import (WantedFile, fetch_outputs, inside, outputs_lines, store_fetched,
                                         wanted_files)
from orchestrator.errors import TransportError
from orchestrator.plan.build import build_plan
from orchestrator.plan.dryrun import DryRun, NodeLaunch
from orchestrator.records.outcome import (EndReason, NodeOutcome, NodeState, RunOutcome,
                                          RunState, WorkerFailure)
from orchestrator.records.rundir import RunDir

GPU = "nodes:\n  - {host: a, gpus: [0, 1]}\n  - {host: b, gpus: [2]}\nworkload: {name: linear}\n"
CPU = "nodes:\n  - {host: a, procs: 1}\nworkload: {name: linear}\n"
R0, R1 = "~/.ddp-orch/runs/r1/node-0", "~/.ddp-orch/runs/r1/node-1"


def info_of(text: str, env=None) -> DryRun:
    plan = build_plan(load_cluster_text(textwrap.dedent(text), source="c.yaml"), run_id="r1",
                      local_run_dir="/l")
    nodes = tuple(NodeLaunch(node=n, where="ssh", env=env or n.env, unset_env=(), argv=())
                  for n in plan.nodes)
    return DryRun(backend="ssh", plan=plan, nodes=nodes)


def outcome(*nodes: NodeOutcome) -> RunOutcome:
    return RunOutcome("r1", RunState.FAILED, 1.0, nodes, None, None)


def node_outcome(rank: int, state: NodeState, failures=()) -> NodeOutcome:
    return NodeOutcome(rank, "h", state, 1, "", None, tuple(failures),
                       why=EndReason.FAILED if state.failed else EndReason.STOPPED)


def test_wanted_files_a_failed_gpu_node_s_error_files_and_flight_records():
    failures = [WorkerFailure(0, "m", 1.0, "torchrun/err.json"),
                WorkerFailure(0, "m", 1.0, "../node-0/x.json"),
                WorkerFailure(1, "m", 1.0, "e.json"),
                WorkerFailure(-1, "m", 1.0, "e.json"),
                WorkerFailure(0, "m", 1.0)]
    wanted = wanted_files(info_of(GPU), outcome(node_outcome(0, NodeState.SUCCEEDED),
                                                node_outcome(1, NodeState.FAILED, failures)))
    assert wanted == {
        0: [WantedFile(f"{R0}/result.json", "result.json", 16 << 20)],
        1: [WantedFile(f"{R1}/nccl_trace_rank_2", "nccl_trace/node-1/rank-2", 64 << 20),
            WantedFile(f"{R1}/torchrun/err.json", "errors/node-1/rank-2.json", 1 << 20)]}


def test_a_stopped_node_s_flight_records_are_wanted_too_on_gpus_and_cpus():
    wanted = wanted_files(info_of(GPU), outcome(node_outcome(0, NodeState.STOPPED)))
    assert wanted[0][1:] == [
        WantedFile(f"{R0}/nccl_trace_rank_0", "nccl_trace/node-0/rank-0", 64 << 20),
        WantedFile(f"{R0}/nccl_trace_rank_1", "nccl_trace/node-0/rank-1", 64 << 20)]
    cpu = wanted_files(info_of(CPU), outcome(node_outcome(0, NodeState.FAILED)))
    assert cpu[0][0] == WantedFile(f"{R0}/result.json", "result.json", 16 << 20)
    assert [w.local for w in cpu[0][1:]] == ["nccl_trace/node-0/rank-0"]  # its one process
    assert wanted_files(info_of(CPU), outcome(node_outcome(0, NodeState.SUCCEEDED))) == {
        0: [WantedFile(f"{R0}/result.json", "result.json", 16 << 20)]}


def test_the_old_flight_recorder_name_alone_is_read():
    info = info_of(CPU)
    node = info.plan.nodes[0]
    from dataclasses import replace
    node = replace(node, env={"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/t/fr_"})
    assert results.flight_recorder_files(node) == [
        WantedFile("/t/fr_0", "nccl_trace/node-0/rank-0", 64 << 20)]
    assert results.flight_recorder_files(replace(node, env={"TORCH_FR_DUMP_TEMP_FILE": "",
                                                            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/o_"})
                                         )[0].remote == "/o_0"


@pytest.mark.parametrize("directory,name,expected", [
    ("/r/n", "a/b", "/r/n/a/b"),
    ("/r/n/", "x", "/r/n/x"),
    ("/r/n", "a/../b", "/r/n/b"),
    ("/r/n", "../n2/x", None),
    ("/r/n", "/etc/passwd", None),
    ("/r/n", ".", None),
    ("/r/n", "", None),
    ("/r/n", 5, None),
])
def test_inside(directory, name, expected):
    assert inside(directory, name) == expected


def test_keep_writes_the_file_with_the_node_s_secrets_masked(tmp_path):
    info = info_of(CPU, env={"HF_TOKEN": "hf_abcdefghijkl"})
    run = RunDir(str(tmp_path))
    store_fetched(run, info, 0, WantedFile("x", "errors/node-0/rank-0.json", 1), b"t=hf_abcdefghijkl;")
    assert (tmp_path / "errors/node-0/rank-0.json").read_bytes() == b"t=********;"
    assert stat.S_IMODE(os.stat(tmp_path / "errors/node-0").st_mode) == 0o700


def outputs_info(env=None) -> DryRun:
    return info_of(CPU + "outputs: [out/]\n", env=env)


CODE = f"{R0}/code"


def test_fetch_outputs_asks_node_0_for_its_patterns_and_records_what_came(tmp_path):
    run = RunDir(str(tmp_path))
    asked, got = [], []
    listing = {"ok": True, "files": [{"path": "out/a.txt"}, {"path": "out/gone"},
                                     {"path": "out/err"}, {"path": "out/..x"}],
               "refused": [{"path": "p" * 400, "why": "w"}, "junk"], "refused_more": 3,
               "unmatched": ["u*", 7]}

    def get(path, limit):
        got.append((path, limit))
        rel = path[len(CODE) + 1:]
        if rel == "out/err":
            raise TransportError("a", "read failed")
        return {"out/a.txt": b"abc", "out/..x": b"12"}.get(rel)

    record = fetch_outputs(outputs_info(), run, lambda **kw: asked.append(kw) or listing, get)
    assert asked == [{"root": CODE, "patterns": ["out/"], "max_file": 256 << 20, "max_total": 1 << 30}]
    assert got[0] == (f"{CODE}/out/a.txt", 256 << 20)
    assert record == {
        "dir": "outputs", "patterns": ["out/"], "code_root": CODE,
        "files": [{"path": "out/a.txt", "size": 3}, {"path": "out/..x", "size": 2}],
        "refused": [{"path": "p" * 300, "why": "w"},
                    {"path": "out/gone", "why": "gone before it was fetched"},
                    {"path": "out/err", "why": "read failed"}],
        "refused_more": 3, "unmatched": ["u*", "7"], "total": 5}
    assert json.loads((tmp_path / "outputs.json").read_text()) == record
    assert (tmp_path / "outputs/out/a.txt").read_bytes() == b"abc"
    assert stat.S_IMODE(os.stat(tmp_path / "outputs/out/a.txt").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "outputs/out").st_mode) == 0o700


@pytest.mark.parametrize("more", [0, "3", None])
def test_only_a_positive_count_of_more_refusals_is_recorded(tmp_path, more):
    record = fetch_outputs(outputs_info(), RunDir(str(tmp_path)),
                           lambda **kw: {"ok": True, "refused_more": more}, None)
    assert "refused_more" not in record and record["total"] == 0


@pytest.mark.parametrize("answer,error", [
    ({"ok": False, "error": "no such root"}, "no such root"),
    ({"ok": False}, "no answer"),
    (OSError("link down"), "link down"),
    (TransportError("a", "agent gone"), "agent gone"),
])
def test_a_listing_that_fails_is_recorded_as_the_error(tmp_path, answer, error):
    def listing(**kw):
        if isinstance(answer, Exception):
            raise answer
        return answer
    record = fetch_outputs(outputs_info(), RunDir(str(tmp_path)), listing, None)
    assert record == {"dir": "outputs", "patterns": ["out/"], "code_root": CODE, "files": [],
                      "refused": [], "unmatched": [],
                      "error": f"cannot list them on node 0: {error}"}
    assert json.loads((tmp_path / "outputs.json").read_text()) == record


def test_the_totals_cap_and_the_file_count_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_OUTPUTS_BYTES", 5)
    files = {"a": b"123", "b": b"456", "c": b"78"}
    record = fetch_outputs(outputs_info(), RunDir(str(tmp_path)),
                           lambda **kw: {"ok": True, "files": [{"path": p} for p in files]},
                           lambda path, limit: files[path.rsplit("/", 1)[1]])
    assert record["files"] == [{"path": "a", "size": 3}, {"path": "c", "size": 2}]
    assert record["refused"] == [{"path": "b", "why": "over the total cap"}]
    assert record["total"] == 5
    monkeypatch.setattr(results, "MAX_OUTPUT_FILES", 1)
    record = fetch_outputs(outputs_info(), RunDir(str(tmp_path)),
                           lambda **kw: {"ok": True, "files": [{"path": p} for p in files]},
                           lambda path, limit: files[path.rsplit("/", 1)[1]])
    assert record["files"] == [{"path": "a", "size": 3}]


@pytest.mark.parametrize("rel,plain", [
    ("a/b", True), ("x" * 4096, True), ("x" * 4097, False), ("", False), (None, False),
    ("a\\b", False), ("a\x01", False), ("a\x1f", False), ("a\x20b", True), ("./a", False),
    ("a/./b", False), ("a/../b", False), ("a//b", False), ("/a", False), ("a/", False),
])
def test_plain_relative(rel, plain):
    assert results._plain_relative(rel) is plain


def test_outputs_lines_say_what_came_what_was_refused_and_what_matched_nothing():
    record = {"files": [{"path": f"f{i}", "size": 1024} for i in range(7)] + ["junk"],
              "error": "boom", "refused": [{"path": f"p{i}", "why": f"w{i}"} for i in range(7)],
              "refused_more": 2, "unmatched": [f"u{i}" for i in range(12)]}
    assert outputs_lines(record, "/runs/r1") == [
        "outputs: 7 file(s), 7.0 KiB in /runs/r1/outputs/ (f0, f1, f2, f3, f4 and 2 more)",
        "  not fetched: boom",
        "  refused: p0: w0", "  refused: p1: w1", "  refused: p2: w2", "  refused: p3: w3",
        "  refused: p4: w4",
        "  refused: 4 more (see /runs/r1/outputs.json)",
        "  no match on node 0: u0, u1, u2, u3, u4, u5, u6, u7, u8, u9"]


def test_outputs_lines_of_few_files_and_of_none():
    record = {"files": [{"path": "a", "size": 10}, {"path": "b", "size": "x"}],
              "refused": [{"path": "p", "why": "w"}], "refused_more": 0}
    assert outputs_lines(record, "/r") == ["outputs: 2 file(s), 10 B in /r/outputs/ (a, b)",
                                           "  refused: p: w"]
    assert outputs_lines({}, "/r") == ["outputs: 0 file(s), 0 B in /r/outputs/"]
    assert outputs_lines(None, "/r") == [] and outputs_lines([], "/r") == []


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (1024 ** 2 - 1, "1024.0 KiB"), (1024 ** 2, "1.0 MiB"), (3 * 1024 ** 3, "3.0 GiB"),
    (5 * 1024 ** 4, "5.0 TiB"), (2048 * 1024 ** 4, "2048.0 TiB"),
])
def test_human(n, text):
    assert results._human(n) == text


def test_a_node_that_could_not_be_reached_at_the_end_is_not_asked_for_its_files(tmp_path):
    """Issue 43: a node the teardown cut off (frozen) is not dialled again
    for its files: a fresh connection only waited out its connect timeout
    (5 s here) before the run's end was recorded. Node 0's result still comes."""
    from orchestrator.backends.agentbackend import AgentBackend
    from orchestrator.engine.options import LaunchOptions

    class Agent:
        def get(self, remote, limit, root=None):
            return b'{"ok": 1}' if remote.endswith("result.json") else None

        def call(self, *args, **kwargs):
            return {"files": [], "refused": []}

    class Dialled:
        host = "b"

        def start(self, *args, **kwargs):
            raise AssertionError("node 1 was dialled")

    info = info_of(GPU)
    run = RunDir.create(str(tmp_path), "r1")
    class Backend(AgentBackend):
        transport = where = None

    backend = Backend(LaunchOptions())
    lost = node_outcome(1, NodeState.LOST, [WorkerFailure(0, "m", 1.0, "e.json")])
    backend.fetch_results(info, {1: Dialled()}, outcome(node_outcome(0, NodeState.FAILED), lost),
                          run, {0: Agent()}, unreachable={1})
    log = (tmp_path / "r1" / "node-1.log").read_text()
    assert "not fetched: the node could not be reached at the end of the run; its files " \
           f"stay there ({R1}/nccl_trace_rank_2, {R1}/e.json)" in log
    assert json.loads((tmp_path / "r1" / "result.json").read_text()) == {"ok": 1}
